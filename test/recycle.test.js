'use strict'
// Issue 8: the /metrics output buffer is reused from one scrape to the next (a fresh 12 MB buffer
// per scrape cost full GCs under load) — but only once nothing can read the old body any more.
const t = require('tap')
const http = require('node:http')
const net = require('node:net')
const zlib = require('node:zlib')
const { listen } = require('../dist/http/server.js')
const { Renderer } = require('../dist/exposition/render.js')
const { backends, surfaceOn, shiftedDateNow } = require('./helpers')

/** Resolves once `predicate()` holds, polling every 10 ms; rejects after `ms`. */
async function until(ms, predicate, what = 'condition') {
  const deadline = Date.now() + ms
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`${what}: not true within ${ms} ms`)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

t.test('Renderer.recycle: a body\'s buffer serves the next render only once handed back', async (t) => {
  const { lib } = require('./helpers')
  const surface = lib.createSurface()
  t.teardown(() => surface.close())
  for (let i = 0; i < 400; i++) surface.topic(`t-${i}`).produced(0, i + 1, i)
  const snapshot = surface.snapshot()
  const renderer = new Renderer()
  renderer.render(snapshot) // sizes the next buffers
  const a = renderer.render(snapshot)
  t.ok(a.length >= 64 * 1024, `a body large enough to be recycled (${a.length} B)`)
  const b = renderer.render(snapshot)
  t.not(b.buffer, a.buffer, 'without recycle() every render gets a buffer of its own')
  t.same(b, a, 'same snapshot, same bytes')
  renderer.recycle(a)
  renderer.recycle(a) // a second call for the same body is ignored
  const c = renderer.render(snapshot)
  t.equal(c.buffer, a.buffer, 'the recycled buffer takes the next render')
  t.same(c, b)
  const d = renderer.render(snapshot)
  t.not(d.buffer, a.buffer, 'and only one render: the second recycle() of a was ignored')
  renderer.recycle(Buffer.alloc(1 << 20)) // not one of its own
  t.not(renderer.render(snapshot).buffer.byteLength, 1 << 20, 'a foreign buffer is never taken')
  const small = new Renderer()
  const empty = lib.createSurface()
  t.teardown(() => empty.close())
  const tiny = small.render(empty.snapshot())
  small.recycle(tiny)
  t.not(small.render(snapshot).buffer, tiny.buffer, 'a small body is never kept for reuse')
})

t.test('metricsSent: each body is handed back once, after gzip or after the socket took it', async (t) => {
  const big = Buffer.alloc(8 << 20, 'mq_x{topic="a"} 1\n')
  const sent = []
  let served = []
  const host = {
    enabled: true,
    authToken: undefined,
    metricsBody: () => {
      const body = Buffer.from(big)
      served.push(body)
      return body
    },
    metricsSent: (body) => sent.push(body),
    healthz: () => ({ statusCode: 200, body: {} }),
    stats: () => ({ statusCode: 200, body: {} }),
  }
  const server = await listen(host, { port: 0, host: '127.0.0.1' })
  t.teardown(() => server.close())
  const get = (headers = {}, method = 'GET') => new Promise((resolve, reject) => {
    http.request(`${server.url}/metrics`, { method, headers, agent: false }, (res) => {
      let bytes = 0
      res.on('data', (chunk) => (bytes += chunk.length))
      res.on('end', () => resolve(bytes))
    }).on('error', reject).end()
  })

  t.equal(await get(), big.length)
  await until(2000, () => sent.length === 1)
  t.equal(sent[0], served[0], 'identity: handed back after the response finished')
  t.ok(await get({ 'Accept-Encoding': 'gzip' }) < big.length)
  await until(2000, () => sent.length === 2)
  t.equal(sent[1], served[1], 'gzip: handed back once compressed')
  await get({}, 'HEAD')
  await until(2000, () => sent.length === 3)
  t.equal(sent[2], served[2], 'HEAD: the body was never written, handed back at once')

  // A client that stops reading: its body is still queued in the socket, so it is not handed back.
  served = []
  const socket = net.connect(server.port, '127.0.0.1')
  socket.pause()
  socket.write('GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n')
  await until(2000, () => served.length === 1)
  await new Promise((resolve) => setTimeout(resolve, 300))
  t.equal(sent.length, 3, 'a body the client has not taken is not handed back')
  let received = 0
  socket.on('data', (chunk) => (received += chunk.length))
  socket.resume()
  await until(5000, () => sent.length === 4)
  t.equal(sent[3], served[0], 'handed back once the socket took it all')
  // The kernel holds what the socket took until the client reads it: wait for that, not assume it.
  await until(5000, () => received >= big.length, 'the client reads the whole body')
  t.ok(received >= big.length, 'the client got every byte of the body handed back')
  socket.destroy()
})

