// The transport of @sandkeep/client: one logical call is one or more fetch attempts, the
// repeats only for calls whose repetition has the effect of one (docs/design.md §8), each
// answer's problem+json turned into a SandkeepError.
import type { components } from './schema.js'

/** A problem code of api/openapi.yaml; a newer server may send one this client predates. */
export type ProblemCode = components['schemas']['Problem']['code'] | (string & {})

/** A non-2xx answer of the API (application/problem+json), typed. */
export class SandkeepError extends Error {
  override readonly name = 'SandkeepError'
  constructor(
    /** The HTTP status. */
    readonly status: number,
    /** The stable, machine-readable problem code (`invalid`, `superseded`, …). */
    readonly code: ProblemCode,
    /** The request id the server logged the call under (body `requestId`, else `X-Request-Id`). */
    readonly requestId: string,
    /** The problem's `detail`: the member and the rule, or the refusal. */
    readonly detail: string,
    /** The answer's Retry-After in milliseconds (0 = none). */
    readonly retryAfterMs: number,
    /** The problem body as received (undefined when the body was not problem+json). */
    readonly problem?: Record<string, unknown>,
  ) {
    super(`sandkeep: ${status} ${code}: ${detail} (request ${requestId || '?'})`)
  }
}

/** A call that got no answer (refused, reset, aborted); `cause` is fetch's error. */
export class SandkeepTransportError extends Error {
  override readonly name = 'SandkeepTransportError'
  constructor(message: string, options: { cause: unknown }) {
    super(message, options)
  }
}

/** The request a signer sees: the exact bytes and headers the attempt sends. */
export interface SignableRequest {
  method: string
  url: URL
  headers: Record<string, string>
  body: string | undefined
}

/** Adds authentication headers to one attempt (each attempt is signed anew). */
export type RequestSigner = (request: SignableRequest) => Promise<Record<string, string>>

export interface TransportOptions {
  /** The API's base URL, e.g. `http://127.0.0.1:8080` (sandkeep dev) or an API Gateway stage URL. */
  baseUrl: string | URL
  /**
   * The tenant, sent as `X-Sandkeep-Tenant`: the dev server's tenant (default `local`), or the
   * tenant a trusted IAM caller acts for. Never combine with a JWT: its claim is the tenant.
   */
  tenant?: string
  /** A JWT for API Gateway's JWT authorizer (`Authorization: Bearer …`), or a function returning one per attempt. */
  token?: string | (() => string | Promise<string>)
  /** Signs every attempt, e.g. `await sigv4({ region, credentials })` from `@sandkeep/client/sigv4`. */
  sign?: RequestSigner
  /** The fetch to use (default globalThis.fetch): the seam for tests, proxies and instrumentation. */
  fetch?: typeof fetch
  /** Attempts of a safe call at most (default 4); 1 turns retries off. */
  maxAttempts?: number
  /** Jittered exponential backoff between attempts: first and largest delay (default 100 ms, 2 s); a longer Retry-After wins, up to 30 s. */
  retryBaseMs?: number
  retryMaxMs?: number
}

/** Whether a failed call may be sent again: `safe` when a repeat has the effect of one call. */
export type Retry = 'safe' | 'once'

export interface Call {
  method: string
  /** Below the base URL, path segments already encoded. */
  path: string
  query?: Record<string, string | number | boolean | undefined | null>
  body?: unknown
  retry: Retry
  signal?: AbortSignal
}

const maxRetryAfterMs = 30_000

export class Transport {
  private readonly base: string
  private readonly fetchFn: typeof fetch
  private readonly maxAttempts: number
  private readonly retryBaseMs: number
  private readonly retryMaxMs: number

  constructor(private readonly opts: TransportOptions) {
    this.base = String(opts.baseUrl).replace(/\/+$/, '')
    if (opts.tenant !== undefined && opts.token !== undefined) {
      throw new TypeError('sandkeep: tenant and token are exclusive (a JWT names its tenant in a claim)')
    }
    const f = opts.fetch ?? globalThis.fetch
    if (typeof f !== 'function') throw new TypeError('sandkeep: no fetch (Node >= 20 or a browser)')
    this.fetchFn = f
    this.maxAttempts = Math.max(1, opts.maxAttempts ?? 4)
    this.retryBaseMs = opts.retryBaseMs ?? 100
    this.retryMaxMs = opts.retryMaxMs ?? 2000
  }

