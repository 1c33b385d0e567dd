// The parts of TanStack's RunStore contract its durable-fields suite leaves out —
// createOrResume's idempotency, update of an unknown run, findActiveRun, listByThread,
// listReclaimable — and the line between app-driven and sandkeep-driven runs, against real
// `sandkeep dev` servers (memory and dynalite).
import { SandkeepClient, SandkeepError } from '@sandkeep/client'
import { sandkeepRuns } from '@sandkeep/tanstack'
import { describe, expect, it } from 'vitest'
import { servers, uid } from './helpers.ts'

describe.each(servers)('runs on $backend', ({ url }) => {
  const fresh = () => {
    const client = new SandkeepClient({ baseUrl: url, tenant: uid('t') })
    return { client, runs: sandkeepRuns(client) }
  }

  it('createOrResume returns an existing run unchanged; update of an unknown run is a no-op', async () => {
    const { runs } = fresh()
    const a = await runs.createOrResume({ runId: 'r1', threadId: 't1', startedAt: 10 })
    expect(a).toEqual({ runId: 'r1', threadId: 't1', status: 'running', startedAt: 10 })
    await runs.update('r1', { status: 'interrupted' })
    const again = await runs.createOrResume({ runId: 'r1', threadId: 'other', startedAt: 99, status: 'running' })
    expect(again).toEqual({ runId: 'r1', threadId: 't1', status: 'interrupted', startedAt: 10 })
    await runs.update('nobody', { status: 'failed' })
    expect(await runs.get('nobody')).toBeNull()
  })

  it('round-trips finishedAt, error and usage, and clears them on explicit undefined', async () => {
    const { runs } = fresh()
    await runs.createOrResume({ runId: 'r', threadId: 't', startedAt: 1 })
    const usage = { promptTokens: 3, completionTokens: 4, totalTokens: 7 }
    await runs.update('r', { status: 'failed', finishedAt: 5, error: { message: 'boom', code: 'E1' }, usage })
    expect(await runs.get('r')).toEqual({ runId: 'r', threadId: 't', status: 'failed', startedAt: 1, finishedAt: 5, error: { message: 'boom', code: 'E1' }, usage })
    await runs.update('r', { finishedAt: undefined, error: undefined, usage: undefined })
    expect(await runs.get('r')).toEqual({ runId: 'r', threadId: 't', status: 'failed', startedAt: 1 })
  })

  it('findActiveRun: the running run with the greatest startedAt, per thread; null when idle', async () => {
    const { runs } = fresh()
    expect(await runs.findActiveRun('t')).toBeNull()
    await runs.createOrResume({ runId: 'old', threadId: 't', startedAt: 1 })
    await runs.createOrResume({ runId: 'new', threadId: 't', startedAt: 2 })
    await runs.createOrResume({ runId: 'elsewhere', threadId: 'u', startedAt: 3 })
    expect((await runs.findActiveRun('t'))?.runId).toBe('new')
    await runs.update('new', { status: 'completed', finishedAt: 4 })
    expect((await runs.findActiveRun('t'))?.runId).toBe('old')
    await runs.update('old', { status: 'aborted', finishedAt: 4 })
    expect(await runs.findActiveRun('t')).toBeNull()
  })

  it('listByThread: every run of the thread, ascending by startedAt', async () => {
    const { runs } = fresh()
    await runs.createOrResume({ runId: 'b', threadId: 't', startedAt: 20 })
    await runs.createOrResume({ runId: 'a', threadId: 't', startedAt: 10 })
    await runs.createOrResume({ runId: 'c', threadId: 't', startedAt: 30, status: 'completed' })
    await runs.createOrResume({ runId: 'x', threadId: 'u', startedAt: 5 })
    expect((await runs.listByThread('t')).map((r) => r.runId)).toEqual(['a', 'b', 'c'])
    expect(await runs.listByThread('none')).toEqual([])
  })

  it('listReclaimable: running, detached, detachedSince <= now - ttlMs (inclusive)', async () => {
    const { runs } = fresh()
    const now = 1_000_000
    for (const [runId, detachedSince, status] of [
      ['edge', now - 100, 'running'],
      ['older', now - 500, 'running'],
      ['young', now - 99, 'running'],
      ['done', now - 900, 'completed'],
    ] as const) {
      await runs.createOrResume({ runId, threadId: 't', startedAt: 1 })
      await runs.update(runId, { detachedSince, status })
    }
    await runs.createOrResume({ runId: 'attached', threadId: 't', startedAt: 1 })
    expect((await runs.listReclaimable({ now, ttlMs: 100 })).map((r) => r.runId).sort()).toEqual(['edge', 'older'])
  })

  it("sandkeep's start refuses an app-driven run; the store refuses a sandkeep-driven one", async () => {
    const { client, runs } = fresh()
    await runs.createOrResume({ runId: 'app', threadId: 't', startedAt: 1 })
    const e1 = await client.start({ runId: 'app', threadId: 't', sandbox: { id: 'default', provider: 'local-process' } }).catch((e: unknown) => e)
    expect(e1).toBeInstanceOf(SandkeepError)
    expect([(e1 as SandkeepError).status, (e1 as SandkeepError).code]).toEqual([409, 'app-driven-run'])
    await client.start({ runId: 'sk', threadId: 't2', sandbox: { id: 'default', provider: 'local-process' } })
    const e2 = await runs.update('sk', { detachedSince: 5 }).catch((e: unknown) => e)
    expect([(e2 as SandkeepError).status, (e2 as SandkeepError).code]).toEqual([409, 'sandkeep-driven-run'])
  })
})
