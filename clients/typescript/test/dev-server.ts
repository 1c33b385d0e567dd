// One `sandkeep dev` process on a free loopback port: started, its URL read from its
// "listening on" line, stopped with SIGTERM (SIGKILL after its 2 s shutdown bound).
import { spawn, type ChildProcess } from 'node:child_process'
import { rmSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { createInterface } from 'node:readline'

export interface DevServer {
  backend: 'memory' | 'dynalite'
  url: string
  stop(): Promise<void>
}

export async function startDev(bin: string, backend: DevServer['backend'], args: string[]): Promise<DevServer> {
  const child = spawn(bin, ['dev', '--addr', '127.0.0.1:0', ...args], { stdio: ['ignore', 'pipe', 'pipe'] })
  // scripts/typescript.sh kills what a killed test process leaves behind.
  const pidFile = process.env.SANDKEEP_TS_PIDS && child.pid ? join(process.env.SANDKEEP_TS_PIDS, String(child.pid)) : ''
  if (pidFile) writeFileSync(pidFile, String(child.pid))
  const exited = new Promise<void>((resolve) =>
    child.once('exit', () => {
      if (pidFile) rmSync(pidFile, { force: true })
      resolve()
    }),
  )
  let stderr = ''
  child.stderr!.on('data', (d: Buffer) => {
    // JSON request logs; keep the tail for a failure message only.
    stderr = (stderr + d.toString()).slice(-4000)
  })
  const url = await new Promise<string>((resolve, reject) => {
    const lines = createInterface({ input: child.stdout! })
    const timer = setTimeout(() => fail(new Error('no "listening on" line within 30 s')), 30_000)
    const fail = (e: Error) => {
      clearTimeout(timer)
      child.kill('SIGKILL')
      reject(new Error(`sandkeep dev (${backend}): ${e.message}\n${stderr}`))
    }
    lines.on('line', (line) => {
      const m = /^listening on (http:\/\/\S+)$/.exec(line)
      if (m) {
        clearTimeout(timer)
        resolve(m[1]!)
      }
    })
    child.once('exit', (code) => fail(new Error(`exited with ${code} before listening`)))
    child.once('error', fail)
  })
  child.stdout!.resume()
  return { backend, url, stop: () => stopChild(child, exited) }
}

async function stopChild(child: ChildProcess, exited: Promise<void>): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return
  child.kill('SIGTERM')
  const t = setTimeout(() => child.kill('SIGKILL'), 5_000)
  await exited
  clearTimeout(t)
}
