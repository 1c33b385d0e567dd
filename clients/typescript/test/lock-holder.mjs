// A second (and third) Node process for the lock tests: takes the lock KEY of sandkeep dev URL
// for TENANT with @sandkeep/tanstack and reports on stdout, one line each: `refused` for every
// acquire answered lock-held, `in FENCE` once inside, `out` when done. It leaves the critical
// section when a line `release` arrives on stdin. MODE `broken` replaces the lock with one that
// never excludes anyone (the negative control of the mutual-exclusion test).
import { createInterface } from 'node:readline'
import { SandkeepClient } from '@sandkeep/client'
import { sandkeepLocks } from '@sandkeep/tanstack'

const [url, tenant, key, mode] = process.argv.slice(2)
const say = (line) => process.stdout.write(line + '\n')
const fetchSeam = async (input, init) => {
  const resp = await fetch(input, init)
  if (String(input).endsWith('/acquire') && resp.status === 409) say('refused')
  return resp
}
const client = new SandkeepClient({ baseUrl: url, tenant, fetch: fetchSeam })
const real = sandkeepLocks(client, { acquireWaitMs: 200 })
let fences = 0
const broken = { withLease: (k, fn) => fn({ key: k, fence: ++fences, signal: new AbortController().signal }) }
const locks = mode === 'broken' ? broken : real

const release = new Promise((resolve) => {
  createInterface({ input: process.stdin }).on('line', (l) => l === 'release' && resolve())
})
await locks.withLease(key, async ({ fence }) => {
  say(`in ${fence}`)
  await release
})
say('out')
process.exit(0)