for (const [backend, scrapeThread] of backends().flatMap((b) => [[b, false], [b, true]])) {
  t.test(`${backend}: a body still on its way to a slow client is never overwritten by later scrapes (${scrapeThread ? 'scrape thread' : 'main thread'})`, async (t) => {
    const { EventEmitter } = require('node:events')
    const surface = surfaceOn(t, backend, { max_in_flight: 1000 }, { scrapeThread })
    for (let i = 0; i < 1500; i++) {
      const topic = surface.topic(`topic-${i}`)
      for (let p = 0; p < 16; p++) topic.produced(p, 1000 + p, 10)
    }
    // A response whose socket has not taken the body yet: end() keeps the very Buffer it was
    // given and 'finish' comes only when the test says so (a real slow client, minus the kernel's
    // socket buffers, which on loopback absorb tens of MB).
    const slow = new EventEmitter()
    Object.assign(slow, { statusCode: 0, headersSent: false, destroyed: false, setHeader() {}, end(chunk) { this.body = chunk } })
    t.ok(surface.handler({ url: '/metrics', method: 'GET', headers: {} }, slow))
    await until(5000, () => slow.body !== undefined, 'the slow scrape')
    const copy = Buffer.from(slow.body)
    t.ok(copy.length > 64 * 1024, `a ${copy.length}-byte body`)

    // Later scrapes, with other numbers, identity and gzip, over a real server.
    for (let i = 0; i < 1500; i++) surface.topic(`topic-${i}`).append(0, 7)
    const server = await surface.listen({ port: 0, host: '127.0.0.1' })
    const fetch = (headers = {}) => new Promise((resolve, reject) => {
      http.get(`${server.url}/metrics`, { agent: false, headers }, (res) => {
        const chunks = []
        res.on('data', (chunk) => chunks.push(chunk))
        res.on('end', () => {
          const body = Buffer.concat(chunks)
          if (res.statusCode !== 200) return reject(new Error(`/metrics answered ${res.statusCode}`))
          resolve((res.headers['content-encoding'] === 'gzip' ? zlib.gunzipSync(body) : body).toString('latin1'))
        })
      }).on('error', reject)
    })
    const last = surface.topic('topic-0').lastSeq(0)
    for (let k = 0; k < 4; k++) {
      t.match(await fetch(k % 2 ? { 'Accept-Encoding': 'gzip' } : {}), `mq_partition_last_seq{topic="topic-0",partition="0"} ${last}\n`)
    }
    t.ok(slow.body.equals(copy), 'the unsent body is exactly as it was rendered')

    // Once its response finished, the same memory may take a later scrape (on the main thread it
    // does; the scrape thread keeps the largest body handed back to lend, here a later one: the cut
    // test below shows a body's memory lent to it).
    slow.emit('finish')
    await fetch()
    if (!scrapeThread) t.notOk(slow.body.equals(copy), 'after finish, the buffer was reused: the check above could fail')
  })

  t.test(`${backend}: the body of a client cut for never reading serves the next scrape (${scrapeThread ? 'scrape thread' : 'main thread'})`, async (t) => {
    const { EventEmitter } = require('node:events')
    // Room for one body only: the next scrape must cut the stalled client to render.
    const fill = (surface) => {
      for (let i = 0; i < 1200; i++) surface.topic(`topic-${i}`).produced(0, 1 + i, 10)
      return surface
    }
    const size = Buffer.byteLength(fill(surfaceOn(t, backend, {}, { scrapeThread: false })).render())
    const surface = fill(surfaceOn(t, backend, {}, { scrapeThread, maxScrapeBytes: Math.floor(size * 1.5) }))
    const stalled = () => {
      const res = new EventEmitter()
      // Its socket has taken nothing (bytes pending never go down); destroy() is the cut.
      Object.assign(res, { statusCode: 0, headersSent: false, destroyed: false, socket: { writableLength: 1 << 20 }, setHeader() {}, end(chunk) { this.body = chunk }, destroy() { this.destroyed = true; this.emit('close') } })
      // Node emits 'finish' on a destroyed response too (its canceled write completes): later.
      return res
    }
    const first = stalled()
    surface.handler({ url: '/metrics', method: 'GET', headers: {} }, first)
    await until(5000, () => first.body !== undefined, 'the first scrape')
    const copy = Buffer.from(first.body)
    t.ok(copy.length > 65536, `a ${copy.length}-byte body (the renderer recycles bodies over 64 KiB)`)
    // A scrape that finds no room looks at the stalled client (503), one 2 s later (the clock
    // moved on: Date.now, which the server reads, runs 2.1 s ahead from here) cuts it.
    const probe = stalled()
    surface.handler({ url: '/metrics', method: 'GET', headers: {} }, probe)
    await until(5000, () => probe.body !== undefined, 'the probe')
    t.equal(probe.statusCode, 503, 'no room yet: the stalled client has not been seen stalled for 2 s')
    shiftedDateNow(t, 2100)
    const second = stalled()
    surface.handler({ url: '/metrics', method: 'GET', headers: {} }, second)
    await until(5000, () => second.body !== undefined, 'the second scrape')
    t.ok(first.destroyed, 'the stalled client was cut to make room')
    t.equal(second.statusCode, 200, 'the second scrape is answered', { body: String(second.body).slice(0, 200) })
    t.match(second.body.toString('latin1'), 'mq_partition_last_seq{topic="topic-7",partition="0"} 8\n', 'the second body is a whole render')
    if (scrapeThread) t.equal(first.body.length, 0, 'the cut body\'s memory was lent to the scrape thread for the second')
    else t.equal(second.body.buffer, first.body.buffer, 'the cut body\'s memory took the second render')
    // The cut response's late 'finish' hands nothing back again: a render now must not take the
    // memory of the second body, which is still being written.
    const kept = Buffer.from(second.body)
    first.emit('finish')
    surface.render()
    t.ok(second.body.equals(kept), 'the second body is untouched by a render after the late finish')
  })
}

