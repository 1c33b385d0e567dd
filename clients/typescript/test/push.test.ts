// events() over the push protocol (GET /v1/subscribe; docs/design.md §8.1) against real
// `sandkeep dev` servers (memory and dynalite): exactly once and in order while appends race
// the subscription, a large event joined from its parts, a resume after a forced drop, the
// fallback to long polls, and problems as SandkeepError. The WebSocket constructor is the
// seam: it counts and drops sockets, rewrites a resume's offset, or refuses the upgrade.
import {
  SandkeepClient,
  SandkeepError,
  pushEvents,
  pushSubprotocol,
  type Event,
  type EventTransport,
  type ReadResponse,
  type WebSocketConstructor,
} from '@sandkeep/client'
import { describe, expect, it } from 'vitest'
import { servers, uid } from './helpers.ts'

const PlatformWS = (globalThis as { WebSocket?: typeof WebSocket }).WebSocket
if (PlatformWS === undefined) throw new Error('no globalThis.WebSocket: run Node >= 22, or Node 20 with --experimental-websocket (vitest.config.ts)')

/** A WebSocket seam: keeps every socket, and may rewrite each subscribe after the first. */
function seam(opts: { resumeAfter?: (after: number) => number; url?: (u: string) => string } = {}) {
  const sockets: WebSocket[] = []
  class Seamed extends PlatformWS! {
    constructor(url: string | URL, protocols?: string | string[]) {
      super(opts.url ? opts.url(String(url)) : url, protocols)
      sockets.push(this)
    }
    override send(data: string) {
      const m = JSON.parse(data) as { type: string; after: number }
      if (m.type === 'subscribe' && sockets.indexOf(this) > 0 && opts.resumeAfter) m.after = opts.resumeAfter(m.after)
      super.send(JSON.stringify(m))
    }
  }
  return { sockets, WebSocket: Seamed as unknown as WebSocketConstructor }
}

/** A fetch that counts the long polls (GET …/events). */
function countingFetch() {
  const polls = { n: 0 }
  const f: typeof fetch = (input, init) => {
    if ((init?.method ?? 'GET') === 'GET' && /\/v1\/runs\/[^/]+\/events/.test(String(input))) polls.n++
    return fetch(input, init)
  }
  return { polls, fetch: f }
}

/** The exactly-once rule: offsets strictly increasing from `after`, the data as appended. */
function checkExactlyOnce(got: Event[], want: unknown[], after = 0) {
  let last = after
  for (const e of got) {
    if (e.offset <= last) throw new Error(`offset ${e.offset} after ${last}: a duplicate or out of order`)
    last = e.offset
  }
  expect(got.map((e) => e.data)).toEqual(want)
}

const sandbox = { id: 'default', provider: 'local-process' } as const

