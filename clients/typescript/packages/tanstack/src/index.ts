// @sandkeep/tanstack: TanStack AI's sandbox stores kept by sandkeep over HTTP — the instance
// map (SandboxInstanceStore), the run store (RunStore) and the lease lock (LockStore) — for
// `withSandbox(sandbox, { instances, runs })` and `withLocks(locks)`. Types come from
// @tanstack/ai (type-only: nothing of it is loaded at run time).
import { SandkeepClient, SandkeepError, type ClientOptions, type LockLease, type StoreRunPatch } from '@sandkeep/client'
import type { RunRecord, RunStore } from '@tanstack/ai'
import type { LockStore } from '@tanstack/ai/locks'

/**
 * One persisted sandbox instance, structurally TanStack's `SandboxInstanceRecord`
 * (`@tanstack/ai-sandbox`; the test suite checks the two agree both ways).
 */
export interface SandboxInstanceRecord {
  key: string
  provider: string
  providerSandboxId: string
  latestSnapshotId?: string
  threadId: string
  latestRunId?: string
  updatedAt: number
}

/** Structurally TanStack's `SandboxInstanceStore`: get / full-replace upsert / no-op delete. */
export interface SandboxInstanceStore {
  get: (key: string) => Promise<SandboxInstanceRecord | null>
  upsert: (record: SandboxInstanceRecord) => Promise<void>
  delete: (key: string) => Promise<void>
}

type Required<T, K extends keyof T> = T & { [P in K]-?: NonNullable<T[P]> }
/** TanStack's RunStore with its optional listings present. */
export type SandkeepRunStore = Required<RunStore, 'listByThread' | 'listReclaimable'>

function clientOf(c: SandkeepClient | ClientOptions): SandkeepClient {
  return c instanceof SandkeepClient ? c : new SandkeepClient(c)
}

/** The instance map on sandkeep's instance rows (`/v1/store/instances/{key}`). */
export function sandkeepInstances(client: SandkeepClient | ClientOptions): SandboxInstanceStore {
  const c = clientOf(client)
  return {
    get: (key) => c.getInstance(key),
    // Only the record's own members go on the wire, so an upsert is always the full row.
    upsert: ({ key, provider, providerSandboxId, latestSnapshotId, threadId, latestRunId, updatedAt }) =>
      c.putInstance({ key, provider, providerSandboxId, latestSnapshotId, threadId, latestRunId, updatedAt }),
    delete: (key) => c.deleteInstance(key),
  }
}

const patchable = ['status', 'finishedAt', 'error', 'usage', 'sandboxKey', 'detachedSince', 'cancelRequested', 'driverEpoch'] as const

/**
 * The RunStore on sandkeep's run records (`/v1/store/runs`). Runs created here are driven by
 * the app: sandkeep's own start and attach refuse them, and its reaper leaves their
 * finalization to the app.
 */
export function sandkeepRuns(client: SandkeepClient | ClientOptions): SandkeepRunStore {
  const c = clientOf(client)
  return {
    createOrResume: async ({ runId, threadId, startedAt, status }) =>
      (await c.createOrResumeRun({ runId, threadId, startedAt, status })) as RunRecord,
    update: async (runId, patch) => {
      // TanStack tells a key set to undefined (clear it) from an absent key (leave it); JSON
      // has no undefined, so a clear travels as null.
      const body: Record<string, unknown> = {}
      for (const k of patchable) {
        if (Object.hasOwn(patch, k)) body[k] = patch[k] === undefined ? null : patch[k]
      }
      await c.patchRun(runId, body as StoreRunPatch)
    },
    get: async (runId) => (await c.getStoreRun(runId)) as RunRecord | null,
    findActiveRun: async (threadId) => (await c.getStoreActiveRun(threadId)) as RunRecord | null,
    listByThread: async (threadId) => (await c.listStoreThreadRuns(threadId)) as RunRecord[],
    listReclaimable: async ({ now, ttlMs }) => (await c.listStoreReclaimable({ now, ttlMs })) as RunRecord[],
  }
}

/** Why a lock's signal was aborted: the lease can no longer be guaranteed. */
export class LockLostError extends Error {
  override readonly name = 'LockLostError'
  constructor(
    readonly key: string,
    readonly why: 'expired' | 'taken',
  ) {
    super(
      why === 'taken'
        ? `sandkeep: lock ${key}: the lease was lost (lock-lost)`
        : `sandkeep: lock ${key}: no renewal succeeded before the lease ran out`,
    )
  }
}