t.test('a client that reads a large body slowly keeps its response; one that stopped reading is cut', async (t) => {
  // Room for one 14 MB body. The kernel takes a few MB of it at once; the rest waits in the
  // socket's handle, where a slow reader's progress shows (the socket's writableLength does not
  // move until the whole write is done).
  const big = Buffer.alloc(14 << 20, 'mq_x{topic="a"} 1\n')
  const host = {
    enabled: true,
    authToken: undefined,
    limits: { maxConnections: 100, maxScrapeBytes: 20 << 20 },
    metricsBody: () => Buffer.from(big),
    healthz: () => ({ statusCode: 200, body: {} }),
    stats: () => ({ statusCode: 200, body: {} }),
  }
  const server = await listen(host, { port: 0, host: '127.0.0.1' })
  t.teardown(() => server.close())
  const status = () => new Promise((resolve, reject) => {
    http.get(`${server.url}/metrics`, { agent: false }, (res) => {
      res.resume()
      res.on('end', () => resolve(res.statusCode))
    }).on('error', reject)
  })
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
  /**
   * A raw client of /metrics that reads a chunk every 10 ms while it has fewer than `allowed` bytes
   * (`slow`; `allow(n)` moves the bound and reads on), or nothing after the status line. The test
   * says how far the slow reader gets, so how fast the machine reads cannot decide what a look sees.
   */
  const client = (slow) => {
    const socket = net.connect(server.port, '127.0.0.1')
    const state = { socket, received: 0, closed: false, allowed: 1, waiting: false }
    const next = () => {
      if (state.received < state.allowed) setTimeout(() => socket.resume(), 10)
      else state.waiting = true
    }
    state.allow = (bytes) => {
      state.allowed = bytes
      if (state.waiting) (state.waiting = false, next())
    }
    socket.write('GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n')
    socket.on('close', () => (state.closed = true))
    socket.on('error', () => {})
    socket.on('data', (chunk) => {
      state.received += chunk.length
      socket.pause()
      if (slow) next()
    })
    return state
  }

  // The slow reader reads 4 MB between the two looks, then nothing until the second: the kernel
  // takes bytes from the server's socket meanwhile, whatever it buffers. The second look comes
  // more than 2 s (STALLED_MS) after the first, so a look that missed the progress would cut it.
  const reader = client(true)
  await until(5000, () => reader.received > 0, 'the slow reader starts')
  await sleep(300)
  t.equal(await status(), 503, 'no room: the reader is looked at')
  const looked = Date.now()
  const mark = reader.received
  reader.allow(mark + (4 << 20))
  await until(20_000, () => reader.received >= mark + (4 << 20), 'the slow reader reads 4 MB more')
  t.ok(reader.received < big.length - (4 << 20), 'and has most of the body still to read')
  await sleep(Math.max(0, looked + 2200 - Date.now()))
  t.equal(await status(), 503, 'a reader that took bytes since the last look keeps its response')
  t.notOk(reader.closed, 'and its connection')
  reader.allow(Infinity)
  await until(20_000, () => reader.received >= big.length, 'the slow reader gets the whole body')
  reader.socket.destroy()

  const stopped = client(false)
  await until(5000, () => stopped.received > 0, 'the stopped client gets its status line')
  await sleep(300)
  t.equal(await status(), 503, 'no room: the stopped client is looked at')
  // The server's clock (Date.now) moves on, not the test's: the looks land 1 s and 2.1 s (plus
  // the moments the test itself takes) after the first, however slow the machine.
  let restore = shiftedDateNow(t, 1000)
  t.equal(await status(), 503, 'taking nothing for 1 s is not yet stalled')
  restore()
  restore = shiftedDateNow(t, 2100)
  t.equal(await status(), 200, 'a client that took nothing for 2 s is cut, and the scrape answered')
  restore()
  // It reads again: what the kernel had buffered, then the end of a connection the server closed.
  stopped.socket.removeAllListeners('data')
  stopped.socket.on('data', (chunk) => (stopped.received += chunk.length))
  stopped.socket.resume()
  await until(5000, () => stopped.closed, 'the cut client is closed')
  t.ok(stopped.received < big.length, 'the cut client did not get the whole body')
})

