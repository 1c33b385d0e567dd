// Where the vendored TanStack AI source is: SANDKEEP_TANSTACK_AI, else the project's shared
// vendor directory, a sibling of the repository (../shared/vendor/tanstack-ai from its root).
import { existsSync } from 'node:fs'
import { dirname, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

/** The repository's root (clients/typescript/test/ is three levels below it). */
export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../../..')

export function tanstackDir(): string {
  return process.env.SANDKEEP_TANSTACK_AI || resolve(repoRoot, '../shared/vendor/tanstack-ai')
}

/** Whether the vendored source is there (the suite refuses to run without it). */
export function haveTanstack(): boolean {
  return existsSync(resolve(tanstackDir(), 'packages/ai-sandbox/src/testkit/conformance.ts'))
}
