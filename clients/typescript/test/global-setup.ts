// Starts the real servers the tests talk to: `sandkeep dev` in memory and on dynalite
// (SANDKEEP_DYNAMODB_ENDPOINT, a table of its own), each on a free loopback port, and stops
// them when the run ends. The binary is SANDKEEP_BIN (scripts/test.sh builds it once), else
// built here with `go build`. Without a DynamoDB endpoint the dynalite server is left out,
// which fails under CI=true.
import { execFileSync } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { TestProject } from 'vitest/node'
import { repoRoot } from './vendor.ts'
import { startDev, type DevServer } from './dev-server.ts'

export interface ServerInfo {
  backend: 'memory' | 'dynalite'
  url: string
}

declare module 'vitest' {
  export interface ProvidedContext {
    servers: ServerInfo[]
    sandkeepBin: string
  }
}

export default async function setup(project: TestProject) {
  const work = mkdtempSync(join(tmpdir(), 'sandkeep-ts-'))
  let bin = process.env.SANDKEEP_BIN ?? ''
  if (!bin) {
    bin = join(work, 'sandkeep')
    execFileSync(process.env.GO ?? 'go', ['build', '-o', bin, './cmd/sandkeep'], { cwd: repoRoot, stdio: 'inherit' })
  }
  const servers: DevServer[] = []
  const stop = async () => {
    await Promise.all(servers.map((s) => s.stop()))
    rmSync(work, { recursive: true, force: true })
  }
  try {
    servers.push(await startDev(bin, 'memory', ['--sandbox-dir', join(work, 'sb-memory')]))
    const endpoint = process.env.SANDKEEP_DYNAMODB_ENDPOINT
    if (endpoint) {
      const table = `sk-ts-${process.pid}-${Date.now().toString(36)}`
      servers.push(
        await startDev(bin, 'dynalite', ['--sandbox-dir', join(work, 'sb-dynalite'), '--dynamodb-endpoint', endpoint, '--table', table]),
      )
    } else if (process.env.CI === 'true') {
      throw new Error('SANDKEEP_DYNAMODB_ENDPOINT is unset: the dynalite half of the TypeScript tests cannot run (CI=true)')
    } else {
      console.warn('SANDKEEP_DYNAMODB_ENDPOINT unset: TypeScript tests run against the in-memory dev server only')
    }
  } catch (err) {
    await stop()
    throw err
  }
  project.provide('servers', servers.map((s) => ({ backend: s.backend, url: s.url })))
  project.provide('sandkeepBin', bin)
  return stop
}
