'use strict'
// Every error path answers as documented: a mounted handler after close(),
// a bad Expect header, and attachSurface() of something that is not a share().
const t = require('tap')
const http = require('node:http')
const net = require('node:net')
const { backends, surfaceOn, lib, request } = require('./helpers')

const get = (port, path, headers = {}) => request(port, { path, headers }).then((r) => ({ ...r, body: r.text }))

for (const backend of backends()) {
  t.test(`${backend}: a mounted handler answers 503 SURFACE_CLOSED after close(), as JSON`, async (t) => {
    // Before: 500 INTERNAL with the ClosedError's message on /metrics and /healthz.
    const surface = surfaceOn(t, backend)
    surface.topic('t').produced(0, 1, 1)
    const server = http.createServer((req, res) => {
      if (!surface.handler(req, res)) {
        res.statusCode = 404
        res.end('broker 404')
      }
    })
    await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
    t.teardown(() => new Promise((resolve) => server.close(resolve)))
    const port = server.address().port
    t.equal((await get(port, '/metrics')).status, 200, 'before close(): served')
    await surface.close()
    // A query the open surface refuses with 400 (no filter, an unknown view, an unknown or empty
    // parameter) is answered 503 too: the surface is gone, whatever was asked (it was 400).
    for (const path of ['/metrics', '/healthz', '/stats?filter=topics', '/stats', '/stats?filter=nope', '/stats?filter=topics&x=1', '/stats?filter=topics&topic=']) {
      const answer = await get(port, path)
      t.equal(answer.status, 503, `${path}: 503`)
      t.equal(answer.headers['content-type'], 'application/json; charset=utf-8')
      t.equal(JSON.parse(answer.body).error.code, 'SURFACE_CLOSED', `${path}: the code says why`)
    }
    t.equal((await get(port, '/other')).body, 'broker 404', 'the broker\'s own routes are untouched')
  })

  t.test(`${backend}: a request the surface fails to answer is a 500 INTERNAL, told to 'error' listeners only`, async (t) => {
    // Before: the 500 went out and the error was seen nowhere else (the host had no reporter).
    const stats = require(require('node:path').join(require('./helpers').dist, 'exposition', 'stats.js'))
    const real = stats.statsFromQueryLater // what /stats over HTTP calls
    stats.statsFromQueryLater = () => {
      throw new Error('a bug in a view')
    }
    t.teardown(() => (stats.statsFromQueryLater = real))
    const surface = surfaceOn(t, backend)
    const server = await surface.listen({ port: 0 })
    const quiet = await get(server.port, '/stats?filter=topics')
    t.equal(quiet.status, 500, 'no listener: answered 500, and the process goes on')
    t.same(JSON.parse(quiet.body).error, { code: 'INTERNAL', message: 'internal error: a bug in a view' })
    const errors = []
    surface.on('error', (error) => errors.push(error))
    const told = await get(server.port, '/stats?filter=topics')
    t.equal(told.status, 500)
    t.equal(errors.length, 1, 'the listener heard of it once')
    t.equal(errors[0].message, 'a bug in a view', 'the error itself')
    t.equal((await get(server.port, '/healthz')).status, 200, 'the other paths still answer')
    t.equal(errors.length, 1)
  })
}

t.test('an Expect header other than 100-continue gets a JSON 417', async (t) => {
  // Before: Node's own 417 with an empty body.
  const surface = surfaceOn(t, 'js')
  const server = await surface.listen({ port: 0 })
  const raw = await new Promise((resolve, reject) => {
    const socket = net.connect(server.port, '127.0.0.1', () => {
      socket.write('GET /metrics HTTP/1.1\r\nHost: x\r\nExpect: the-impossible\r\n\r\n')
    })
    let data = ''
    socket.on('data', (d) => (data += d))
    socket.on('end', () => resolve(data))
    socket.on('error', reject)
  })
  t.match(raw, /^HTTP\/1\.1 417 /)
  t.match(raw, /content-type: application\/json; charset=utf-8/i)
  const body = JSON.parse(raw.slice(raw.indexOf('\r\n\r\n') + 4))
  t.equal(body.error.code, 'EXPECTATION_FAILED')
  t.equal((await get(server.port, '/healthz', { Expect: '100-continue' })).status, 200, '100-continue is still met')
})

t.test('attachSurface() of anything but a share() is a TypeError saying what is wrong', async (t) => {
  // Before: "Cannot read properties of undefined" from deep inside.
  const surface = surfaceOn(t, 'js')
  const shared = surface.share()
  const cases = [
    [undefined, /got undefined/],
    [null, /got null/],
    [{}, /surface\.share\(\) returned/],
    [{ kind: 'mq-metrics/shared-surface' }, /version undefined is not 1/],
    [{ ...shared, version: 2 }, /version 2 is not 1/],
    [{ ...shared, arena: undefined }, /its arena is undefined/],
    [{ ...shared, arena: { backend: 'js' } }, /not a SharedArrayBuffer/],
    [{ ...shared, arena: { backend: 'js', buffer: new ArrayBuffer(8) } }, /not a SharedArrayBuffer/],
    [{ ...shared, arena: { backend: 'native', id: -1 } }, /native arena id is -1/],
    [{ ...shared, arena: { backend: 'gpu' } }, /arena backend is the string "gpu", not 'js' or 'native'/],
    [{ ...shared, arena: { ...shared.arena, doorbell: undefined } }, /its arena's doorbell is undefined, not a SharedArrayBuffer/],
    [{ ...shared, arena: { ...shared.arena, doorbell: new ArrayBuffer(4) } }, /doorbell is .*not a SharedArrayBuffer/],
    [{ ...shared, arena: { ...shared.arena, doorbell: new SharedArrayBuffer(2) } }, /doorbell is .*not a SharedArrayBuffer of 4 bytes/],
    [{ ...shared, config: null }, /its config is null/],
  ]
  for (const [argument, message] of cases) t.throws(() => lib.attachSurface(argument), { name: 'TypeError', message }, JSON.stringify(argument))
  t.equal(lib.attachSurface(shared).backend, 'js', 'the real thing attaches')
})

t.test('attachSurface() of a native share whose arena id no surface of this process ever had is a TypeError; of a closed one, ClosedError', async (t) => {
  if (!backends().includes('native')) return t.skip('the native core is not built')
  const surface = surfaceOn(t, 'native')
  const shared = surface.share()
  // Ids are handed out in order and never reused: one far above this surface's was never made.
  const forged = { ...shared, arena: { ...shared.arena, id: shared.arena.id + 1000 } }
  t.throws(() => lib.attachSurface(forged), { name: 'TypeError', message: new RegExp(`no native arena of this process has id ${shared.arena.id + 1000}.*another process`) })
  t.equal(lib.attachSurface(shared).backend, 'native', 'the real share attaches')
  const closed = surfaceOn(t, 'native')
  const closedShare = closed.share()
  await closed.close()
  t.throws(() => lib.attachSurface(closedShare), { name: 'ClosedError', code: 'SURFACE_CLOSED' }, 'a closed surface\'s share is still ClosedError')
})
