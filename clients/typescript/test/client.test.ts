// @sandkeep/client against real `sandkeep dev` servers (memory and dynalite): one test per
// route of api/openapi.yaml (the last test checks that none is missing), the typed
// problem+json error, retries of safe calls only (Retry-After honoured) at a fetch seam, and
// the auth headers.
import { readFileSync } from 'node:fs'
import { resolve } from 'node:path'
import { SandkeepClient, SandkeepError, longPollEvents, routes, type OperationId, type Schemas } from '@sandkeep/client'
import { sigv4 } from '@sandkeep/client/sigv4'
import { describe, expect, it } from 'vitest'
import { parse } from 'yaml'
import { eventually, servers, uid } from './helpers.ts'
import { repoRoot } from './vendor.ts'

const doc = parse(readFileSync(resolve(repoRoot, 'api/openapi.yaml'), 'utf8')) as {
  paths: Record<string, Record<string, { operationId?: string }>>
}
const documented = new Map<string, { method: string; path: string }>()
for (const [path, item] of Object.entries(doc.paths)) {
  for (const [method, op] of Object.entries(item)) {
    if (op && typeof op === 'object' && op.operationId) documented.set(op.operationId, { method: method.toUpperCase(), path })
  }
}

const sandboxReq = (id = 'default'): Schemas['SetupRequest'] => ({ id, provider: 'local-process' })

async function problem(p: Promise<unknown>): Promise<SandkeepError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  )
  expect(err).toBeInstanceOf(SandkeepError)
  return err as SandkeepError
}

it('routes: every operation of api/openapi.yaml, with its method and path', () => {
  expect(Object.keys(routes).sort()).toEqual([...documented.keys()].sort())
  for (const [op, r] of Object.entries(routes)) {
    expect({ op, method: r.method, path: r.path }).toEqual({ op, ...documented.get(op) })
  }
})

