// Run only by negative.test.ts, in a child vitest, which expects THESE cases to fail: TanStack's
// own conformance suites against @sandkeep/tanstack behind fetch seams that break the server's
// semantics — an upsert turned into a merge, and a patch that drops its explicit clears.
import { runDurableRunFieldsConformance, runSandboxInstanceStoreConformance } from '@tanstack/ai-sandbox/testkit'
import { sandkeepInstances, sandkeepRuns } from '@sandkeep/tanstack'
import { randomBytes } from 'node:crypto'

const url = process.env.SANDKEEP_TS_NEGATIVE_URL!
const tenant = () => `neg-${randomBytes(6).toString('hex')}`

/** PUT of an instance row becomes a merge into the stored row (what a full replace must not do). */
const mergeUpsert: typeof fetch = async (input, init) => {
  if (init?.method === 'PUT' && String(input).includes('/v1/store/instances/')) {
    const prev = (await (await fetch(input, { headers: init.headers })).json()) as { instance: object | null }
    const body = { ...(prev.instance ?? {}), ...(JSON.parse(String(init.body)) as object) }
    return fetch(input, { ...init, body: JSON.stringify(body) })
  }
  return fetch(input, init)
}

/** PATCH of a run drops every member set to null (an explicit clear). */
const dropClears: typeof fetch = async (input, init) => {
  if (init?.method === 'PATCH') {
    const body = Object.fromEntries(Object.entries(JSON.parse(String(init.body)) as object).filter(([, v]) => v !== null))
    return fetch(input, { ...init, body: JSON.stringify(body) })
  }
  return fetch(input, init)
}

runSandboxInstanceStoreConformance('merge-upsert', () => sandkeepInstances({ baseUrl: url, tenant: tenant(), fetch: mergeUpsert }))
runDurableRunFieldsConformance('drop-clears', () => sandkeepRuns({ baseUrl: url, tenant: tenant(), fetch: dropClears }))
