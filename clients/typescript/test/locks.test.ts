// @sandkeep/tanstack's LockStore on sandkeep's lease lock, against real `sandkeep dev`
// servers (memory and dynalite): mutual exclusion across two Node processes, lease loss
// aborts the signal before anyone else gets in (renewals stalled at a fetch seam), release on
// throw and on return, and a dead holder's lease lapses. Each check also runs against a
// broken lock built here, which it must catch. The lease-length cases wait out one lease
// (the server's leaseMs), so they run concurrently.
import { SandkeepClient, SandkeepError } from '@sandkeep/client'
import { LockLostError, sandkeepLocks } from '@sandkeep/tanstack'
import type { LockStore } from '@tanstack/ai/locks'
import { describe, expect, it } from 'vitest'
import { exclusionCheck, fenceOf, Holder, leaseLossCheck } from './lock-checks.ts'
import { servers, uid } from './helpers.ts'

/** A fetch that never answers a lock renewal (until the call is aborted): the lease cannot be kept. */
const stallRenewals: typeof fetch = (input, init) => {
  if (!String(input).endsWith('/renew')) return fetch(input, init)
  return new Promise((_, reject) => {
    const s = init?.signal
    s?.addEventListener('abort', () => reject(s.reason), { once: true })
  })
}

/** The negative control: a lock whose callback's signal is never aborted. */
const neverAborts = (inner: LockStore): LockStore => ({
  withLock: (key, fn) => inner.withLock(key, () => fn(new AbortController().signal)),
})

describe.concurrent.each(servers)('locks on $backend', ({ url }) => {
  const tenant = uid('t')
  const client = (f?: typeof fetch) => new SandkeepClient({ baseUrl: url, tenant, fetch: f })

  it('excludes across two Node processes (and the check catches a lock that does not)', async () => {
    expect(await exclusionCheck(url, tenant, uid('k'), 'real')).toBe('ok')
    expect(await exclusionCheck(url, tenant, uid('k'), 'broken')).toMatch(/^B in \d+ while A held the lock$/)
  })

  it('aborts the signal when renewals stall, before another holder gets in', async () => {
    const key = uid('k')
    const res = await leaseLossCheck(sandkeepLocks(client(stallRenewals)), sandkeepLocks(client(), { acquireWaitMs: 1000 }), key)
    expect(res.verdict).toBe('ok')
    expect(res.reason).toBeInstanceOf(LockLostError)
    expect((res.reason as LockLostError).why).toBe('expired')
  })

  it('negative control: a lock that never aborts its signal is caught', async () => {
    const key = uid('k')
    const res = await leaseLossCheck(neverAborts(sandkeepLocks(client(stallRenewals))), sandkeepLocks(client(), { acquireWaitMs: 1000 }), key)
    expect(res.verdict).toBe('overlap')
  })

  it('aborts at once when a renewal says lock-lost', async () => {
    const key = uid('k')
    // The seam answers the first renewal as the server does for a token that no longer holds.
    const lost: typeof fetch = async (input, init) =>
      String(input).endsWith('/renew')
        ? new Response(JSON.stringify({ type: 'about:blank', title: 'Conflict', status: 409, detail: 'lost', code: 'lock-lost', requestId: 'seam' }), {
            status: 409,
            headers: { 'content-type': 'application/problem+json' },
          })
        : fetch(input, init)
    const reason = await sandkeepLocks(client(lost)).withLock(
      key,
      (signal) => new Promise((r) => signal.addEventListener('abort', () => r(signal.reason), { once: true })),
    )
    expect(reason).toBeInstanceOf(LockLostError)
    expect((reason as LockLostError).why).toBe('taken')
  })

  it('releases on throw and on return', async () => {
    const c = client()
    const locks = sandkeepLocks(c)
    const key = uid('k')
    const boom = new Error('boom')
    await expect(locks.withLock(key, async () => Promise.reject(boom))).rejects.toBe(boom)
    // Released: one attempt that does not wait gets the lock (a held lease would be lock-held for leaseMs).
    await c.lockRelease(key, (await c.lockAcquire(key, { waitMs: 0 })).token)
    expect(await locks.withLock(key, async () => 42)).toBe(42)
    await c.lockRelease(key, (await c.lockAcquire(key, { waitMs: 0 })).token)
  })

  it("lets a dead holder's lease lapse", async () => {
    const key = uid('k')
    const c = client()
    const dead = new Holder(url, tenant, key)
    const deadIn = await dead.next(/^in /)
    expect(deadIn).toMatch(/^in \d+$/)
    await dead.kill()
    // Still held right after the holder died: only the lapse frees it.
    const held = await c.lockAcquire(key, { waitMs: 0 }).catch((e: unknown) => e)
    expect(held).toBeInstanceOf(SandkeepError)
    expect((held as SandkeepError).code).toBe('lock-held')
    const fence = await sandkeepLocks(c, { acquireWaitMs: 5000, acquireTimeoutMs: 60_000 }).withLease(key, async (h) => h.fence)
    expect(fence).toBeGreaterThan(fenceOf(deadIn))
  })
})