describe.each(servers)('push on $backend', ({ url }) => {
  const tenant = uid('tenant')
  const writer = new SandkeepClient({ baseUrl: url, tenant })

  async function started() {
    const runId = uid('run')
    const s = await writer.start({ runId, threadId: uid('thread'), sandbox })
    return { runId, cursor: s.cursor }
  }

  /** Appends `batches` of events, then finishes the run; returns the data in order. */
  async function appendAll(runId: string, cursor: string, batches: unknown[][], finish = true) {
    for (const events of batches) cursor = (await writer.append(runId, { cursor, events: events.map((data) => ({ data })) })).cursor
    if (finish) await writer.finish(runId, { cursor, status: 'completed' })
    return cursor
  }

  function reader(opts: { WebSocket?: WebSocketConstructor } = {}) {
    const counted = countingFetch()
    const client = new SandkeepClient({ baseUrl: url, tenant, fetch: counted.fetch, events: pushEvents(opts) })
    return { client, polls: counted.polls }
  }

  async function collect(events: AsyncIterable<Event>, each?: (e: Event, n: number) => void) {
    const got: Event[] = []
    for await (const e of events) {
      got.push(e)
      each?.(e, got.length)
    }
    return got
  }

  it('events arrive once and in order while appends race the subscription; no long poll', async () => {
    const { runId, cursor } = await started()
    const s = seam()
    const { client, polls } = reader({ WebSocket: s.WebSocket })
    const batches = Array.from({ length: 40 }, (_, i) => [`a${i}`, `b${i}`, `c${i}`])
    // The first append goes out with the subscribe: some events are stored before it, the
    // rest land while the subscription switches from the stored log to live delivery.
    const [got] = await Promise.all([collect(client.events(runId)), appendAll(runId, cursor, batches)])
    checkExactlyOnce(got, batches.flat())
    expect(polls.n).toBe(0)
    expect(s.sockets.length).toBe(1)
  })

  it('a large event (> 32 KB, one frame) arrives joined from its parts', async () => {
    const { runId, cursor } = await started()
    const big = 'é€😀"\\\n'.repeat(4000) + 'x'.repeat(20_000) // multi-byte runes and escapes across cuts
    const data = [{ before: 1 }, { big }, 'after']
    await appendAll(runId, cursor, [data])
    const { client, polls } = reader()
    const got = await collect(client.events(runId))
    checkExactlyOnce(got, data)
    expect(JSON.stringify(got[1]!.data).length).toBeGreaterThan(32 << 10)
    expect(polls.n).toBe(0)
  })

  it('a forced drop mid-stream resumes with no gap and no duplicate (the server resends from 0)', async () => {
    const { runId, cursor } = await started()
    const first = Array.from({ length: 10 }, (_, i) => `first-${i}`)
    const second = Array.from({ length: 10 }, (_, i) => `second-${i}`)
    const c1 = await appendAll(runId, cursor, [first], false)
    // Every resubscribe asks from 0: what the transport holds already comes again.
    const s = seam({ resumeAfter: () => 0 })
    const { client, polls } = reader({ WebSocket: s.WebSocket })
    let rest: Promise<unknown> = Promise.resolve()
    const got = await collect(client.events(runId), (_, n) => {
      if (n === 5) {
        s.sockets[0]!.close() // the drop, mid-stream
        rest = appendAll(runId, c1, [second])
      }
    })
    await rest
    checkExactlyOnce(got, [...first, ...second])
    expect(s.sockets.length).toBe(2)
    expect(polls.n).toBe(0)
  })

  it('negative control: a transport that keeps offsets <= last after a resume is caught', async () => {
    const { runId, cursor } = await started()
    const first = ['n0', 'n1', 'n2', 'n3']
    const c1 = await appendAll(runId, cursor, [first], false)
    const s = seam({ resumeAfter: () => 0 })
    const client = new SandkeepClient({ baseUrl: url, tenant, events: naivePush(s.WebSocket) })
    let rest: Promise<unknown> = Promise.resolve()
    const got = await collect(client.events(runId), (_, n) => {
      if (n === 2) {
        s.sockets[0]!.close()
        rest = appendAll(runId, c1, [['n4']])
      }
    })
    await rest
    expect(() => checkExactlyOnce(got, [...first, 'n4'])).toThrow(/duplicate or out of order/)
  })

  it('falls back to long polls when the upgrade is refused (404) or the constructor throws', async () => {
    const refusing = seam({ url: (u) => u.replace('/v1/subscribe', '/v1/no-such-route') })
    class Throwing {
      constructor() {
        throw new Error('blocked by policy')
      }
    }
    for (const WebSocket of [refusing.WebSocket, Throwing as unknown as WebSocketConstructor]) {
      const { runId, cursor } = await started()
      const { client, polls } = reader({ WebSocket })
      const batches = [['x0', 'x1'], ['x2'], ['x3', 'x4']]
      const [got] = await Promise.all([collect(client.events(runId)), appendAll(runId, cursor, batches)])
      checkExactlyOnce(got, batches.flat())
      expect(polls.n).toBeGreaterThan(0)
    }
    expect(refusing.sockets.length).toBe(1)
  })

  it("a push error is the HTTP API's SandkeepError; tenants never cross", async () => {
    const { runId } = await started()
    const other = new SandkeepClient({ baseUrl: url, tenant: uid('other'), fetch: countingFetch().fetch })
    const err = await collect(other.events(runId)).then(
      () => undefined,
      (e: unknown) => e,
    )
    expect(err).toBeInstanceOf(SandkeepError)
    expect(err).toMatchObject({ status: 404, code: 'unknown-run' })
    expect((err as SandkeepError).requestId).toMatch(/\S/)
  })
})

/**
 * The broken variant for the negative control: push without the drop of offsets <= last.
 * It resubscribes after a drop like the real transport, and passes on what the server sends.
 */
function naivePush(WS: WebSocketConstructor): (client: SandkeepClient) => EventTransport {
  return (client) => ({
    async *pages(runId, { after }): AsyncGenerator<ReadResponse> {
      let last = after
      for (;;) {
        const ws = new WS(client.socketUrl()!, [pushSubprotocol])
        const queue: (ReadResponse | 'dropped')[] = []
        let wake = () => {}
        ws.addEventListener('open', () => ws.send(JSON.stringify({ type: 'subscribe', runId, after: last })))
        ws.addEventListener('message', (ev) => {
          const m = JSON.parse(String(ev.data)) as { type: string; events?: Event[]; next: number }
          if (m.type === 'events') queue.push({ events: m.events!, next: m.next, closed: false })
          if (m.type === 'closed') queue.push({ events: [], next: m.next, closed: true })
          wake()
        })
        ws.addEventListener('close', () => {
          queue.push('dropped')
          wake()
        })
        for (;;) {
          while (queue.length === 0) await new Promise<void>((r) => (wake = r))
          const p = queue.shift()!
          if (p === 'dropped') break
          yield p
          if (p.closed) return ws.close()
          last = p.next
        }
      }
    },
  })
}
