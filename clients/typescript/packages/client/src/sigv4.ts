// IAM (SigV4) for API Gateway's IAM authorizer, the opt-in entry point
// `@sandkeep/client/sigv4`. The signer is the AWS SDK's own (@smithy/signature-v4 with
// @aws-crypto/sha256-js), optional peer dependencies loaded only here, so a client without
// IAM carries neither.
import type { RequestSigner } from './http.js'
import type { UrlSigner } from './push.js'

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
  const signer = await newSigner(opts)
  return async ({ method, url, headers, body }) => {
    const signed = await signer.sign({
      method,
      protocol: url.protocol,
      hostname: url.hostname,
      port: url.port === '' ? undefined : Number(url.port),
      path: url.pathname,
      query: queryOf(url),
      headers: { ...headers, host: url.host },
      body,
    })
    const out: Record<string, string> = {}
    // fetch sets Host itself (and refuses to be told); every other signed header is sent.
    for (const [k, v] of Object.entries(signed.headers)) if (k.toLowerCase() !== 'host') out[k] = v
    return out
  }
}

/**
 * A UrlSigner for a SigV4 client's push upgrade: the upgrade URL presigned (query-string
 * SigV4, X-Amz-Signature and its companions in the query, valid `expiresIn` seconds, default
 * 60) for an IAM deployment's WebSocket API `$connect`, since a WebSocket sends no headers of
 * the caller's. Only a program that holds AWS credentials uses it (a service, not a browser):
 *
 * ```ts
 * const sk = new SandkeepClient({ baseUrl, tenant: 'acme', sign: await sigv4(aws),
 *   events: pushEvents({ url: pushUrl, signUrl: await presignUrl(aws) }) })
 * ```
 */
export async function presignUrl(opts: SigV4Options & { expiresIn?: number }): Promise<UrlSigner> {
  const signer = await newSigner(opts)
  return async (url) => {
    const signed = await signer.presign(
      {
        method: 'GET',
        protocol: url.protocol,
        hostname: url.hostname,
        port: url.port === '' ? undefined : Number(url.port),
        path: url.pathname,
        query: queryOf(url),
        headers: { host: url.host },
      },
      { expiresIn: opts.expiresIn ?? 60 },
    )
    const out = new URL(url.toString())
    out.search = ''
    for (const [k, v] of Object.entries(signed.query ?? {})) {
      for (const one of Array.isArray(v) ? v : [v]) if (one !== null) out.searchParams.append(k, one)
    }
    return out
  }
}

async function newSigner(opts: SigV4Options) {
  let SignatureV4: typeof import('@smithy/signature-v4').SignatureV4
  let Sha256: typeof import('@aws-crypto/sha256-js').Sha256
  try {
    ;({ SignatureV4 } = await import('@smithy/signature-v4'))
    ;({ Sha256 } = await import('@aws-crypto/sha256-js'))
  } catch (cause) {
    throw new Error('sandkeep: IAM auth needs the optional peer dependencies @smithy/signature-v4 and @aws-crypto/sha256-js (npm install them)', { cause })
  }
  return new SignatureV4({
    service: opts.service ?? 'execute-api',
    region: opts.region,
    credentials: opts.credentials,
    sha256: Sha256,
  })
}

function queryOf(url: URL): Record<string, string | string[]> {
  const query: Record<string, string | string[]> = {}
  for (const [k, v] of url.searchParams) {
    const prev = query[k]
    query[k] = prev === undefined ? v : Array.isArray(prev) ? [...prev, v] : [prev, v]
  }
  return query
}
