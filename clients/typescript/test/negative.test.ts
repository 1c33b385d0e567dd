// The negative controls of the store conformance: TanStack's suites, run in a child vitest
// against deliberately broken variants (test/negative/broken-stores.suite.ts), must fail —
// and exactly in the cases that guard the broken rule.
import { spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { expect, it } from 'vitest'
import { servers } from './helpers.ts'
import { repoRoot } from './vendor.ts'

it('TanStack conformance catches a merge-upsert server and a patch that drops an explicit clear', () => {
  const dir = mkdtempSync(join(tmpdir(), 'sandkeep-neg-'))
  try {
    const out = join(dir, 'report.json')
    const ws = resolve(repoRoot, 'clients/typescript')
    const run = spawnSync(process.execPath, [resolve(ws, 'node_modules/vitest/vitest.mjs'), 'run', '--reporter=json', `--outputFile=${out}`], {
      cwd: ws,
      env: { ...process.env, SANDKEEP_TS_NEGATIVE_URL: servers[0]!.url },
      encoding: 'utf8',
    })
    expect(run.status, run.stderr).toBe(1)
    const report = JSON.parse(readFileSync(out, 'utf8')) as {
      testResults: Array<{ assertionResults: Array<{ fullName: string; status: string }> }>
    }
    const failed = report.testResults.flatMap((f) => f.assertionResults.filter((a) => a.status === 'failed').map((a) => a.fullName))
    expect(failed.sort()).toEqual([
      'SandboxInstanceStore conformance: merge-upsert overwrites an existing record on re-upsert',
      'durable run fields conformance: drop-clears round-trips the durable run fields, overwrites driverEpoch, and clears every one of them on explicit undefined',
    ])
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
})
