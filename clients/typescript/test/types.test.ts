// Type-level proofs, with the TypeScript compiler: README's TanStack wiring snippet type-checks
// against @tanstack/ai from npm and TanStack's sandbox source (vendored; path-mapped), and
// @sandkeep/tanstack's instance store and record are structurally TanStack's, both ways. A
// deliberately wrong wiring must not type-check, so the check can fail.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { join, resolve } from 'node:path'
import ts from 'typescript'
import { expect, it } from 'vitest'
import { repoRoot, tanstackDir } from './vendor.ts'

const ws = resolve(repoRoot, 'clients/typescript')

/** The first ```ts block of README.md's "As TanStack AI's sandbox stores" section. */
function wiringSnippet(): string {
  const readme = readFileSync(resolve(repoRoot, 'README.md'), 'utf8')
  const section = readme.split(/^## /m).find((s) => s.startsWith("As TanStack AI's sandbox stores"))
  const m = section && /```ts\n([\s\S]*?)```/.exec(section)
  if (!m) throw new Error("README.md has no ```ts block under \"## As TanStack AI's sandbox stores\"")
  return m[1]!
}

const structural = `
import type { SandboxInstanceRecord as TheirRecord, SandboxInstanceStore as TheirStore } from '@tanstack/ai-sandbox'
import type { SandboxInstanceRecord as OurRecord, SandboxInstanceStore as OurStore, SandkeepRunStore } from '@sandkeep/tanstack'
import type { RunStore } from '@tanstack/ai'
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false
export const record: Same<OurRecord, TheirRecord> = true
export const store: Same<OurStore, TheirStore> = true
export const runs: SandkeepRunStore extends RunStore ? true : false = true
`

/** Type errors of `files` (name → source), compiled inside the workspace so its node_modules resolve. */
function typeErrors(files: Record<string, string>): string[] {
  // Inside the workspace (gitignored by the dot), so that bare imports resolve from its node_modules.
  const dir = mkdtempSync(join(ws, '.typecheck-'))
  try {
    const names = Object.entries(files).map(([name, src]) => {
      const f = join(dir, name)
      writeFileSync(f, src)
      return f
    })
    const sandboxSrc = resolve(tanstackDir(), 'packages/ai-sandbox/src/index.ts')
    const program = ts.createProgram(names, {
      strict: true,
      noEmit: true,
      target: ts.ScriptTarget.ES2022,
      // TanStack's source imports its siblings without extensions (bundler style).
      module: ts.ModuleKind.Preserve,
      moduleResolution: ts.ModuleResolutionKind.Bundler,
      types: ['node'],
      skipLibCheck: true,
      // The vendored sandbox source, and @tanstack/ai from npm for it as for us (bare imports
      // of a file outside the workspace would not find its node_modules).
      paths: {
        '@tanstack/ai-sandbox': [sandboxSrc],
        '@tanstack/ai': [join(ws, 'node_modules/@tanstack/ai/dist/esm/index.d.ts')],
        '@tanstack/ai/locks': [join(ws, 'node_modules/@tanstack/ai/dist/esm/locks.d.ts')],
      },
    })
    // Only the files under test: the vendored source is TanStack's to compile, not ours.
    return names.flatMap((n) => {
      const sf = program.getSourceFile(n)!
      return [...program.getSyntacticDiagnostics(sf), ...program.getSemanticDiagnostics(sf)].map(
        (d) => `${n.slice(dir.length + 1)}: ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`,
      )
    })
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

it("README's TanStack wiring type-checks; the stores are structurally TanStack's", () => {
  expect(typeErrors({ 'wiring.ts': wiringSnippet(), 'structural.ts': structural })).toEqual([])
})

it('a wrong wiring does not type-check (the check can fail)', () => {
  const wrong = wiringSnippet().replace('withSandbox(sandbox, { instances, runs })', 'withSandbox(sandbox, { instances: runs, runs: instances })')
  expect(wrong).not.toBe(wiringSnippet())
  expect(typeErrors({ 'wiring.ts': wrong }).length).toBeGreaterThan(0)
})
