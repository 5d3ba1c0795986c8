'use strict'
// Bounded memory per client: a client that never reads a /metrics answer
// made the broker hold a whole body (11 MB here) until the 30 s idle timeout, with no cap on how
// many. Now the bodies held by responses still being written are bounded (maxScrapeBytes): past
// it, clients that stopped reading are cut, oldest first, or a scrape gets a fast 503 with
// Retry-After; the standalone server holds at most maxConnections connections. The 500-client
// memory figure is bench/slow-readers.js (a CI step).
const t = require('tap')
const net = require('node:net')
const http = require('node:http')
const { backends, surfaceOn, request } = require('./helpers')

/** ~11 MB of exposition: 4,651 topics × 16 partitions × 2 groups, realistic names. */
function bigSurface(t, backend, options) {
  const surface = surfaceOn(t, backend, { max_topics: 5000 }, { scrapeShare: 1, ...options })
  for (let i = 0; i < 4651; i++) {
    const topic = surface.topic(`tenant-${String(i % 97).padStart(2, '0')}.orders-${i}`)
    for (let p = 0; p < 16; p++) topic.produced(p, 1000 + i, 100_000)
    for (const name of ['billing', 'audit']) topic.group(name).ackFloor(0, 10)
  }
  return surface
}

/** A client that sends GET `path` (`times` requests, pipelined), reads the status line, and then never reads again. */
function stalledClient(port, path = '/metrics', times = 1) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1', () => socket.write(`GET ${path} HTTP/1.1\r\nHost: x\r\n\r\n`.repeat(times)))
    socket.once('data', (chunk) => {
      socket.pause() // the kernel buffers fill, then the server's
      resolve({ socket, status: Number(/^HTTP\/1\.1 (\d+)/.exec(chunk.toString('latin1'))[1]), head: chunk.toString('latin1', 0, 300) })
    })
    socket.on('error', () => {})
    socket.once('close', () => reject(new Error('closed before answering')))
  })
}

const get = (port, path) => request(port, { path, keepBody: false })

for (const backend of backends()) {
  t.test(`${backend}: clients that stop reading hold at most maxScrapeBytes; a reading client is still served`, async (t) => {
    const surface = bigSurface(t, backend, { maxScrapeBytes: 32 * 2 ** 20 })
    const server = await surface.listen({ port: 0 })
    const size = (await get(server.port, '/metrics')).bytes
    t.ok(size > 11e6 && size < 16e6, `the body is ${(size / 1e6).toFixed(1)} MB: two fit 32 MiB, three do not`)
    const clients = []
    t.teardown(() => clients.forEach((c) => c.socket.destroy()))
    clients.push(await stalledClient(server.port), await stalledClient(server.port))
    t.same(clients.map((c) => c.status), [200, 200], 'two bodies fit the budget')
    const refused = await stalledClient(server.port)
    clients.push(refused)
    t.equal(refused.status, 503, 'a third, while the first two are young: no room')
    t.match(refused.head, /retry-after: 1/i)
    t.match(refused.head, /SCRAPES_IN_FLIGHT|content-type: application\/json/i)
    await new Promise((resolve) => setTimeout(resolve, 2100)) // the first two have taken nothing for 2 s (STALLED_MS)
    const normal = await get(server.port, '/metrics')
    t.equal(normal.status, 200, 'a reading client is served: room is made by cutting a stalled one')
    t.ok(Math.abs(normal.bytes - size) < 100, 'the whole body (the uptime line aside)')
    // The oldest stalled client finds its connection cut once it reads again: short of its body.
    const first = clients[0].socket
    let received = 0
    first.on('data', (chunk) => (received += chunk.length))
    first.resume()
    await new Promise((resolve) => first.once('close', resolve))
    t.ok(received < size, `the oldest stalled client was cut (${(received / 1e6).toFixed(1)} of ${(size / 1e6).toFixed(1)} MB)`)
  })
}

