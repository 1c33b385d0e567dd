// The push transport of `events()`: a WebSocket to the push endpoint (the dev server's GET
// /v1/subscribe, a deployment's WebSocket API; api/asyncapi.yaml, docs/design.md §8.1),
// with long polls wherever push is not on offer.
import { SandkeepError } from './http.js'
import { longPollEvents, type EventTransport, type Event, type ReadResponse, type SandkeepClient } from './index.js'

/** The push protocol's subprotocol (api/asyncapi.yaml). */
export const pushSubprotocol = 'sandkeep.push.v1'

/** What the transport uses of a WebSocket: the platform's (browsers, Node >= 22) fits. */
export interface WebSocketLike {
  send(data: string): void
  close(code?: number, reason?: string): void
  addEventListener(type: 'open' | 'close' | 'error' | 'message', listener: (ev: { data?: unknown }) => void): void
}
export type WebSocketConstructor = new (url: string, protocols?: string | string[]) => WebSocketLike

/**
 * Signs a SigV4 client's upgrade URL for an IAM deployment's `$connect` (query-string
 * SigV4: a WebSocket sends no headers of its own), e.g. `presignUrl` of
 * `@sandkeep/client/sigv4`.
 */
export type UrlSigner = (url: URL) => Promise<string | URL>

export interface PushOptions {
  /** The WebSocket to use (default globalThis.WebSocket; Node 20 has it with --experimental-websocket). */
  WebSocket?: WebSocketConstructor
  /** Where push is not on offer, and to finish a stream push could not (default long polls). */
  fallback?: (client: SandkeepClient) => EventTransport
  /**
   * A deployment's push endpoint (its `PushUrl` output, wss://…): a SigV4 client's, with
   * `signUrl`; for a JWT client it overrides the ticket's `pushUrl`.
   */
  url?: string
  /** Signs a SigV4 client's upgrade URL; without it (or `url`) a SigV4 client long-polls. */
  signUrl?: UrlSigner
}

interface PushMessage {
  type: 'subscribed' | 'events' | 'event-part' | 'closed' | 'error'
  runId?: string
  events?: Event[]
  next: number
  offset?: number
  src?: number
  text?: string
  final?: boolean
  problem?: Record<string, unknown>
}

type Item = { kind: 'msg'; msg: PushMessage } | { kind: 'end'; opened: boolean }

/**
 * One WebSocket connection's messages, queued until taken. `end` tells whether the upgrade
 * succeeded: a WebSocket never shows the refusal's status, so a close before `open` is a
 * refusal (404 without push, 400, a proxy) and a close after it a drop.
 */
class Connection {
  private readonly items: Item[] = []
  private wake: (() => void) | undefined
  private opened = false
  private ended = false
  readonly ws: WebSocketLike

  constructor(WS: WebSocketConstructor, url: string, runId: string, after: number) {
    this.ws = new WS(url, [pushSubprotocol])
    this.ws.addEventListener('open', () => {
      this.opened = true
      this.ws.send(JSON.stringify({ type: 'subscribe', runId, after }))
    })
    this.ws.addEventListener('message', (ev) => {
      let msg: PushMessage
      try {
        msg = JSON.parse(String(ev.data)) as PushMessage
      } catch {
        this.ws.close(1002, 'undecodable message')
        return
      }
      this.put({ kind: 'msg', msg })
    })
    const end = () => {
      if (this.ended) return
      this.ended = true
      this.put({ kind: 'end', opened: this.opened })
    }
    this.ws.addEventListener('close', end)
    this.ws.addEventListener('error', end)
  }

  private put(item: Item) {
    this.items.push(item)
    this.wake?.()
  }

  async take(signal: AbortSignal | undefined): Promise<Item | undefined> {
    while (this.items.length === 0) {
      if (signal?.aborted) return undefined
      await new Promise<void>((resolve) => {
        const done = () => {
          this.wake = undefined
          signal?.removeEventListener('abort', done)
          resolve()
        }
        this.wake = done
        signal?.addEventListener('abort', done, { once: true })
      })
    }
    return this.items.shift()
  }
}

/**
 * The push transport: one WebSocket per `events()` stream, subscribed after the last offset
 * delivered, at the client's push target (SandkeepClient.pushTarget: the dev tenant's
 * endpoint, a JWT's push ticket, a SigV4 client's signed URL), asked anew for each
 * connection. No target (a JWT deployment whose ticket route answers 501 or 404, a SigV4
 * client without `url` and `signUrl`), a refused upgrade or no WebSocket takes the
 * fallback's long polls from that offset; a drop resubscribes from it, and a
 * resubscription that is refused or drops before delivering anything hands over to long
 * polls. Events at or below the last offset delivered are dropped, so each is yielded
 * once, in order, across any resume. A push `error` throws the SandkeepError an HTTP call
 * with that problem would.
 */
export function pushEvents(opts: PushOptions = {}): (client: SandkeepClient) => EventTransport {
  return (client) => {
    const fallback = (opts.fallback ?? longPollEvents)(client)
    return {
      async *pages(runId, { after, waitMs, limit, signal }): AsyncGenerator<ReadResponse> {
        const WS = opts.WebSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket
        let last = after
        for (let fresh = true; WS !== undefined; ) {
          let url: string | undefined
          try {
            url = await client.pushTarget({ url: opts.url, signUrl: opts.signUrl, signal })
          } catch {
            url = undefined // a signer that failed: long polls
          }
          if (url === undefined || signal?.aborted) break
          let conn: Connection
          try {
            conn = new Connection(WS, url, runId, last)
          } catch {
            break // a constructor that throws (a blocked URL, no support): long polls
          }
          let progressed = false
          let refused = false
          let parts: string[] = []
          try {
            for (;;) {
              const item = await conn.take(signal)
              if (item === undefined) return // aborted
              if (item.kind === 'end') {
                refused = !item.opened
                break
              }
              const m = item.msg
              if (m.type === 'events') {
                const events = (m.events ?? []).filter((e) => e.offset > last)
                if (events.length > 0) {
                  last = events[events.length - 1]!.offset
                  progressed = true
                  yield { events, next: last, closed: false }
                }
              } else if (m.type === 'event-part') {
                parts.push(m.text ?? '')
                if (!m.final) continue
                const text = parts.join('')
                parts = []
                if (m.offset === undefined || m.offset <= last) continue
                const e: Event = { offset: m.offset, data: JSON.parse(text) as Event['data'] }
                if (m.src) e.src = m.src
                last = m.offset
                progressed = true
                yield { events: [e], next: last, closed: false }
              } else if (m.type === 'closed') {
                yield { events: [], next: Math.max(m.next, last), closed: true }
                return
              } else if (m.type === 'error') {
                throw problemOf(m.problem)
              }
            }
          } finally {
            conn.ws.close(1000)
          }
          // Refused: long polls. Dropped: resubscribe while connections make progress.
          if (refused || (!progressed && !fresh)) break
          fresh = false
        }
        if (signal?.aborted) return
        yield* fallback.pages(runId, { after: last, waitMs, limit, signal })
      },
    }
  }
}

function problemOf(p: Record<string, unknown> | undefined): SandkeepError {
  const str = (k: string) => (typeof p?.[k] === 'string' ? (p[k] as string) : '')
  const status = typeof p?.status === 'number' ? p.status : 500
  return new SandkeepError(status, str('code') || `http-${status}`, str('requestId'), str('detail') || str('title'), 0, p)
}
