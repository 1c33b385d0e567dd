// Tests run against real `sandkeep dev` servers (test/global-setup.ts starts them) and load
// TanStack AI's own conformance suites unmodified from the vendored source, a sibling of the
// repository (../shared/vendor/tanstack-ai; SANDKEEP_TANSTACK_AI overrides), with its
// workspace packages path-mapped to their src/index.ts.
import { dirname, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { defineConfig } from 'vitest/config'
import { haveTanstack, tanstackDir } from './test/vendor.ts'

const here = dirname(fileURLToPath(import.meta.url))
const vendor = tanstackDir()
// Without the vendored source the conformance tests are left out, which fails under CI=true.
const conformance = haveTanstack()
if (!conformance) {
  const msg = `TanStack AI's vendored source is not at ${vendor} (set SANDKEEP_TANSTACK_AI)`
  if (process.env.CI === 'true') throw new Error(msg)
  console.warn(`${msg}: leaving out the conformance tests`)
}
// Set by test/negative.test.ts for its child run: the broken variants, against its server.
const negative = process.env.SANDKEEP_TS_NEGATIVE_URL
const pkg = (p: string) => resolve(vendor, 'packages', p, 'src')
// The vendored files sit outside this workspace, so their bare imports of npm packages are
// resolved from here.
const fromHere = (name: string) => resolve(here, 'node_modules', name)

export default defineConfig({
  resolve: {
    alias: [
      { find: /^@tanstack\/ai\/locks$/, replacement: resolve(pkg('ai'), 'locks.ts') },
      { find: /^@tanstack\/ai\/adapter-internals$/, replacement: resolve(pkg('ai'), 'adapter-internals.ts') },
      { find: /^@tanstack\/ai$/, replacement: resolve(pkg('ai'), 'index.ts') },
      { find: /^@tanstack\/ai-event-client$/, replacement: resolve(pkg('ai-event-client'), 'index.ts') },
      { find: /^@tanstack\/ai-utils$/, replacement: resolve(pkg('ai-utils'), 'index.ts') },
      { find: /^@tanstack\/ai-sandbox\/testkit$/, replacement: resolve(pkg('ai-sandbox'), 'testkit/conformance.ts') },
      { find: /^@ag-ui\/core$/, replacement: fromHere('@ag-ui/core') },
      { find: /^partial-json$/, replacement: fromHere('partial-json') },
      { find: /^@tanstack\/devtools-event-client$/, replacement: fromHere('@tanstack/devtools-event-client') },
    ],
  },
  server: { fs: { allow: [here, vendor] } },
  test: {
    include: negative ? ['test/negative/*.suite.ts'] : ['test/**/*.test.ts'],
    exclude: conformance ? [] : ['test/conformance.test.ts', 'test/negative.test.ts'],
    globalSetup: negative ? [] : ['test/global-setup.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: 'forks',
    // The push tests use the platform's WebSocket, behind this flag on Node 20 (a global
    // from Node 22, where the flag is accepted and changes nothing).
    execArgv: ['--experimental-websocket'],
  },
})