// /stats answers are bounded as /metrics bodies are (a budget of their own, as large): a client
// that pipelined requests and never read made the broker build and hold one whole answer per
// request (30 of 33.5 MB: +1.8 GB), and clients that never read one each as much.
for (const backend of backends()) {
  t.test(`${backend}: /stats answers that clients do not read are bounded too; /healthz is always answered`, async (t) => {
    const surface = bigSurface(t, backend, { maxScrapeBytes: 12 * 2 ** 20 })
    const server = await surface.listen({ port: 0 })
    const path = '/stats?filter=partitions'
    const size = (await get(server.port, path)).bytes
    t.ok(size > 7e6 && size < 12e6, `the answer is ${(size / 1e6).toFixed(1)} MB: one fits 12 MiB, two do not`)
    const hog = await stalledClient(server.port, path, 20)
    t.teardown(() => hog.socket.destroy())
    t.equal(hog.status, 200, 'the first of 20 pipelined requests is answered')
    const refused = await stalledClient(server.port, path)
    t.teardown(() => refused.socket.destroy())
    t.equal(refused.status, 503, 'another, while the first answer is young and unread: no room')
    t.match(refused.head, /retry-after: 1/i)
    t.match(refused.head, /ANSWERS_IN_FLIGHT/)
    t.equal((await get(server.port, '/healthz')).status, 200, '/healthz is answered whatever /stats holds')
    await new Promise((resolve) => setTimeout(resolve, 2100)) // the hog has taken nothing for 2 s (STALLED_MS)
    const normal = await get(server.port, path)
    t.equal(normal.status, 200, 'a reading client is served: room is made by cutting the stalled one')
    t.ok(Math.abs(normal.bytes - size) < 100, 'the whole answer')
    let received = 0
    hog.socket.on('data', (chunk) => (received += chunk.length))
    hog.socket.resume()
    await new Promise((resolve) => hog.socket.once('close', resolve))
    t.ok(received < 2 * size, `the pipelining client was cut, not sent its 20 answers (${(received / 1e6).toFixed(1)} MB read)`)
  })
}

// Scrapes that come together: each is admitted against the room the ones admitted before it will
// take (reserved when admitted), not against what is held before any of them has rendered: it let
// 20 of 20 in, 41 MB held against a 64 KiB bound (a body is rendered, and held, one at a time).
for (const backend of backends()) {
  t.test(`${backend}: scrapes that come at once are admitted against the room those before them will take`, async (t) => {
    const surface = bigSurface(t, backend, { maxScrapeBytes: 20 * 2 ** 20 })
    const server = await surface.listen({ port: 0 })
    const size = (await get(server.port, '/metrics')).bytes // measured: what a scrape will hold
    t.ok(size > 11e6 && size < 16e6, `one body (${(size / 1e6).toFixed(1)} MB) fits 20 MiB, two do not`)
    const clients = await Promise.all(Array.from({ length: 6 }, () => stalledClient(server.port)))
    t.teardown(() => clients.forEach((c) => c.socket.destroy()))
    const statuses = clients.map((c) => c.status).sort()
    t.same(statuses, [200, 503, 503, 503, 503, 503], `six at once: one body, five refused (${statuses.join(' ')})`)
  })
}

