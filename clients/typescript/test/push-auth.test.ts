// events() of a JWT or SigV4 client against a stand-in of a deployment's fronts, in front of
// a real `sandkeep dev` (memory): an HTTP API whose authorizer turns `Bearer jwt-of-T` into
// tenant T (a JWT authorizer's claim), or takes a SigV4 caller's tenant header, with a push
// ticket route, and a WebSocket API whose $connect takes a push ticket (JWT) or a presigned
// URL it verifies with the AWS SDK's signer (SigV4), then relays the connection to the dev
// server's GET /v1/subscribe as that tenant (docs/design.md §8.1). A JWT client pushes by
// ticket and long-polls where the ticket route answers 501 or 404; a SigV4 client pushes
// only with a URL signer, and long-polls without one.
import { SandkeepClient, SandkeepError, pushEvents, type Event, type UrlSigner, type WebSocketConstructor } from '@sandkeep/client'
import { presignUrl } from '@sandkeep/client/sigv4'
import { Sha256 } from '@aws-crypto/sha256-js'
import { SignatureV4 } from '@smithy/signature-v4'
import { randomBytes } from 'node:crypto'
import { createServer, request, type IncomingMessage, type ServerResponse } from 'node:http'
import { connect, type AddressInfo, type Socket } from 'node:net'
import type { Duplex } from 'node:stream'
import { afterAll, describe, expect, it } from 'vitest'
import { servers, uid } from './helpers.ts'

const dev = new URL(servers.find((s) => s.backend === 'memory')!.url)
const PlatformWS = (globalThis as { WebSocket?: typeof WebSocket }).WebSocket!

/** The IAM account the stand-in's $connect verifies presigned URLs with. */
const aws = {
  region: 'us-east-1',
  credentials: { accessKeyId: 'AKIDSTANDIN0000PUSH', secretAccessKey: 'stand-in secret of the push endpoint' },
}
const maxSkewMs = 5 * 60_000

type TicketRoute = 'push' | 501 | 404

/** What the stand-in saw: tickets minted, upgrades relayed or refused (why), long polls. */
interface Seen {
  tickets: number
  upgrades: number
  refused: string[]
  polls: number
}

