'use strict'
// Memory held for clients that never read: a broker with 4,651 topics
// (a ~14 MB /metrics body) on its own process; 500 clients each send GET /metrics, read the
// status line, and never read again; 2.5 s later (past the 2 s after which a client that took
// nothing may be cut), while they still hold their connections, a normal client scrapes. Prints the broker's RSS growth
// (from /proc) and what the clients got, with the default limits and with the bodies unbounded
// (maxScrapeBytes 2^52: the behaviour before the limit). Exits 1 if, with the defaults, RSS grew
// more than 100 MB or the normal scrape was not answered 200.
//
//   node bench/slow-readers.js [--clients N] [--bounded-only]   (CI: --bounded-only)
const { fork } = require('node:child_process')
const fs = require('node:fs')
const net = require('node:net')
const http = require('node:http')
const path = require('node:path')

if (process.argv[2] === '--broker') {
  const { createSurface } = require(path.join(__dirname, '..', 'dist'))
  const options = JSON.parse(process.argv[3])
  const surface = createSurface({ max_topics: 5000 }, { scrapeShare: 1, ...options })
  for (let i = 0; i < 4651; i++) {
    const topic = surface.topic(`tenant-${String(i % 97).padStart(2, '0')}.orders-${i}`)
    for (let p = 0; p < 16; p++) topic.produced(p, 1000 + i, 100_000)
    for (const name of ['billing', 'audit']) topic.group(name).ackFloor(0, 10)
  }
  surface.listen({ port: 0 }).then((server) => process.send({ port: server.port }))
  return
}

const argv = process.argv.slice(2)
const at = argv.indexOf('--clients')
const CLIENTS = at === -1 ? 500 : Number(argv[at + 1])
if (!Number.isInteger(CLIENTS) || CLIENTS < 1) throw new Error(`--clients needs a positive integer, got ${JSON.stringify(argv[at + 1])}`)

const rssMB = (pid) => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'latin1'))[1]) / 1024

function stalled(port) {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1', () => socket.write('GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n'))
    socket.once('data', (chunk) => {
      socket.pause()
      resolve({ socket, status: Number(/^HTTP\/1\.1 (\d+)/.exec(chunk.toString('latin1'))?.[1] ?? 0) })
    })
    socket.on('error', () => resolve({ socket, status: 0 }))
  })
}

function scrape(port) {
  return new Promise((resolve, reject) => {
    const started = Date.now()
    http.get({ host: '127.0.0.1', port, path: '/metrics', agent: false }, (res) => {
      let bytes = 0
      res.on('data', (c) => (bytes += c.length))
      res.on('end', () => resolve({ status: res.statusCode, bytes, ms: Date.now() - started }))
    }).on('error', reject)
  })
}

async function run(label, options) {
  const broker = fork(__filename, ['--broker', JSON.stringify(options)], { stdio: 'inherit' })
  const { port } = await new Promise((resolve) => broker.once('message', resolve))
  await scrape(port) // warm: the body's size is known, first-render allocations are made
  const before = rssMB(broker.pid)
  const clients = []
  const started = Date.now()
  for (let i = 0; i < CLIENTS && Date.now() - started < 120_000; i++) clients.push(await stalled(port))
  const during = rssMB(broker.pid)
  // The clients sit there, never reading; a Prometheus scrape comes 2.5 s later.
  await new Promise((resolve) => setTimeout(resolve, 2500))
  const normal = await scrape(port)
  const after = rssMB(broker.pid)
  const statuses = {}
  for (const c of clients) statuses[c.status] = (statuses[c.status] ?? 0) + 1
  for (const c of clients) c.socket.destroy()
  broker.kill()
  const result = { label, clients: clients.length, statuses, rssBeforeMB: Math.round(before), rssGrowthMB: Math.round(Math.max(during, after) - before), normalScrape: normal }
  console.log(JSON.stringify(result))
  return result
}

;(async () => {
  const bounded = await run('default limits', {})
  const unbounded = argv.includes('--bounded-only') ? undefined : await run('unbounded (maxScrapeBytes 2^52, as before the limit)', { maxScrapeBytes: 2 ** 52, maxConnections: 65535 })
  console.log(`${bounded.clients} clients that never read: RSS +${bounded.rssGrowthMB} MB with the default limits (goal ≤ 100)${unbounded ? `, +${unbounded.rssGrowthMB} MB unbounded` : ''}; a normal scrape meanwhile: ${bounded.normalScrape.status} in ${bounded.normalScrape.ms} ms`)
  if (bounded.clients !== CLIENTS || bounded.rssGrowthMB > 100 || bounded.normalScrape.status !== 200) process.exitCode = 1
})()
