// Shared by the tests: the servers global-setup started, fresh ids and tenants, and the
// bounded wait every test uses instead of a sleep.
import { randomBytes } from 'node:crypto'
import { inject } from 'vitest'
import type { ServerInfo } from './global-setup.ts'

export const servers: ServerInfo[] = inject('servers')

/** A fresh id (also a fresh tenant), so tests never share state on one server. */
export function uid(prefix: string): string {
  return `${prefix}-${randomBytes(6).toString('hex')}`
}

/** Polls `probe` until it returns a value other than undefined, failing after `ms`. */
export async function eventually<T>(what: string, probe: () => Promise<T | undefined>, ms = 20_000, everyMs = 50): Promise<T> {
  const deadline = Date.now() + ms
  for (;;) {
    const v = await probe()
    if (v !== undefined) return v
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`)
    await new Promise((r) => setTimeout(r, everyMs))
  }
}