async function standIn(ticketRoute: TicketRoute) {
  const seen: Seen = { tickets: 0, upgrades: 0, refused: [], polls: 0 }
  const tickets = new Map<string, string>() // ticket → tenant, one use each
  const server = createServer((req, res) => void serve(req, res))
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  const pushUrl = base.replace('http:', 'ws:') + '/push'
  const sockets = new Set<Duplex>()

  /** The HTTP API's authorizer: the JWT's tenant, or a signed caller's tenant header. */
  function tenantOf(req: IncomingMessage): string | undefined {
    const bearer = /^Bearer jwt-of-(\S+)$/.exec(req.headers.authorization ?? '')
    if (bearer) return bearer[1]
    if ((req.headers.authorization ?? '').startsWith('AWS4-HMAC-SHA256 ')) return req.headers['x-sandkeep-tenant'] as string | undefined
    return undefined
  }

  async function serve(req: IncomingMessage, res: ServerResponse) {
    const tenant = tenantOf(req)
    if (tenant === undefined) return res.writeHead(401).end('{"message":"Unauthorized"}')
    const path = new URL(req.url!, base).pathname
    if (path === '/v1/push/ticket') {
      seen.tickets++
      if (ticketRoute === 404) return res.writeHead(404, { 'content-type': 'application/json' }).end('{"message":"Not Found"}')
      if (ticketRoute === 'push') {
        const ticket = randomBytes(12).toString('hex')
        tickets.set(ticket, tenant)
        return res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ ticket, expiresAt: Date.now() + 60_000, pushUrl }))
      }
      // 501: the dev server's own answer (it issues no tickets).
    }
    if (req.method === 'GET' && /\/v1\/runs\/[^/]+\/events/.test(path)) seen.polls++
    const headers = { ...req.headers, 'x-sandkeep-tenant': tenant }
    delete headers.authorization
    delete headers.host
    const up = request({ host: dev.hostname, port: dev.port, method: req.method, path: req.url, headers }, (answer) => {
      res.writeHead(answer.statusCode!, answer.headers)
      answer.pipe(res)
    })
    up.on('error', () => res.destroy())
    req.pipe(up)
  }

  /** $connect: a ticket's tenant, or a verified presigned URL's; anything else 403. */
  server.on('upgrade', (req: IncomingMessage, socket: Socket, head: Buffer) => {
    sockets.add(socket)
    socket.on('close', () => sockets.delete(socket))
    const url = new URL(req.url!, base)
    void (async () => {
      let tenant: string | undefined
      let why = ''
      if (url.pathname !== '/push') why = `no route ${url.pathname}`
      else if (req.headers.authorization !== undefined) why = 'an upgrade carrying Authorization'
      else if (url.searchParams.has('ticket')) {
        tenant = tickets.get(url.searchParams.get('ticket')!)
        tickets.delete(url.searchParams.get('ticket')!)
        if (tenant === undefined) why = 'an unknown or used ticket'
        else if (url.searchParams.has('tenant')) why = 'a tenant beside the ticket'
      } else {
        why = await verifyPresigned(url, req.headers.host ?? '')
        tenant = url.searchParams.get('tenant') ?? undefined
        if (why === '' && tenant === undefined) why = 'no tenant'
      }
      if (why !== '' || tenant === undefined) {
        seen.refused.push(why)
        socket.end('HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n')
        return
      }
      seen.upgrades++
      relay(req, socket, head, tenant)
    })()
  })

  /** Relays the upgrade to the dev server's GET /v1/subscribe as `tenant`, byte for byte after it. */
  function relay(req: IncomingMessage, socket: Socket, head: Buffer, tenant: string) {
    const up = connect(Number(dev.port), dev.hostname, () => {
      let lines = `GET /v1/subscribe HTTP/1.1\r\nHost: ${dev.host}\r\nX-Sandkeep-Tenant: ${tenant}\r\n`
      for (let i = 0; i < req.rawHeaders.length; i += 2) {
        const name = req.rawHeaders[i]!
        if (!['host', 'origin', 'authorization', 'x-sandkeep-tenant'].includes(name.toLowerCase())) lines += `${name}: ${req.rawHeaders[i + 1]}\r\n`
      }
      up.write(lines + '\r\n')
      if (head.length > 0) up.write(head)
      socket.pipe(up)
      up.pipe(socket)
    })
    sockets.add(up)
    up.on('close', () => {
      sockets.delete(up)
      socket.destroy()
    })
    up.on('error', () => socket.destroy())
    socket.on('error', () => up.destroy())
    socket.on('close', () => up.destroy())
  }

  return {
    base,
    pushUrl,
    seen,
    async close() {
      for (const s of sockets) s.destroy()
      await new Promise<void>((r) => server.close(() => r()))
    },
  }
}

/**
 * API Gateway's IAM check of a presigned upgrade, with the AWS SDK's signer: the scope is
 * execute-api in the region with the known key, the time within five minutes, and the
 * signature recomputed over the URL as received (host, path, query) is the one sent.
 */