for (const backend of backends()) {
  t.test(`${backend}: after a spike in series, the scrape thread stops lending the spike's memory`, async (t) => {
    const { EventEmitter } = require('node:events')
    const surface = surfaceOn(t, backend, {}, { scrapeThread: true })
    for (let i = 0; i < 2000; i++) {
      const topic = surface.topic(`spike-${i}`)
      for (let p = 0; p < 8; p++) topic.produced(p, 1 + p, 10)
    }
    const steady = surface.topic('steady')
    steady.produced(0, 1, 10)
    // A scrape whose response finishes at once: its body's memory goes back to be lent again.
    const scrape = async () => {
      const res = new EventEmitter()
      Object.assign(res, { statusCode: 0, headersSent: false, destroyed: false, setHeader() {}, end(chunk) { this.body = chunk; setImmediate(() => this.emit('finish')) } })
      surface.handler({ url: '/metrics', method: 'GET', headers: {} }, res)
      await until(5000, () => res.body !== undefined, 'the scrape')
      t.equal(res.statusCode, 200)
      await new Promise((resolve) => setImmediate(resolve))
      return res.body
    }
    let body
    for (let k = 0; k < 3; k++) body = await scrape()
    const spike = body.buffer.byteLength
    t.ok(body.length > 1 << 20 && spike >= body.length, `spike: a ${body.length}-byte body in ${spike} bytes`)
    // Counters gain digits from scrape to scrape (1 → 10 → 100 → 1000 messages): the body grows by
    // a few bytes, and still fits the memory lent (allocated with room to grow, wherever it was).
    for (let k = 0, last = 1; k < 3; k++) {
      const next = 10 ** (k + 1)
      steady.produced(0, next, 10 * (next - last), next - last)
      last = next
      const grown = await scrape()
      t.ok(grown.length > body.length, `a longer body: ${grown.length} bytes after ${body.length}`)
      t.equal(grown.buffer.byteLength, spike, 'the same memory is lent scrape after scrape')
      body = grown
    }
    for (let i = 0; i < 2000; i++) surface.removeTopic(`spike-${i}`)
    const sizes = []
    for (let k = 0; k < 4; k++) {
      body = await scrape()
      sizes.push([body.length, body.buffer.byteLength])
    }
    t.ok(body.length < 64 * 1024, `the series are few again: a ${body.length}-byte body`)
    t.ok(body.buffer.byteLength <= 2 * body.length + 64 * 1024, `the memory lent now fits the body: ${body.buffer.byteLength} bytes (spike: ${spike}); body and memory per scrape: ${JSON.stringify(sizes)}`)
  })
}