describe.each(servers)('client on $backend', ({ url }) => {
  const covered = new Set<string>()
  const tenant = uid('tenant')
  const c = new SandkeepClient({ baseUrl: url, tenant })
  const thread = uid('thread')
  const runId = uid('run')
  let cursor = ''

  const route = (op: OperationId, fn: () => Promise<void>) =>
    it(`route ${op}`, async () => {
      await fn()
      covered.add(op)
    })

  route('startRun', async () => {
    const s = await c.start({ runId, threadId: thread, sandbox: sandboxReq() })
    expect(s.outcome).toBe('created')
    expect(s.driverEpoch).toBe(1)
    expect(s.run).toMatchObject({ runId, threadId: thread, status: 'running' })
    cursor = s.cursor
  })
  route('getRun', async () => {
    const { run } = await c.get(runId)
    expect(run).toMatchObject({ runId, status: 'running', driverEpoch: 1 })
    const e = await problem(c.get(uid('absent')))
    expect([e.status, e.code]).toEqual([404, 'unknown-run'])
  })
  route('getActiveRun', async () => {
    expect((await c.activeRun(thread))?.runId).toBe(runId)
    expect(await c.activeRun(uid('idle'))).toBeNull()
  })
  route('appendEvents', async () => {
    const a = await c.append(runId, { cursor, events: [{ data: { text: 'hello' } }, { data: 'step 2' }] })
    expect(a.lastOffset).toBeGreaterThanOrEqual(2)
    expect(a.cancelRequested).toBe(false)
    // The same cursor again is another batch at the same position: refused, not stored twice.
    const e = await problem(c.append(runId, { cursor, events: [{ data: 'again' }] }))
    expect([e.status, e.code]).toEqual([409, 'conflict'])
    cursor = a.cursor
  })
  route('readEvents', async () => {
    const page = await c.read(runId, { after: 0 })
    expect(page.events.map((e) => e.data)).toEqual([{ text: 'hello' }, 'step 2'])
    expect(page.closed).toBe(false)
    const rest = await c.read(runId, { after: page.next, waitMs: 0 })
    expect(rest.events).toEqual([])
  })
  route('heartbeatRun', async () => {
    const h = await c.heartbeat(runId, cursor)
    expect(h.cancelRequested).toBe(false)
    expect(h.leaseUntil).toBeGreaterThan(0)
  })
  route('snapshotRun', async () => {
    const s = await c.snapshot(runId, { cursor, label: 'ts' })
    expect(s.sandbox.latestSnapshotId).toBeTruthy()
  })
  route('detachRun', async () => {
    const { run } = await c.detach(runId, cursor)
    expect(run.detachedSince).toBeGreaterThan(0)
  })
  route('attachRun', async () => {
    const a = await c.attach(runId)
    expect(a.driverEpoch).toBe(2)
    // The old driver is fenced out, and the error says so in its code.
    const e = await problem(c.heartbeat(runId, cursor))
    expect([e.status, e.code]).toEqual([409, 'superseded'])
    expect(e.requestId).not.toBe('')
    cursor = a.cursor
  })
  route('viewRun', async () => {
    const v = await c.view(runId)
    expect(v.run).toMatchObject({ runId, driverEpoch: 2 })
    expect(v.run.sandbox?.state).toBe('live')
    expect(v.now).toBeGreaterThan(0)
  })
  route('listRuns', async () => {
    const page = await c.list({ threadId: thread, limit: 10 })
    expect(page.runs.map((r) => r.runId)).toEqual([runId])
    const all: string[] = []
    for await (const r of c.listAll({ threadId: thread, limit: 1 })) all.push(r.runId)
    expect(all).toEqual([runId])
  })
  route('reaperSweeps', async () => {
    const s = await c.sweeps({ limit: 1 })
    expect(Array.isArray(s.sweeps)).toBe(true)
    expect(s.kept).toBeGreaterThanOrEqual(1)
  })
  route('pushTicket', async () => {
    // Only a JWT deployment issues push tickets; the dev server's upgrade takes the tenant.
    const e = await problem(c.call('pushTicket', { body: {} }))
    expect([e.status, e.code]).toEqual([501, 'unsupported'])
  })
  route('cancelRun', async () => {
    const { run } = await c.cancel(runId)
    expect(run.cancelRequested).toBe(true)
    const a = await c.append(runId, { cursor, events: [{ data: 'stopping' }] })
    expect(a.cancelRequested).toBe(true)
    cursor = a.cursor
  })
  route('finishRun', async () => {
    const { run } = await c.finish(runId, { cursor, status: 'aborted' })
    expect(run.status).toBe('aborted')
    // events() walks the whole log and ends at the close.
    const data: unknown[] = []
    for await (const e of c.events(runId)) data.push(e.data)
    expect(data).toEqual([{ text: 'hello' }, 'step 2', 'stopping'])
  })
  route('cancelThread', async () => {
    const idle = await problem(c.cancelThread(thread))
    expect([idle.status, idle.code]).toEqual([404, 'unknown-run'])
    const r2 = uid('run')
    await c.start({ runId: r2, threadId: thread, sandbox: sandboxReq() })
    const { run } = await c.cancelThread(thread)
    expect([run.runId, run.cancelRequested]).toEqual([r2, true])
  })
  route('launchAgent', async () => {
    const r3 = uid('run')
    const t3 = uid('thread')
    const s = await c.start({ runId: r3, threadId: t3, sandbox: sandboxReq() })
    expect((await c.agent(r3, { cursor: s.cursor, command: 'echo "{\\"n\\":1}"; echo "{\\"n\\":2}"' })).launched).toBe(true)
    expect((await c.agent(r3, { cursor: s.cursor, command: 'echo again' })).launched).toBe(false)
    pumpRun = { runId: r3, cursor: s.cursor }
  })
  let pumpRun = { runId: '', cursor: '' }
  route('pumpJournal', async () => {
    let { runId: r3, cursor: cur } = pumpRun
    const exit = await eventually('the agent to exit and its lines to be stored', async () => {
      const p = await c.pump(r3, { cursor: cur, waitMs: 1000 })
      cur = p.cursor
      return p.exited ? p.exitCode : undefined
    })
    expect(exit).toBe(0)
    const page = await c.read(r3, { after: 0 })
    expect(page.events.map((e) => e.data)).toEqual([{ n: 1 }, { n: 2 }])
  })

  // ---- the ship routes: a sandbox's shipper's, its ship token the only credential. A
  // client without one is refused; the probe answers anyone.
  route('shipProbe', async () => {
    const r = await fetch(`${url}/v1/ship`)
    expect(r.status).toBe(204)
  })
  for (const [op, path] of [['shipJournal', '/ship?src=0'], ['shipEnd', '/ship/end?code=0']] as const) {
    route(op, async () => {
      const r = await fetch(`${url}/v1/runs/${runId}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/octet-stream', 'x-sandkeep-tenant': tenant },
        body: '{"n":1}\n',
      })
      expect(r.status).toBe(401)
      expect(((await r.json()) as { code: string }).code).toBe('invalid-token')
    })
  }

  // ---- the store routes
  const key = uid('k')
  route('storeUpsertInstance', async () => {
    await c.putInstance({ key, provider: 'p', providerSandboxId: 'sb-1', threadId: thread, latestSnapshotId: 'snap', updatedAt: 1 })
    await c.putInstance({ key, provider: 'p', providerSandboxId: 'sb-2', threadId: thread, updatedAt: 2 })
    expect(await c.getInstance(key)).toEqual({ key, provider: 'p', providerSandboxId: 'sb-2', threadId: thread, updatedAt: 2 })
  })
  route('storeGetInstance', async () => {
    expect((await c.getInstance(key))?.providerSandboxId).toBe('sb-2')
    expect(await c.getInstance(uid('absent'))).toBeNull()
  })
  route('storeDeleteInstance', async () => {
    await c.deleteInstance(key)
    await c.deleteInstance(key)
    expect(await c.getInstance(key)).toBeNull()
  })
  const appRun = uid('app')
  const appThread = uid('thread')
  route('storeCreateOrResumeRun', async () => {
    expect(await c.createOrResumeRun({ runId: appRun, threadId: appThread, startedAt: 5 })).toEqual({ runId: appRun, threadId: appThread, status: 'running', startedAt: 5 })
    const e = await problem(c.createOrResumeRun({ runId, threadId: thread, startedAt: 5 }))
    expect([e.status, e.code]).toEqual([409, 'sandkeep-driven-run'])
  })
  route('storeUpdateRun', async () => {
    await c.patchRun(appRun, { detachedSince: 7, sandboxKey: 'sk' })
    await c.patchRun(appRun, { sandboxKey: null })
    expect(await c.getStoreRun(appRun)).toEqual({ runId: appRun, threadId: appThread, status: 'running', startedAt: 5, detachedSince: 7 })
  })
  route('storeGetRun', async () => {
    expect((await c.getStoreRun(appRun))?.runId).toBe(appRun)
    expect(await c.getStoreRun(uid('absent'))).toBeNull()
  })
  route('storeFindActiveRun', async () => {
    expect((await c.getStoreActiveRun(appThread))?.runId).toBe(appRun)
    expect(await c.getStoreActiveRun(uid('idle'))).toBeNull()
  })
  route('storeListByThread', async () => {
    expect((await c.listStoreThreadRuns(appThread)).map((r) => r.runId)).toEqual([appRun])
  })
  route('storeListReclaimable', async () => {
    expect((await c.listStoreReclaimable({ now: 7, ttlMs: 0 })).map((r) => r.runId)).toEqual([appRun])
    expect(await c.listStoreReclaimable({ now: 6, ttlMs: 0 })).toEqual([])
  })
  const lockKey = uid('lock')
  let lease = { token: '', fence: 0 }
  route('storeAcquireLock', async () => {
    const l = await c.lockAcquire(lockKey, { waitMs: 0 })
    expect(l.leaseMs).toBeGreaterThan(l.skewMs)
    expect(l.renewMs).toBeLessThan(l.leaseMs)
    const e = await problem(c.lockAcquire(lockKey, { waitMs: 0 }))
    expect([e.status, e.code]).toEqual([409, 'lock-held'])
    lease = l
  })
  route('storeRenewLock', async () => {
    expect((await c.lockRenew(lockKey, lease.token)).leaseMs).toBeGreaterThan(0)
    const e = await problem(c.lockRenew(lockKey, 'not-the-token'))
    expect([e.status, e.code]).toEqual([409, 'lock-lost'])
  })
  route('storeReleaseLock', async () => {
    await c.lockRelease(lockKey, lease.token)
    await c.lockRelease(lockKey, lease.token) // idempotent
    const again = await c.lockAcquire(lockKey, { waitMs: 0 })
    expect(again.fence).toBeGreaterThan(lease.fence)
    await c.lockRelease(lockKey, again.token)
  })

  it('events() long-polls: an event appended after the iterator waits is yielded', async () => {
    const r = uid('run')
    const s = await c.start({ runId: r, threadId: uid('thread'), sandbox: sandboxReq() })
    // Long polls only (test/push.test.ts covers the default, push).
    const lp = new SandkeepClient({ baseUrl: url, tenant, events: longPollEvents })
    const it = lp.events(r, { waitMs: 20_000 })
    const first = it.next() // the poll is waiting: nothing is in the log yet
    const a1 = await c.append(r, { cursor: s.cursor, events: [{ data: 'late' }] })
    const got = (await first).value
    expect(got).toMatchObject({ data: 'late' })
    await it.return()
    // `after` resumes past what was seen.
    const a2 = await c.append(r, { cursor: a1.cursor, events: [{ data: 'more' }] })
    await c.finish(r, { cursor: a2.cursor, status: 'completed' })
    const seen: unknown[] = []
    for await (const e of lp.events(r, { after: got!.offset })) seen.push(e.data)
    expect(seen).toEqual(['more'])
  })

  it('problem+json is a SandkeepError with code, detail and the request id', async () => {
    const e = await problem(c.call('startRun', { body: { runId: '..', threadId: 't', sandbox: sandboxReq() } as never }))
    expect([e.status, e.code]).toEqual([400, 'invalid'])
    expect(e.detail).toMatch(/runId/)
    expect(e.requestId).toMatch(/\S/)
    expect(e.message).toContain(e.requestId)
  })

  it('tenants never cross', async () => {
    const other = new SandkeepClient({ baseUrl: url, tenant: uid('other') })
    const e = await problem(other.get(runId))
    expect([e.status, e.code]).toEqual([404, 'unknown-run'])
  })

  it('covers every route of the document', () => {
    expect([...covered].sort()).toEqual([...documented.keys()].sort())
  })
})

describe('retries (a fetch seam in front of the in-memory dev server)', () => {
  const url = servers[0]!.url
  /** A fetch that answers `failures` calls with 503 (Retry-After: 1) before passing through. */
  function flaky(failures: number) {
    const attempts: number[] = []
    const f: typeof fetch = async (input, init) => {
      attempts.push(performance.now())
      if (attempts.length <= failures) {
        return new Response(JSON.stringify({ type: 'about:blank', title: 'Service Unavailable', status: 503, detail: 'try again', code: 'unavailable', requestId: 'seam' }), {
          status: 503,
          headers: { 'content-type': 'application/problem+json', 'retry-after': '1' },
        })
      }
      return fetch(input, init)
    }
    return { f, attempts }
  }

  it('repeats a safe call after Retry-After', async () => {
    const { f, attempts } = flaky(1)
    const c = new SandkeepClient({ baseUrl: url, tenant: uid('t'), fetch: f, retryBaseMs: 1, retryMaxMs: 1 })
    expect(await c.activeRun(uid('thread'))).toBeNull()
    expect(attempts).toHaveLength(2)
    // Backoff alone would wait 1 ms; the server's Retry-After (1 s) wins.
    expect(attempts[1]! - attempts[0]!).toBeGreaterThanOrEqual(990)
  })

  it('never repeats a call that could act twice (start)', async () => {
    const { f, attempts } = flaky(1)
    const c = new SandkeepClient({ baseUrl: url, tenant: uid('t'), fetch: f, retryBaseMs: 1, retryMaxMs: 1 })
    const e = await problem(c.start({ runId: uid('run'), threadId: uid('thread'), sandbox: sandboxReq() }))
    expect([e.status, e.code, e.retryAfterMs]).toEqual([503, 'unavailable', 1000])
    expect(attempts).toHaveLength(1)
  })

  it('repeats a safe call after a lost answer, up to maxAttempts', async () => {
    let n = 0
    const f: typeof fetch = async () => {
      n++
      throw new TypeError('fetch failed', { cause: new Error('ECONNRESET') })
    }
    const c = new SandkeepClient({ baseUrl: url, fetch: f, maxAttempts: 3, retryBaseMs: 1, retryMaxMs: 2 })
    await expect(c.get('r')).rejects.toThrow(/ECONNRESET/)
    expect(n).toBe(3)
  })
})

describe('auth headers', () => {
  const url = servers[0]!.url
  function recording() {
    const seen: Headers[] = []
    const f: typeof fetch = async (input, init) => {
      seen.push(new Headers(init?.headers))
      return fetch(input, init)
    }
    return { f, seen }
  }

  it('sends a JWT as a bearer token, fetched per attempt', async () => {
    const { f, seen } = recording()
    let n = 0
    const c = new SandkeepClient({ baseUrl: url, fetch: f, token: async () => `jwt-${++n}` })
    await c.activeRun('x')
    await c.activeRun('y')
    expect(seen.map((h) => h.get('authorization'))).toEqual(['Bearer jwt-1', 'Bearer jwt-2'])
    expect(seen[0]!.get('x-sandkeep-tenant')).toBeNull()
    expect(() => new SandkeepClient({ baseUrl: url, token: 't', tenant: 'x' })).toThrow(/exclusive/)
  })

  it('signs every attempt with SigV4 (execute-api), the tenant header included', async () => {
    const { f, seen } = recording()
    const sign = await sigv4({ region: 'eu-west-1', credentials: { accessKeyId: 'AKIDEXAMPLE', secretAccessKey: 'secret' } })
    const c = new SandkeepClient({ baseUrl: url, fetch: f, tenant: 'acme', sign })
    expect(await c.activeRun('x')).toBeNull() // the dev server ignores the signature
    const auth = seen[0]!.get('authorization') ?? ''
    expect(auth).toMatch(/^AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE\/\d{8}\/eu-west-1\/execute-api\/aws4_request, SignedHeaders=[^,]*host[^,]*x-sandkeep-tenant[^,]*, Signature=[0-9a-f]{64}$/)
    expect(seen[0]!.get('x-amz-date')).toMatch(/^\d{8}T\d{6}Z$/)
  })
})
