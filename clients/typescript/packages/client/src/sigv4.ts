// IAM (SigV4) for API Gateway's IAM authorizer, the opt-in entry point
// `@sandkeep/client/sigv4`. The signer is the AWS SDK's own (@smithy/signature-v4 with
// @aws-crypto/sha256-js), optional peer dependencies loaded only here, so a client without
// IAM carries neither.
import type { RequestSigner } from './http.js'

/** AWS credentials, or a provider of them (e.g. `fromNodeProviderChain()` of @aws-sdk/credential-providers). */
export interface AwsCredentials {
  accessKeyId: string
  secretAccessKey: string
  sessionToken?: string
}

export interface SigV4Options {
  /** The API's region, e.g. `eu-west-1`. */
  region: string
  credentials: AwsCredentials | (() => Promise<AwsCredentials>)
  /** The signing service (default `execute-api`, API Gateway). */
  service?: string
}

/**
 * A RequestSigner that signs every attempt with SigV4. Pass it as `sign`, with `tenant`
 * naming the tenant the trusted role acts for (the header is signed too):
 *
 * ```ts
 * const client = new SandkeepClient({ baseUrl, tenant: 'acme', sign: await sigv4({ region, credentials }) })
 * ```
 */
export async function sigv4(opts: SigV4Options): Promise<RequestSigner> {
  let SignatureV4: typeof import('@smithy/signature-v4').SignatureV4
  let Sha256: typeof import('@aws-crypto/sha256-js').Sha256
  try {
    ;({ SignatureV4 } = await import('@smithy/signature-v4'))
    ;({ Sha256 } = await import('@aws-crypto/sha256-js'))
  } catch (cause) {
    throw new Error('sandkeep: IAM auth needs the optional peer dependencies @smithy/signature-v4 and @aws-crypto/sha256-js (npm install them)', { cause })
  }
  const signer = new SignatureV4({
    service: opts.service ?? 'execute-api',
    region: opts.region,
    credentials: opts.credentials,
    sha256: Sha256,
  })
  return async ({ method, url, headers, body }) => {
    const query: Record<string, string | string[]> = {}
    for (const [k, v] of url.searchParams) {
      const prev = query[k]
      query[k] = prev === undefined ? v : Array.isArray(prev) ? [...prev, v] : [prev, v]
    }
    const signed = await signer.sign({
      method,
      protocol: url.protocol,
      hostname: url.hostname,
      port: url.port === '' ? undefined : Number(url.port),
      path: url.pathname,
      query,
      headers: { ...headers, host: url.host },
      body,
    })
    const out: Record<string, string> = {}
    // fetch sets Host itself (and refuses to be told); every other signed header is sent.
    for (const [k, v] of Object.entries(signed.headers)) if (k.toLowerCase() !== 'host') out[k] = v
    return out
  }
}