async function verifyPresigned(url: URL, host: string): Promise<string> {
  const q = url.searchParams
  const cred = q.get('X-Amz-Credential') ?? ''
  const date = q.get('X-Amz-Date') ?? ''
  const m = /^(\w+)\/(\d{8})\/([a-z0-9-]+)\/([a-z0-9-]+)\/aws4_request$/.exec(cred)
  const at = Date.parse(date.replace(/^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z$/, '$1-$2-$3T$4:$5:$6Z'))
  if (q.get('X-Amz-Algorithm') !== 'AWS4-HMAC-SHA256' || !m) return `not query-string SigV4: ${url.search}`
  if (m[1] !== aws.credentials.accessKeyId) return `unknown key ${m[1]}`
  if (m[3] !== aws.region || m[4] !== 'execute-api') return `scope ${m[3]}/${m[4]}`
  if (!Number.isFinite(at) || Math.abs(at - Date.now()) > maxSkewMs) return `signed at ${date}`
  if (!(q.get('X-Amz-SignedHeaders') ?? '').split(';').includes('host')) return 'host not signed'
  const query: Record<string, string> = {}
  for (const [k, v] of q) if (!k.startsWith('X-Amz-')) query[k] = v
  const [hostname, port] = host.split(':')
  const signer = new SignatureV4({ service: 'execute-api', region: aws.region, credentials: aws.credentials, sha256: Sha256 })
  const again = await signer.presign(
    { method: 'GET', protocol: 'http:', hostname: hostname!, port: port ? Number(port) : undefined, path: url.pathname, query, headers: { host } },
    { signingDate: new Date(at), expiresIn: Number(q.get('X-Amz-Expires')) },
  )
  return again.query?.['X-Amz-Signature'] === q.get('X-Amz-Signature') ? '' : 'the signature does not verify'
}

/** A WebSocket seam that records the URL of every socket it opens. */
function sockets() {
  const opened: string[] = []
  class Counted extends PlatformWS {
    constructor(url: string | URL, protocols?: string | string[]) {
      super(url, protocols)
      opened.push(String(url))
    }
  }
  return { opened, WebSocket: Counted as unknown as WebSocketConstructor }
}

function checkExactlyOnce(got: Event[], want: unknown[]) {
  let last = 0
  for (const e of got) {
    if (e.offset <= last) throw new Error(`offset ${e.offset} after ${last}: a duplicate or out of order`)
    last = e.offset
  }
  expect(got.map((e) => e.data)).toEqual(want)
}

async function collect(events: AsyncIterable<Event>) {
  const got: Event[] = []
  for await (const e of events) got.push(e)
  return got
}

const sandbox = { id: 'default', provider: 'local-process' } as const
const opened: { close(): Promise<void> }[] = []
afterAll(async () => {
  for (const s of opened) await s.close()
})

/** A run of a fresh tenant, written directly on the dev server; batches race the reader. */
async function run(tenant: string) {
  const writer = new SandkeepClient({ baseUrl: dev.toString(), tenant })
  const runId = uid('run')
  let { cursor } = await writer.start({ runId, threadId: uid('thread'), sandbox })
  return {
    runId,
    async write(batches: string[][]) {
      for (const events of batches) cursor = (await writer.append(runId, { cursor, events: events.map((data) => ({ data })) })).cursor
      await writer.finish(runId, { cursor, status: 'completed' })
    },
  }
}

const batches = Array.from({ length: 12 }, (_, i) => [`a${i}`, `b${i}`])

describe('events() with a JWT', () => {
  it('asks a push ticket and receives every event once over push; another tenant cannot', async () => {
    const s = await standIn('push')
    opened.push(s)
    const tenant = uid('tenant')
    const r = await run(tenant)
    const ws = sockets()
    const client = new SandkeepClient({ baseUrl: s.base, token: `jwt-of-${tenant}`, events: pushEvents({ WebSocket: ws.WebSocket }) })
    const [got] = await Promise.all([collect(client.events(r.runId)), r.write(batches)])
    checkExactlyOnce(got, batches.flat())
    expect(s.seen).toEqual({ tickets: 1, upgrades: 1, refused: [], polls: 0 })
    expect(ws.opened).toHaveLength(1)
    expect(new URL(ws.opened[0]!).searchParams.has('ticket')).toBe(true)

    // Another tenant's genuine ticket connects as that tenant: the run is unknown-run.
    const other = new SandkeepClient({ baseUrl: s.base, token: `jwt-of-${uid('other')}`, events: pushEvents({ WebSocket: ws.WebSocket }) })
    const err = await collect(other.events(r.runId)).then(
      () => undefined,
      (e: unknown) => e,
    )
    expect(err).toBeInstanceOf(SandkeepError)
    expect(err).toMatchObject({ status: 404, code: 'unknown-run' })
    expect(s.seen).toMatchObject({ tickets: 2, upgrades: 2, refused: [], polls: 0 })
  })

  it.each([501, 404] as const)('falls back to long polls when the ticket route answers %d', async (status) => {
    const s = await standIn(status)
    opened.push(s)
    const tenant = uid('tenant')
    const r = await run(tenant)
    const ws = sockets()
    const client = new SandkeepClient({ baseUrl: s.base, token: async () => `jwt-of-${tenant}`, events: pushEvents({ WebSocket: ws.WebSocket }) })
    const [got] = await Promise.all([collect(client.events(r.runId)), r.write(batches)])
    checkExactlyOnce(got, batches.flat())
    expect(s.seen.tickets).toBe(1)
    expect(s.seen.upgrades).toBe(0)
    expect(s.seen.polls).toBeGreaterThan(0)
    expect(ws.opened).toHaveLength(0)
  })
})