// A body larger than maxScrapeBytes alone: the bound is on bodies held together. It used to take
// the last body's size as the next one's and refuse every scrape after the first, for good (no
// scrape was rendered to learn otherwise): plain ones with the scrape thread, gzip ones without it.
for (const backend of backends()) {
  for (const scrapeThread of [true, false]) {
    t.test(`${backend}, scrape thread ${scrapeThread ? 'on' : 'off'}: a body larger than maxScrapeBytes is served alone, scrape after scrape`, async (t) => {
      const surface = bigSurface(t, backend, { maxScrapeBytes: 65536, scrapeThread })
      const server = await surface.listen({ port: 0 })
      const gzip = { 'Accept-Encoding': 'gzip' }
      const answers = []
      for (const headers of [{}, gzip, {}, gzip, gzip, {}]) answers.push(await request(server.port, { path: '/metrics', headers, keepBody: false }))
      t.same(answers.map((a) => a.status), [200, 200, 200, 200, 200, 200], 'plain and gzip, one after another')
      t.ok(answers.every((a) => a.bytes > 65536), `every body is over the bound (${answers.map((a) => (a.bytes / 1e6).toFixed(1)).join(', ')} MB)`)
      t.same(answers.map((a) => a.headers['content-encoding'] ?? 'plain'), ['plain', 'gzip', 'plain', 'gzip', 'gzip', 'plain'])
      // While a client that stopped reading holds one, no other body fits until it is cut (2 s).
      const stalled = await stalledClient(server.port)
      t.teardown(() => stalled.socket.destroy())
      t.equal(stalled.status, 200, 'a client that stops reading is served too')
      t.equal((await request(server.port, { path: '/metrics', headers: gzip, keepBody: false })).status, 503, 'with it holding its body, a scrape waits')
      await new Promise((resolve) => setTimeout(resolve, 2100))
      t.equal((await request(server.port, { path: '/metrics', headers: gzip, keepBody: false })).status, 200, 'the stalled client is cut, and the scrape served')
    })
  }
}

t.test('past maxConnections, a request gets a fast JSON 503 with Retry-After', async (t) => {
  const surface = surfaceOn(t, 'js', {}, { maxConnections: 3 })
  const server = await surface.listen({ port: 0 })
  const idle = []
  t.teardown(() => idle.forEach((s) => s.destroy()))
  for (let i = 0; i < 3; i++) {
    const socket = net.connect(server.port, '127.0.0.1')
    await new Promise((resolve) => socket.once('connect', resolve))
    idle.push(socket)
  }
  await new Promise((resolve) => setTimeout(resolve, 50)) // the server has counted them
  const answer = await new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port: server.port, path: '/healthz', agent: false }, (res) => {
      let body = ''
      res.on('data', (c) => (body += c))
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }))
    }).on('error', reject)
  })
  t.equal(answer.status, 503)
  t.equal(answer.headers['retry-after'], '1')
  t.equal(JSON.parse(answer.body).error.code, 'TOO_MANY_CONNECTIONS')
  idle.forEach((s) => s.destroy())
  await new Promise((resolve) => setTimeout(resolve, 50))
  t.equal((await new Promise((resolve) => http.get({ host: '127.0.0.1', port: server.port, path: '/healthz', agent: false }, (res) => { res.resume(); resolve(res.statusCode) }))), 200, 'served again once connections closed')
})

// A connection answered with a raw error (here a 400 for bytes that are not HTTP; a slowloris gets
// its 408 the same way) whose client neither reads nor closes used to keep its maxConnections slot
// until the 30 s idle timeout; it is closed a second after the answer.
t.test('a client that never reads its error answer gives its connection back within seconds', async (t) => {
  const surface = surfaceOn(t, 'js', {}, { maxConnections: 1 })
  const server = await surface.listen({ port: 0 })
  const silent = net.connect(server.port, '127.0.0.1', () => silent.write('THIS IS NOT HTTP\r\n\r\n'))
  silent.pause() // never reads, never ends its side
  silent.on('error', () => {})
  t.teardown(() => silent.destroy())
  await new Promise((resolve) => silent.once('connect', resolve))
  await new Promise((resolve) => setTimeout(resolve, 100)) // answered: the server has sent its 400
  const probe = () => new Promise((resolve) => http.get({ host: '127.0.0.1', port: server.port, path: '/healthz', agent: false }, (res) => { res.resume(); resolve(res.statusCode) }).on('error', () => resolve(0)))
  t.equal(await probe(), 503, 'the one connection allowed is still held just after the answer')
  const started = Date.now()
  let status = 0
  while (status !== 200 && Date.now() - started < 5_000) {
    await new Promise((resolve) => setTimeout(resolve, 200))
    status = await probe()
  }
  t.equal(status, 200, `a probe is served again after ${((Date.now() - started) / 1000).toFixed(1)} s (it was 10 s for this 400, and 40 s for a slowloris's 408)`)
})
