// TanStack AI's own conformance suites, loaded unmodified from the vendored source (see
// vitest.config.ts), against @sandkeep/tanstack over HTTP to real `sandkeep dev` servers in
// memory and on dynalite. Each store gets a fresh tenant, so the cases never share rows.
import { runDurableRunFieldsConformance, runSandboxInstanceStoreConformance } from '@tanstack/ai-sandbox/testkit'
import { sandkeepInstances, sandkeepRuns } from '@sandkeep/tanstack'
import { servers, uid } from './helpers.ts'

for (const { backend, url } of servers) {
  runSandboxInstanceStoreConformance(`sandkeep dev (${backend})`, () => sandkeepInstances({ baseUrl: url, tenant: uid('t') }))
  runDurableRunFieldsConformance(`sandkeep dev (${backend})`, () => sandkeepRuns({ baseUrl: url, tenant: uid('t') }))
}