describe('events() with SigV4', () => {
  /** A stand-in of a SigV4 RequestSigner: the HTTP API's authorizer here takes the shape. */
  const sign = async () => ({ authorization: 'AWS4-HMAC-SHA256 Credential=stand-in' })

  it('long-polls without a URL signer, and asks no ticket', async () => {
    const s = await standIn('push')
    opened.push(s)
    const tenant = uid('tenant')
    const r = await run(tenant)
    const ws = sockets()
    const client = new SandkeepClient({ baseUrl: s.base, tenant, sign, events: pushEvents({ WebSocket: ws.WebSocket, url: s.pushUrl }) })
    const [got] = await Promise.all([collect(client.events(r.runId)), r.write(batches)])
    checkExactlyOnce(got, batches.flat())
    expect(s.seen).toMatchObject({ tickets: 0, upgrades: 0 })
    expect(s.seen.polls).toBeGreaterThan(0)
    expect(ws.opened).toHaveLength(0)
  })

  it('pushes over a presigned upgrade that verifies; a URL signed for another host is refused', async () => {
    const s = await standIn('push')
    opened.push(s)
    const tenant = uid('tenant')
    const ws = sockets()
    const good = await presignUrl(aws)
    const r = await run(tenant)
    const client = new SandkeepClient({ baseUrl: s.base, tenant, sign, events: pushEvents({ WebSocket: ws.WebSocket, url: s.pushUrl, signUrl: good }) })
    const [got] = await Promise.all([collect(client.events(r.runId)), r.write(batches)])
    checkExactlyOnce(got, batches.flat())
    expect(s.seen).toEqual({ tickets: 0, upgrades: 1, refused: [], polls: 0 })
    const signed = new URL(ws.opened[0]!)
    expect(signed.searchParams.get('tenant')).toBe(tenant)
    expect(signed.searchParams.get('X-Amz-Credential')).toMatch(/\/us-east-1\/execute-api\/aws4_request$/)

    // Broken signers: another host, another secret, the tenant changed after signing.
    const otherHost: UrlSigner = async (u) => {
      const signedElsewhere = new URL(await good(new URL(u.toString().replace('127.0.0.1', 'localhost'))))
      signedElsewhere.host = u.host
      return signedElsewhere
    }
    const otherSecret = await presignUrl({ ...aws, credentials: { ...aws.credentials, secretAccessKey: 'not the secret' } })
    const retenanted: UrlSigner = async (u) => {
      const out = new URL(await good(u))
      out.searchParams.set('tenant', uid('other'))
      return out
    }
    for (const signUrl of [otherHost, otherSecret, retenanted]) {
      const before = s.seen.refused.length
      const r2 = await run(tenant)
      const c2 = new SandkeepClient({ baseUrl: s.base, tenant, sign, events: pushEvents({ WebSocket: ws.WebSocket, url: s.pushUrl, signUrl }) })
      const [got2] = await Promise.all([collect(c2.events(r2.runId)), r2.write([['x0', 'x1'], ['x2']])])
      checkExactlyOnce(got2, ['x0', 'x1', 'x2'])
      expect(s.seen.refused.slice(before)).toEqual(['the signature does not verify'])
    }
    expect(s.seen.upgrades).toBe(1)
  })
})
