// The lock properties as checks that report what they saw instead of asserting, so the same
// check runs against @sandkeep/tanstack's lock (must hold) and against a deliberately broken
// lock built in the test (must be caught). Every outcome is decided by the order of events,
// never by how long something took.
import { spawn, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { dirname, resolve } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'
import type { LockStore } from '@tanstack/ai/locks'

const holderScript = resolve(dirname(fileURLToPath(import.meta.url)), 'lock-holder.mjs')

/** A lock-holder.mjs process and the lines it has printed. */
export class Holder {
  readonly child: ChildProcess
  readonly lines: string[] = []
  private waiters: Array<() => void> = []

  constructor(url: string, tenant: string, key: string, mode: 'real' | 'broken' = 'real') {
    this.child = spawn(process.execPath, [holderScript, url, tenant, key, mode], { stdio: ['pipe', 'pipe', 'inherit'] })
    createInterface({ input: this.child.stdout! }).on('line', (l) => {
      this.lines.push(l)
      for (const w of this.waiters.splice(0)) w()
    })
    this.child.once('exit', () => {
      for (const w of this.waiters.splice(0)) w()
    })
  }

  /** The first printed line matching `re` (waiting for it), or undefined once the process has exited without one. */
  async next(re: RegExp): Promise<string | undefined> {
    for (;;) {
      const hit = this.lines.find((l) => re.test(l))
      if (hit !== undefined) return hit
      if (this.child.exitCode !== null || this.child.signalCode !== null) return undefined
      await new Promise<void>((r) => this.waiters.push(r))
    }
  }

  release() {
    this.child.stdin!.write('release\n')
  }

  async kill() {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return
    this.child.kill('SIGKILL')
    await once(this.child, 'exit')
  }
}

export const fenceOf = (line: string | undefined) => Number(line?.split(' ')[1])

/**
 * Mutual exclusion across two processes: A enters; then B's first report must be a refused
 * acquire, not an entry; once A releases, B enters with a greater fence.
 */
export async function exclusionCheck(url: string, tenant: string, key: string, mode: 'real' | 'broken'): Promise<string> {
  const a = new Holder(url, tenant, key, mode)
  let b: Holder | undefined
  try {
    const aIn = await a.next(/^in /)
    if (!aIn) return 'A never entered'
    b = new Holder(url, tenant, key, mode)
    const first = await b.next(/^(in |refused)/)
    if (first !== 'refused') return `B ${first ?? 'exited'} while A held the lock`
    a.release()
    if ((await a.next(/^out$/)) === undefined) return 'A did not leave'
    const bIn = await b.next(/^in /)
    if (!bIn) return 'B never entered after A released'
    if (!(fenceOf(bIn) > fenceOf(aIn))) return `fence did not grow: ${aIn} then ${bIn}`
    b.release()
    if ((await b.next(/^out$/)) === undefined) return 'B did not leave'
    return 'ok'
  } finally {
    await a.kill()
    await b?.kill()
  }
}

const aborted = (s: AbortSignal) => new Promise<void>((r) => (s.aborted ? r() : s.addEventListener('abort', () => r(), { once: true })))

/**
 * Lease loss: `holder` (whose renewals are stalled by the caller) must abort its signal
 * before `contender` gets in. Returns `ok` when A's signal was aborted first (and the
 * contender then entered), `overlap` when the contender entered while A's signal was live.
 */
export async function leaseLossCheck(holder: LockStore, contender: LockStore, key: string): Promise<{ verdict: 'ok' | 'overlap'; reason?: unknown }> {
  let entered!: () => void
  const bEntered = new Promise<void>((r) => (entered = r))
  let aIn!: () => void
  const aInside = new Promise<void>((r) => (aIn = r))
  let verdict: 'ok' | 'overlap' | undefined
  let reason: unknown
  const a = holder.withLock(key, async (signal) => {
    aIn()
    await Promise.race([aborted(signal), bEntered])
    verdict ??= signal.aborted ? 'ok' : 'overlap'
    reason = signal.reason
  })
  await aInside
  const b = contender.withLock(key, async () => {
    entered()
  })
  await Promise.all([a, b])
  return { verdict: verdict!, reason }
}