  /** Sends the call, repeating a safe one on 429/502/503/504 and on a lost answer, and decodes the 2xx JSON answer. */
  async send<T>(call: Call): Promise<T> {
    const body = call.body === undefined ? undefined : JSON.stringify(call.body)
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.attempt<T>(call, body)
      } catch (err) {
        if (call.retry !== 'safe' || attempt >= this.maxAttempts || !retryable(err, call.signal)) throw err
        await sleep(this.backoff(attempt, err instanceof SandkeepError ? err.retryAfterMs : 0), call.signal, err)
      }
    }
  }

  private async attempt<T>(call: Call, body: string | undefined): Promise<T> {
    const url = new URL(this.base + call.path)
    for (const [k, v] of Object.entries(call.query ?? {})) {
      if (v !== undefined && v !== null) url.searchParams.set(k, String(v))
    }
    const headers: Record<string, string> = { accept: 'application/json' }
    if (body !== undefined) headers['content-type'] = 'application/json'
    if (this.opts.tenant !== undefined) headers['x-sandkeep-tenant'] = this.opts.tenant
    if (this.opts.token !== undefined) {
      const t = typeof this.opts.token === 'function' ? await this.opts.token() : this.opts.token
      headers.authorization = `Bearer ${t}`
    }
    if (this.opts.sign) Object.assign(headers, await this.opts.sign({ method: call.method, url, headers: { ...headers }, body }))
    const op = `${call.method} ${call.path}`
    let resp: Response
    let text: string
    try {
      resp = await this.fetchFn(url, { method: call.method, headers, body, signal: call.signal })
      text = await resp.text()
    } catch (cause) {
      throw new SandkeepTransportError(`sandkeep: ${op}: ${describe(cause)}`, { cause })
    }
    if (!resp.ok) throw problemError(resp, text)
    if (text === '') return undefined as T
    try {
      return JSON.parse(text) as T
    } catch (cause) {
      throw new SandkeepTransportError(`sandkeep: ${op}: undecodable answer`, { cause })
    }
  }

  /** How the calls authenticate: a JWT (`token`), a signer (`sign`, SigV4), or the tenant alone (the dev server). */
  get auth(): 'jwt' | 'sign' | 'tenant' {
    return this.opts.token !== undefined ? 'jwt' : this.opts.sign !== undefined ? 'sign' : 'tenant'
  }

  /**
   * The push endpoint's ws(s) URL for `path`, the tenant in `?tenant=` (a WebSocket cannot
   * send headers in a browser); undefined with a JWT or a signer, which the dev server's
   * upgrade does not take (docs/design.md §8.1): those reach a deployment's push endpoint
   * (pushEvents).
   */
  socketUrl(path: string): string | undefined {
    if (this.auth !== 'tenant') return undefined
    const url = new URL(this.base + path)
    url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:'
    return this.withTenant(url).toString()
  }

  /** `url` naming this client's tenant in `?tenant=` (as an upgrade names it), when it has one. */
  withTenant(url: URL): URL {
    if (this.opts.tenant !== undefined) url.searchParams.set('tenant', this.opts.tenant)
    return url
  }

  private backoff(attempt: number, retryAfterMs: number): number {
    let d = this.retryBaseMs * 2 ** Math.min(attempt - 1, 20)
    if (d > this.retryMaxMs) d = this.retryMaxMs
    d = d / 2 + Math.random() * (d / 2)
    return Math.max(d, Math.min(retryAfterMs, maxRetryAfterMs))
  }
}

function retryable(err: unknown, signal: AbortSignal | undefined): boolean {
  if (signal?.aborted) return false
  if (err instanceof SandkeepError) return [429, 502, 503, 504].includes(err.status)
  return err instanceof SandkeepTransportError
}

function problemError(resp: Response, text: string): SandkeepError {
  const retryAfterMs = parseRetryAfter(resp.headers.get('retry-after'), Date.now())
  const headerId = resp.headers.get('x-request-id') ?? ''
  let problem: Record<string, unknown> | undefined
  try {
    const v: unknown = JSON.parse(text)
    if (v && typeof v === 'object' && !Array.isArray(v)) problem = v as Record<string, unknown>
  } catch {
    // not JSON: a proxy's page; described by status alone
  }
  const str = (k: string) => (typeof problem?.[k] === 'string' ? (problem[k] as string) : '')
  return new SandkeepError(
    resp.status,
    str('code') || `http-${resp.status}`,
    str('requestId') || headerId,
    str('detail') || str('title') || resp.statusText,
    retryAfterMs,
    problem,
  )
}

/** Retry-After: delay-seconds or an HTTP date, in milliseconds from now (0 = none). */
export function parseRetryAfter(v: string | null, now: number): number {
  if (!v) return 0
  const s = v.trim()
  if (/^[0-9]+$/.test(s)) return Number(s) * 1000
  const t = Date.parse(s)
  return Number.isFinite(t) && t > now ? t - now : 0
}

function sleep(ms: number, signal: AbortSignal | undefined, lastErr: unknown): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(lastErr)
    const onAbort = () => {
      clearTimeout(t)
      reject(lastErr)
    }
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort)
      resolve()
    }, ms)
    signal?.addEventListener('abort', onAbort, { once: true })
  })
}

function describe(e: unknown): string {
  if (e instanceof Error) {
    const c = (e as { cause?: unknown }).cause
    return c instanceof Error ? `${e.message}: ${c.message}` : e.message
  }
  return String(e)
}
