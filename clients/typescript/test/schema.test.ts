// The client's types are generated from api/openapi.yaml (`npm run gen`); a document changed
// without regenerating them fails here.
import { execFileSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { expect, it } from 'vitest'
import { repoRoot } from './vendor.ts'

it('packages/client/src/schema.ts is generated from api/openapi.yaml as it is now', () => {
  const dir = mkdtempSync(join(tmpdir(), 'sandkeep-schema-'))
  try {
    const out = join(dir, 'schema.ts')
    const cli = resolve(repoRoot, 'clients/typescript/node_modules/openapi-typescript/bin/cli.js')
    execFileSync(process.execPath, [cli, resolve(repoRoot, 'api/openapi.yaml'), '-o', out], { stdio: 'pipe' })
    const committed = readFileSync(resolve(repoRoot, 'clients/typescript/packages/client/src/schema.ts'), 'utf8')
    expect(committed === readFileSync(out, 'utf8'), 'schema.ts is stale: run `npm run gen` in clients/typescript').toBe(true)
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
})