export interface LockOptions {
  /** How long one acquire call waits on the server for a held lock (default 10000, at most 20000). */
  acquireWaitMs?: number
  /** Gives up acquiring after this long (default: wait until acquired). */
  acquireTimeoutMs?: number
  /** The clock the lease deadline is kept by (default performance.now; monotonic). */
  now?: () => number
}

/** A held lock: what `withLock` keeps while its callback runs (exported for tests and tools). */
export interface HeldLock {
  key: string
  fence: number
  signal: AbortSignal
}

/**
 * The LockStore on sandkeep's lease lock (`/v1/store/locks/{key}/…`): `withLock(key, fn)`
 * acquires the lease (waiting while another holds it), renews it every `renewMs` while `fn`
 * runs, aborts `fn`'s signal as soon as the lease can no longer be guaranteed (a renewal
 * answered `lock-lost`, or no renewal succeeded by `sent + leaseMs - skewMs` of the last
 * successful acquire or renew), and releases it when `fn` returns or throws.
 */
export function sandkeepLocks(client: SandkeepClient | ClientOptions, opts: LockOptions = {}): LockStore & {
  /** withLock that also hands fn the lease's fence. */
  withLease<T>(key: string, fn: (held: HeldLock) => Promise<T>): Promise<T>
} {
  const c = clientOf(client)
  const now = opts.now ?? (() => performance.now())
  const waitMs = Math.min(Math.max(opts.acquireWaitMs ?? 10_000, 0), 20_000)

  async function acquire(key: string): Promise<{ lease: LockLease; sent: number }> {
    const giveUp = opts.acquireTimeoutMs === undefined ? Infinity : now() + opts.acquireTimeoutMs
    for (;;) {
      const sent = now()
      const wait = Math.max(0, Math.min(waitMs, giveUp - sent))
      try {
        return { lease: await c.lockAcquire(key, { waitMs: Math.floor(wait) }), sent }
      } catch (err) {
        if (!(err instanceof SandkeepError && err.code === 'lock-held')) throw err
        if (now() >= giveUp) throw err
      }
    }
  }

  async function withLease<T>(key: string, fn: (held: HeldLock) => Promise<T>): Promise<T> {
    const { lease, sent } = await acquire(key)
    const ac = new AbortController()
    let deadline = sent + lease.leaseMs - lease.skewMs
    let watchdog: ReturnType<typeof setTimeout> | undefined
    const lose = (why: LockLostError['why']) => {
      if (!ac.signal.aborted) ac.abort(new LockLostError(key, why))
    }
    const arm = () => {
      clearTimeout(watchdog)
      watchdog = setTimeout(() => lose('expired'), Math.max(0, deadline - now()))
    }
    arm()
    // One renewal in flight at a time; it is abandoned once the lease is lost anyway.
    const stopRenew = new AbortController()
    const renewals = (async () => {
      while (!stopRenew.signal.aborted && !ac.signal.aborted) {
        await delay(lease.renewMs, stopRenew.signal)
        if (stopRenew.signal.aborted || ac.signal.aborted) return
        const t1 = now()
        try {
          await c.lockRenew(key, lease.token, AbortSignal.any([stopRenew.signal, ac.signal]))
          if (!ac.signal.aborted) {
            deadline = t1 + lease.leaseMs - lease.skewMs
            arm()
          }
        } catch (err) {
          if (err instanceof SandkeepError && err.code === 'lock-lost') lose('taken')
          // Anything else is transient: the deadline stands and the next tick tries again.
        }
      }
    })()
    try {
      return await fn({ key, fence: lease.fence, signal: ac.signal })
    } finally {
      stopRenew.abort()
      clearTimeout(watchdog)
      await renewals
      // Best effort: a release that does not arrive lets the lease lapse on its own.
      await c.lockRelease(key, lease.token).catch(() => undefined)
    }
  }

  return {
    withLock: (key, fn) => withLease(key, (held) => fn(held.signal)),
    withLease,
  }
}

function delay(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve()
    const t = setTimeout(done, ms)
    function done() {
      clearTimeout(t)
      signal.removeEventListener('abort', done)
      resolve()
    }
    signal.addEventListener('abort', done, { once: true })
  })
}

/** All three stores over one client: `withSandbox(sandbox, { instances, runs })`, `withLocks(locks)`. */
export function sandkeepStores(client: SandkeepClient | ClientOptions, lockOptions?: LockOptions) {
  const c = clientOf(client)
  return { instances: sandkeepInstances(c), runs: sandkeepRuns(c), locks: sandkeepLocks(c, lockOptions) }
}
