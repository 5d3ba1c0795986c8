'use strict'
// The HTTP surface (design §7) with a fake HttpHost: the status table, headers, gzip, auth, the
// mounted handler in a broker-owned server, the disabled surface, bad requests and close().
// Run `npx tsc -p tsconfig.json` first. Every server binds 127.0.0.1 port 0 and is closed.
const t = require('tap')
const fs = require('node:fs')
const http = require('node:http')
const net = require('node:net')
const path = require('node:path')
const zlib = require('node:zlib')
const { createHandler, listen, acceptsGzip, MAX_URL_LENGTH } = require('../dist/http/server.js')
const { METRICS_CONTENT_TYPE } = require('../dist/exposition/allowlist.js')
const { request: httpRequest } = require('./helpers')

const JSON_TYPE = 'application/json; charset=utf-8'
// A real exposition (hand-reviewed golden file), large enough to be worth compressing.
const METRICS_BODY = fs.readFileSync(path.join(__dirname, 'golden', 'busy.prom'))

function fakeHost(overrides = {}) {
  return {
    enabled: true,
    authToken: undefined,
    metricsBody: () => METRICS_BODY,
    healthz: () => ({ statusCode: 200, body: { status: 'healthy', quorum_state: 0, leader_epoch: 2n ** 60n } }),
    stats: (query) => query.get('filter') === null
      ? { statusCode: 400, body: { error: { code: 'MISSING_FILTER', message: 'filter is required' } } }
      : { statusCode: 200, body: { filter: query.get('filter'), topic: query.get('topic') } },
    ...overrides,
  }
}

/** A raw TCP connection to `port`, connected: what it has received so far, and its close. */
async function rawConnection(port) {
  const socket = net.connect(port, '127.0.0.1')
  let received = ''
  socket.on('data', (chunk) => (received += chunk))
  socket.on('error', () => {})
  const closed = new Promise((resolve) => socket.on('close', resolve))
  await new Promise((resolve) => socket.on('connect', resolve))
  return { socket, received: () => received, closed }
}

async function serve(t, host) {
  const server = await listen(host, { port: 0, host: '127.0.0.1' })
  t.teardown(() => server.close())
  return server
}

/** One request on its own connection: { status, headers, body (Buffer) }. */
const request = (url, options) => httpRequest(url, options)

/** Raw bytes on a socket, resolving with everything the server sent before closing. */
function raw(port, text, { timeoutMs = 20_000 } = {}) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1')
    const chunks = []
    const timer = setTimeout(() => { socket.destroy(); reject(new Error('server did not close the socket')) }, timeoutMs)
    socket.on('data', (chunk) => chunks.push(chunk))
    socket.on('error', () => {}) // a reset after the answer is fine; the answer is what we check
    socket.on('close', () => { clearTimeout(timer); resolve(Buffer.concat(chunks).toString('latin1')) })
    socket.write(text)
  })
}

function errorCode(response) {
  return JSON.parse(response.body.toString('utf8')).error.code
}

t.test('status table of the standalone server', async (t) => {
  const server = await serve(t, fakeHost())
  t.match(server.url, /^http:\/\/127\.0\.0\.1:\d+$/, 'url names the bound address and port')
  t.equal(server.host, '127.0.0.1')
  const table = [
    // [what, request, status, content type, error code or null]
    ['GET /metrics', { path: '/metrics' }, 200, METRICS_CONTENT_TYPE, null],
    ['GET /metrics with a query string', { path: '/metrics?debug=1' }, 200, METRICS_CONTENT_TYPE, null],
    ['GET /healthz', { path: '/healthz' }, 200, JSON_TYPE, null],
    ['GET /stats?filter=topics', { path: '/stats?filter=topics' }, 200, JSON_TYPE, null],
    ['GET /stats without filter (the host answers 400)', { path: '/stats' }, 400, JSON_TYPE, 'MISSING_FILTER'],
    ['GET /nope', { path: '/nope' }, 404, JSON_TYPE, 'NOT_FOUND'],
    ['GET / ', { path: '/' }, 404, JSON_TYPE, 'NOT_FOUND'],
    ['GET /metrics/ (paths match exactly)', { path: '/metrics/' }, 404, JSON_TYPE, 'NOT_FOUND'],
    ['GET /METRICS (paths are case-sensitive)', { path: '/METRICS' }, 404, JSON_TYPE, 'NOT_FOUND'],
    ['POST /metrics', { method: 'POST', path: '/metrics' }, 405, JSON_TYPE, 'METHOD_NOT_ALLOWED'],
    ['PUT /healthz', { method: 'PUT', path: '/healthz' }, 405, JSON_TYPE, 'METHOD_NOT_ALLOWED'],
    ['DELETE /stats', { method: 'DELETE', path: '/stats?filter=topics' }, 405, JSON_TYPE, 'METHOD_NOT_ALLOWED'],
    ['OPTIONS /metrics', { method: 'OPTIONS', path: '/metrics' }, 405, JSON_TYPE, 'METHOD_NOT_ALLOWED'],
    ['GET /metrics with a body', { path: '/metrics', headers: { 'Content-Length': '5' }, body: 'hello' }, 413, JSON_TYPE, 'BODY_NOT_ALLOWED'],
    ['POST /metrics with a body (the method is what is wrong)', { method: 'POST', path: '/metrics', headers: { 'Content-Length': '3' }, body: 'a=1' }, 405, JSON_TYPE, 'METHOD_NOT_ALLOWED'],
    ['GET /stats with a chunked body', { path: '/stats?filter=topics', headers: { 'Transfer-Encoding': 'chunked' }, body: 'x' }, 413, JSON_TYPE, 'BODY_NOT_ALLOWED'],
    ['GET /stats with a URL over 8 KiB', { path: '/stats?filter=' + 'x'.repeat(MAX_URL_LENGTH) }, 414, JSON_TYPE, 'URI_TOO_LONG'],
    ['GET /elsewhere with a URL over 8 KiB', { path: '/elsewhere?' + 'x'.repeat(MAX_URL_LENGTH) }, 414, JSON_TYPE, 'URI_TOO_LONG'],
  ]
  for (const [what, options, status, type, code] of table) {
    const response = await request(server.url, options)
    t.equal(response.status, status, `${what}: status ${status}`)
    t.equal(response.headers['content-type'], type, `${what}: Content-Type exactly ${type}`)
    t.equal(response.headers['cache-control'], 'no-store', `${what}: Cache-Control: no-store`)
    t.equal(Number(response.headers['content-length']), response.body.length, `${what}: Content-Length is the body's length`)
    if (code !== null) t.equal(errorCode(response), code, `${what}: JSON error ${code}`)
    if (status === 405) t.equal(response.headers.allow, 'GET, HEAD', `${what}: Allow: GET, HEAD`)
    if (options.body !== undefined) t.equal(response.headers.connection, 'close', `${what}: the unread body closes the connection`)
  }

  const metrics = await request(server.url, { path: '/metrics' })
  t.ok(metrics.body.equals(METRICS_BODY), 'the /metrics body is the host\'s exposition, unchanged')
  t.equal(metrics.headers.vary, 'Accept-Encoding', '/metrics varies on Accept-Encoding')
  const healthz = await request(server.url, { path: '/healthz' })
  t.equal(healthz.body.toString(), '{"status":"healthy","quorum_state":0,"leader_epoch":1152921504606846976}', 'JSON keeps bigints exact')
  const stats = await request(server.url, { path: '/stats?filter=topics&topic=a%20b%2Fc' })
  t.same(JSON.parse(stats.body), { filter: 'topics', topic: 'a b/c' }, 'the query string reaches the host decoded')
})

t.test('HEAD: the same status and headers as GET, no body', async (t) => {
  const server = await serve(t, fakeHost({ authToken: 'tok' }))
  for (const [target, headers] of [['/metrics', { Authorization: 'Bearer tok' }], ['/healthz', { Authorization: 'Bearer tok' }], ['/stats', { Authorization: 'Bearer tok' }], ['/metrics', {}], ['/nope', {}]]) {
    const get = await request(server.url, { path: target, headers })
    const head = await request(server.url, { method: 'HEAD', path: target, headers })
    t.equal(head.status, get.status, `HEAD ${target} (${headers.Authorization ? 'token' : 'no token'}): status ${get.status} like GET`)
    t.equal(head.body.length, 0, `HEAD ${target}: no body`)
    for (const name of ['content-type', 'content-length', 'cache-control', 'www-authenticate', 'vary']) {
      t.equal(head.headers[name], get.headers[name], `HEAD ${target}: ${name} as GET has it`)
    }
  }
})

t.test('metrics_auth_token: Bearer token on every endpoint', async (t) => {
  const server = await serve(t, fakeHost({ authToken: 's3cret-token' }))
  const table = [
    [undefined, 401, 'no Authorization header'],
    ['Bearer wrong-token!', 401, 'a wrong token of the same length'],
    ['Bearer s3cret', 401, 'a prefix of the token'],
    ['Bearer s3cret-token-and-more', 401, 'the token with more after it'],
    ['Basic czNjcmV0LXRva2Vu', 401, 'another scheme'],
    ['Bearer', 401, 'the scheme alone'],
    ['Bearer ', 401, 'an empty token'],
    ['s3cret-token', 401, 'the token without a scheme'],
    ['Bearer s3cret-token', 200, 'the right token'],
    ['bearer s3cret-token', 200, 'the scheme is case-insensitive (RFC 7235)'],
    ['Bearer   s3cret-token ', 200, 'extra spaces around the token'],
  ]
  for (const target of ['/metrics', '/healthz', '/stats?filter=quorum']) {
    for (const [authorization, status, why] of table) {
      const headers = authorization === undefined ? {} : { Authorization: authorization }
      const response = await request(server.url, { path: target, headers })
      t.equal(response.status, status, `${target}, ${why}: ${status}`)
      if (status === 401) {
        t.equal(response.headers['www-authenticate'], 'Bearer', `${target}, ${why}: WWW-Authenticate: Bearer`)
        t.equal(errorCode(response), 'UNAUTHORIZED', `${target}, ${why}: JSON error UNAUTHORIZED`)
        t.notOk(response.body.toString().includes('s3cret'), `${target}, ${why}: the answer never echoes the token`)
      }
    }
  }
})

t.test('gzip: level-1 compression when the client accepts it', async (t) => {
  const server = await serve(t, fakeHost())
  const table = [
    ['gzip', true],
    ['gzip, deflate, br', true],
    ['GZIP', true],
    ['x-gzip', true],
    ['br;q=1.0, gzip;q=0.5', true],
    ['*', true],
    ['gzip;q=0', false],
    ['gzip; q=0.000', false],
    ['*, gzip;q=0', false],
    ['*;q=0', false],
    ['identity', false],
    ['deflate, br', false],
    ['gzip;q=2', false],
    ['gzip;q=abc', false],
    ['', false],
  ]
  for (const [accept, compressed] of table) t.equal(acceptsGzip(accept), compressed, `acceptsGzip(${JSON.stringify(accept)}) is ${compressed}`)
  t.equal(acceptsGzip(undefined), false, 'no Accept-Encoding: no gzip')

  for (const [accept, compressed] of table) {
    const response = await request(server.url, { path: '/metrics', headers: { 'Accept-Encoding': accept } })
    t.equal(response.status, 200, `${JSON.stringify(accept)}: 200`)
    t.equal(response.headers['content-type'], METRICS_CONTENT_TYPE, `${JSON.stringify(accept)}: Content-Type unchanged by compression`)
    t.equal(response.headers.vary, 'Accept-Encoding', `${JSON.stringify(accept)}: Vary: Accept-Encoding`)
    t.equal(Number(response.headers['content-length']), response.body.length, `${JSON.stringify(accept)}: Content-Length of the bytes sent`)
    if (compressed) {
      t.equal(response.headers['content-encoding'], 'gzip', `${JSON.stringify(accept)}: Content-Encoding: gzip`)
      t.ok(zlib.gunzipSync(response.body).equals(METRICS_BODY), `${JSON.stringify(accept)}: gunzip gives back the exact exposition`)
      t.ok(response.body.length < METRICS_BODY.length / 2, `${JSON.stringify(accept)}: and it is smaller`)
    } else {
      t.equal(response.headers['content-encoding'], undefined, `${JSON.stringify(accept)}: not compressed`)
      t.ok(response.body.equals(METRICS_BODY), `${JSON.stringify(accept)}: the plain exposition`)
    }
  }
  const head = await request(server.url, { method: 'HEAD', path: '/metrics', headers: { 'Accept-Encoding': 'gzip' } })
  const get = await request(server.url, { path: '/metrics', headers: { 'Accept-Encoding': 'gzip' } })
  t.equal(head.headers['content-length'], get.headers['content-length'], 'HEAD with gzip: Content-Length of the compressed body')
  const big = 'x'.repeat(4096)
  const stats = await (async () => {
    const s = await serve(t, fakeHost({ stats: () => ({ statusCode: 200, body: { filter: 'topics', big } }) }))
    return request(s.url, { path: '/stats?filter=topics', headers: { 'Accept-Encoding': 'gzip' } })
  })()
  t.equal(stats.headers['content-encoding'], 'gzip', 'a large JSON answer is compressed too')
  t.same(JSON.parse(zlib.gunzipSync(stats.body)), { filter: 'topics', big }, 'and gunzips to the same JSON')
  const healthz = await request(server.url, { path: '/healthz', headers: { 'Accept-Encoding': 'gzip' } })
  t.equal(healthz.headers['content-encoding'], undefined, 'a small JSON answer is sent as it is')
})

t.test('mounted in a broker-owned server: unknown paths are left to the broker', async (t) => {
  const handler = createHandler(fakeHost({ authToken: 'tok' }))
  const broker = http.createServer((req, res) => {
    if (handler(req, res)) return
    // The broker's own routes and its own 404; the handler must not have touched `res`.
    const untouched = !res.headersSent && res.getHeaderNames().length === 0 && res.statusCode === 200
    if (req.url.split('?')[0] === '/admin/ping') {
      res.end(`pong untouched=${untouched}`)
    } else {
      res.statusCode = 404
      res.end(`broker 404 untouched=${untouched}`)
    }
  })
  await new Promise((resolve) => broker.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise((resolve) => { broker.closeAllConnections(); broker.close(resolve) }))
  const url = `http://127.0.0.1:${broker.address().port}`

  const metrics = await request(url, { path: '/metrics', headers: { Authorization: 'Bearer tok' } })
  t.equal(metrics.status, 200, '/metrics is served by the handler')
  t.ok(metrics.body.equals(METRICS_BODY), 'with the exposition')
  t.equal((await request(url, { path: '/metrics' })).status, 401, '/metrics without the token: 401 from the handler')
  t.equal((await request(url, { method: 'POST', path: '/healthz' })).status, 405, 'POST /healthz: 405 from the handler')
  const ping = await request(url, { path: '/admin/ping' })
  t.equal(ping.body.toString(), 'pong untouched=true', 'the broker\'s own route works, res untouched')
  const missing = await request(url, { path: '/nope' })
  t.equal(missing.status, 404, 'unknown path: the broker\'s 404')
  t.equal(missing.body.toString(), 'broker 404 untouched=true', 'the broker\'s own 404 body, res untouched')
  const long = await request(url, { path: '/admin/ping?' + 'x'.repeat(MAX_URL_LENGTH) })
  t.equal(long.body.toString(), 'pong untouched=true', 'a long URL on a broker route is the broker\'s business')
})

t.test('metrics_enabled: false serves nothing and opens no port', async (t) => {
  const host = fakeHost({
    enabled: false,
    metricsBody: () => { throw new Error('must not render') },
  })
  const handler = createHandler(host)
  const untouchable = new Proxy({}, { get: (_, name) => { throw new Error(`res.${String(name)} touched`) } })
  for (const target of ['/metrics', '/healthz', '/stats?filter=topics', '/nope']) {
    t.equal(handler({ method: 'GET', url: target, headers: {} }, untouchable), false, `handler returns false for ${target}`)
  }
  const originalListen = net.Server.prototype.listen
  let listens = 0
  net.Server.prototype.listen = function (...args) { listens++; return originalListen.apply(this, args) }
  try {
    await t.rejects(listen(host, { port: 0 }), { code: 'METRICS_DISABLED', message: /metrics_enabled is false/ }, 'listen rejects with METRICS_DISABLED')
  } finally {
    net.Server.prototype.listen = originalListen
  }
  t.equal(listens, 0, 'no server was asked to listen')
})

t.test('a throwing host answers 500 and the server keeps serving', async (t) => {
  const reported = []
  let fail = true
  const server = await serve(t, fakeHost({
    metricsBody: () => { if (fail) throw new Error('renderer exploded'); return METRICS_BODY },
    healthz: () => { throw 'not even an Error' }, // eslint-disable-line no-throw-literal
    stats: () => ({ statusCode: 200, body: undefined }), // toJSON(undefined) is not JSON
    reportError: (error) => reported.push(error),
  }))
  const metrics = await request(server.url, { path: '/metrics' })
  t.equal(metrics.status, 500, '/metrics: 500 when the host throws')
  t.equal(metrics.headers['content-type'], JSON_TYPE, 'as JSON')
  t.same(JSON.parse(metrics.body), { error: { code: 'INTERNAL', message: 'internal error: renderer exploded' } }, 'naming the failure')
  t.equal((await request(server.url, { path: '/healthz' })).status, 500, '/healthz: 500 for a thrown non-Error')
  t.equal((await request(server.url, { path: '/stats?filter=topics' })).status, 500, '/stats: 500 for a body that is not JSON')
  t.equal(reported.length, 3, 'each failure reached host.reportError')
  fail = false
  t.equal((await request(server.url, { path: '/metrics' })).status, 200, 'the next scrape succeeds: nothing crashed or stalled')
})

t.test('a /healthz answered later (a promise): a body that is not JSON is a 500, never an unhandled rejection', async (t) => {
  const reported = []
  const circular = {}
  circular.self = circular
  const server = await serve(t, fakeHost({
    healthz: () => Promise.resolve({ statusCode: 200, body: circular }),
    reportError: (error) => reported.push(error),
  }))
  const res = await request(server.url, { path: '/healthz' })
  t.equal(res.status, 500)
  t.match(reported, [{ message: /circular/i }], 'reported to the host')
  t.equal((await request(server.url, { path: '/stats?filter=topics' })).status, 200, 'the server still answers')
})

t.test('a bad request pipelined behind one whose answer is still being made: that answer goes out whole, then the error, then the connection closes; nothing more is read meanwhile', async (t) => {
  let release
  const server = await serve(t, fakeHost({ healthz: () => new Promise((resolve) => { release = () => resolve({ statusCode: 200, body: { ok: true } }) }) }))
  const warnings = []
  const onWarning = (warning) => warnings.push(warning.name)
  process.on('warning', onWarning)
  t.teardown(() => process.off('warning', onWarning))
  const { socket, received, closed } = await rawConnection(server.port)
  socket.write('GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n')
  for (let i = 0; i < 100 && release === undefined; i++) await new Promise((resolve) => setTimeout(resolve, 5))
  socket.write('BOGUS\x01 / HTTP/1.1\r\n\r\n')
  socket.setNoDelay(true)
  for (let i = 0; i < 30; i++) { // each a packet, each a parse error were it read
    socket.write(`more ${i}\r\n`)
    await new Promise((resolve) => setTimeout(resolve, 3))
  }
  await new Promise((resolve) => setTimeout(resolve, 100))
  t.equal(received(), '', 'nothing written before the pending answer')
  release()
  await closed
  t.match(received(), /^HTTP\/1\.1 200 OK\r\n[^]*\r\n\r\n\{"ok":true\}HTTP\/1\.1 400 Bad Request\r\n[^]*Connection: close\r\n\r\n\{"error":\{"code":"BAD_REQUEST",[^]*\}\}$/, 'the pending answer, whole, then the JSON 400, then the close')
  await new Promise((resolve) => setImmediate(resolve))
  t.same(warnings, [], 'no warning (a listener per packet would be MaxListenersExceededWarning)')
})

t.test('good requests pipelined before a bad one are all answered, in order, before its error', async (t) => {
  // Only the response then on the socket went out: the good requests queued behind it were
  // dropped without a word, and the bad one got no answer either.
  let release
  const server = await serve(t, fakeHost({ metricsBody: () => new Promise((resolve) => { release = () => resolve(METRICS_BODY) }) }))
  for (const [bad, code, status] of [['BLAH\x00\x01 garbage\r\n\r\n', 'BAD_REQUEST', '400 Bad Request'], ['FOO /metrics HTTP/1.1\r\nHost: a\r\n\r\n', 'METHOD_NOT_ALLOWED', '405 Method Not Allowed']]) {
    const { socket, received, closed } = await rawConnection(server.port)
    release = undefined
    socket.write('GET /metrics HTTP/1.1\r\nHost: a\r\n\r\nGET /healthz HTTP/1.1\r\nHost: a\r\n\r\nGET /stats?filter=topics HTTP/1.1\r\nHost: a\r\n\r\n' + bad)
    for (let i = 0; i < 200 && release === undefined; i++) await new Promise((resolve) => setTimeout(resolve, 5))
    t.ok(release !== undefined, 'the /metrics answer is being made')
    await new Promise((resolve) => setTimeout(resolve, 50))
    release()
    await closed
    const statuses = [...received().matchAll(/HTTP\/1\.1 (\d{3} [A-Za-z ]+)\r\n/g)].map((m) => m[1])
    t.same(statuses, ['200 OK', '200 OK', '200 OK', status], `${code}: /metrics, /healthz and /stats answered in order, then the error`)
    t.ok(received().includes(METRICS_BODY.toString('latin1')), 'the /metrics body whole')
    t.match(received(), new RegExp(`\\{"error":\\{"code":"${code}"`), `then the ${code} JSON`)
  }
})

t.test('a /metrics body the host renders in slices (a promise) is served like one given at once', async (t) => {
  // If this failed, a large scrape (rendered over several event-loop turns) would be lost, sent
  // without gzip or Content-Length, or a failed render would hang the request instead of a 500.
  let fail = false
  const reported = []
  const later = () => new Promise((resolve, reject) => setImmediate(() => (fail ? reject(new Error('slice exploded')) : resolve(METRICS_BODY))))
  const server = await serve(t, fakeHost({ metricsBody: later, reportError: (e) => reported.push(e.message) }))
  const plain = await request(server.url, { path: '/metrics' })
  t.equal(plain.status, 200)
  t.equal(plain.headers['content-type'], METRICS_CONTENT_TYPE)
  t.equal(Number(plain.headers['content-length']), METRICS_BODY.length, 'Content-Length of the whole body')
  t.ok(plain.body.equals(METRICS_BODY), 'the body as rendered')
  const gz = await request(server.url, { path: '/metrics', headers: { 'Accept-Encoding': 'gzip' } })
  t.equal(gz.headers['content-encoding'], 'gzip', 'compressed when accepted')
  t.ok(zlib.gunzipSync(gz.body).equals(METRICS_BODY), 'and gunzips to the body')
  const head = await request(server.url, { method: 'HEAD', path: '/metrics' })
  t.equal(head.headers['content-length'], plain.headers['content-length'], 'HEAD: the same Content-Length, no body')
  t.equal(head.body.length, 0)
  fail = true
  const failed = await request(server.url, { path: '/metrics' })
  t.equal(failed.status, 500, 'a rejected render answers 500')
  t.same(reported, ['slice exploded'], 'and is reported to the host')
  fail = false
  t.equal((await request(server.url, { path: '/metrics' })).status, 200, 'the next scrape succeeds')
})

t.test('an answer prepared for longer than the idle timeout is still given; the timeout applies again to its writing', async (t) => {
  // A broker's own server with a 300 ms idle timeout: a body the host takes 900 ms to give (a
  // render paced on the scrape thread, as a 553 MB body takes ~20 s against our 30 s) must not be
  // cut while the client, rightly, just waits for it.
  const IDLE_MS = 300
  const slowly = (value, ms = 3 * IDLE_MS) => () => new Promise((resolve) => setTimeout(resolve, ms, value))
  let body = METRICS_BODY
  const handler = createHandler(fakeHost({
    metricsBody: () => slowly(body)(),
    stats: slowly({ statusCode: 200, body: { filter: 'topics', topics: [] } }, 6 * IDLE_MS),
  }))
  const broker = http.createServer((req, res) => {
    if (handler(req, res)) return
    if (req.url === '/export') { // the broker's own slow route, which sets its connection's idle timeout its way
      req.setTimeout(20 * IDLE_MS)
      setTimeout(() => res.end('exported'), 5 * IDLE_MS)
      return
    }
    res.statusCode = 404
    res.end()
  })
  broker.setTimeout(IDLE_MS)
  const closed = [] // the server's side of each connection, by its close
  broker.on('connection', (socket) => closed.push(new Promise((resolve) => socket.once('close', resolve))))
  await new Promise((resolve) => broker.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise((resolve) => { broker.closeAllConnections(); broker.close(resolve) }))
  const { port } = broker.address()
  const url = `http://127.0.0.1:${port}`

  const metrics = await request(url, { path: '/metrics' })
  t.equal(metrics.status, 200, '/metrics prepared for 3× the idle timeout: answered')
  t.ok(metrics.body.equals(METRICS_BODY), 'whole')
  const gz = await request(url, { path: '/metrics', headers: { 'Accept-Encoding': 'gzip' } })
  t.ok(zlib.gunzipSync(gz.body).equals(METRICS_BODY), 'gzip: answered whole')
  const stats = await request(url, { path: '/stats?filter=topics' })
  t.equal(stats.status, 200, '/stats prepared for 6× the idle timeout: answered')

  // Two requests pipelined on one connection, the second given 3× the idle timeout after the first
  // is written: the timeout stays off until the second is written, and both are answered in order.
  const pipelined = await rawConnection(port)
  pipelined.socket.write('GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /stats?filter=topics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n')
  await pipelined.closed
  const statuses = [...pipelined.received().matchAll(/^HTTP\/1\.1 (\d+)/gm)].map((m) => m[1])
  t.same(statuses, ['200', '200'], 'both pipelined answers came')
  t.match(pipelined.received(), /"topics":\[\]\}$/, 'the second whole, last')

  // The broker's own route pipelined behind /metrics sets the idle timeout its way: /metrics,
  // written first, leaves it so, and the route's answer, written later, is not cut.
  const mixed = await rawConnection(port)
  mixed.socket.write('GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /export HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n')
  await mixed.closed
  t.same([...mixed.received().matchAll(/^HTTP\/1\.1 (\d+)/gm)].map((m) => m[1]), ['200', '200'], 'a broker route behind /metrics is answered too')
  t.match(mixed.received(), /exported$/, 'whole, last')

  // Its writing is the client's turn again: a client that reads nothing of a 64 MiB body is cut by
  // the idle timeout, not kept until the end of time. (A paused client does not see the close: the
  // server's side of the connection tells.)
  body = Buffer.alloc(64 * 1024 * 1024, 0x61)
  const stalled = await rawConnection(port)
  stalled.socket.pause()
  stalled.socket.write('GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n')
  const started = Date.now()
  const cut = await Promise.race([closed.at(-1).then(() => true), new Promise((resolve) => setTimeout(resolve, 10_000, false))])
  stalled.socket.destroy()
  t.ok(cut, `a client that stops reading the body is cut (after ${Date.now() - started} ms)`)
})

t.test('bad requests never crash or stall the server', async (t) => {
  const server = await serve(t, fakeHost())
  const garbage = await raw(server.port, 'THIS IS NOT HTTP\r\n\r\n')
  t.match(garbage, /^HTTP\/1\.1 400 Bad Request\r\n/, 'unparseable request: 400')
  t.match(garbage, /\r\n\r\n\{"error":\{"code":"BAD_REQUEST"/, 'with a JSON error body')
  const huge = await raw(server.port, `GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: ${'y'.repeat(17 * 1024)}\r\n\r\n`)
  t.match(huge, /^HTTP\/1\.1 431 Request Header Fields Too Large\r\n/, 'headers over 16 KiB: 431')
  t.equal((await request(server.url, { path: '/healthz' })).status, 200, 'the server still answers')
})

t.test('slowloris: a client that never finishes its headers is cut off (headersTimeout 10 s)', async (t) => {
  const server = await serve(t, fakeHost())
  const started = Date.now()
  const answer = await raw(server.port, 'GET /metrics HTTP/1.1\r\nHost: x\r\n', { timeoutMs: 20_000 })
  const seconds = (Date.now() - started) / 1000
  t.match(answer, /^HTTP\/1\.1 408 Request Timeout\r\n/, '408 on the raw socket')
  t.ok(seconds >= 9 && seconds < 16, `closed after ${seconds.toFixed(1)} s (headersTimeout 10 s, checked every second; up to 5 s more for a loaded machine's timers)`)
})

t.test('listen: options, independence, close()', async (t) => {
  const host = fakeHost()
  await t.rejects(listen(host, { port: -1 }), RangeError, 'port -1: RangeError')
  await t.rejects(listen(host, { port: 65536 }), RangeError, 'port 65536: RangeError')
  await t.rejects(listen(host, { port: '80' }), TypeError, 'a string port: TypeError')
  await t.rejects(listen(host, { port: 0, host: '' }), TypeError, 'an empty host: TypeError')
  // What listen() refuses with (a server it opened instead is closed at once, and the test fails).
  const refusal = (options) => listen(host, options).then((server) => server.close().then(() => 'listened'), (error) => error)
  // api.md: a TypeError for a value that is not a number, a RangeError for a number out of range.
  t.match(await refusal({ port: 1.5 }), { name: 'RangeError', message: 'listen port must be an integer from 0 to 65535, got 1.5' }, 'a fractional port: RangeError')
  t.match(await refusal({ port: NaN }), { name: 'RangeError', message: /got NaN$/ }, 'port NaN: RangeError')
  // null is not "the default" (9464, 127.0.0.1), as in the configuration: leave the key out for that.
  t.match(await refusal({ port: null }), { name: 'TypeError', message: 'listen port must be an integer from 0 to 65535, got null' }, 'port null: TypeError')
  t.match(await refusal({ port: 0, host: null }), { name: 'TypeError', message: 'listen host must be a non-empty string, got null' }, 'host null: TypeError')
  // Own keys only, as the configuration reads them: an inherited port or host is not read.
  const inherited = await listen(host, Object.assign(Object.create({ host: '0.0.0.0' }), { port: 0 }))
  t.equal(inherited.host, '127.0.0.1', 'an inherited host is not read: the default is')
  await inherited.close()

  const a = await listen(host, { port: 0 })
  const b = await listen(host, { port: 0 })
  t.not(a.port, b.port, 'two listens on one host are two servers')
  t.equal(a.host, '127.0.0.1', 'default host 127.0.0.1')
  t.equal((await request(a.url, { path: '/healthz' })).status, 200, 'the first answers')
  t.equal((await request(b.url, { path: '/healthz' })).status, 200, 'the second answers')
  await t.rejects(listen(host, { port: a.port }), { code: 'EADDRINUSE' }, 'a taken port rejects with EADDRINUSE')

  // A keep-alive connection with no request in flight must not hold close() open.
  const agent = new http.Agent({ keepAlive: true })
  await new Promise((resolve, reject) => {
    http.get(a.url + '/healthz', { agent }, (res) => { res.resume(); res.on('end', resolve) }).on('error', reject)
  })
  const started = Date.now()
  await a.close()
  t.ok(Date.now() - started < 1000, 'close() does not wait for idle keep-alive sockets')
  await a.close()
  t.pass('close() is idempotent')
  await t.rejects(request(a.url, { path: '/healthz' }), { code: 'ECONNREFUSED' }, 'the port is closed')
  t.equal((await request(b.url, { path: '/healthz' })).status, 200, 'closing one server leaves the other running')
  await b.close()
  agent.destroy()
})

t.test('a request target in absolute form (RFC 9112 §3.2.2) is served like its path', async (t) => {
  const server = await serve(t, fakeHost())
  const ask = async (target) => {
    const answer = await raw(server.port, `GET ${target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`)
    const [head, body] = answer.split('\r\n\r\n')
    return { status: Number(head.split(' ')[1]), body }
  }
  const metrics = await ask(`http://127.0.0.1:${server.port}/metrics`)
  t.equal(metrics.status, 200, 'GET http://host:port/metrics: 200')
  t.equal(metrics.body, METRICS_BODY.toString('latin1'), 'with the exposition')
  t.equal((await ask('HTTP://x/healthz')).status, 200, 'the scheme is case-insensitive')
  const stats = await ask('http://x/stats?filter=topics&topic=a')
  t.same(JSON.parse(stats.body), { filter: 'topics', topic: 'a' }, 'the query string of an absolute target reaches the host')
  const missing = await ask('http://x/nope')
  t.equal(missing.status, 404, 'an unknown path is still 404')
  t.match(JSON.parse(missing.body).error.message, /no such path: \/nope;/, 'naming the path, not the whole target')
  t.equal((await ask('http://x')).status, 404, 'no path: /, which is not served')

  const { originForm } = require('../dist/http/server.js')
  t.same(
    ['/metrics', 'http://h:1/metrics?a', 'https://h/stats', 'http://h?q', 'http://h', '*', 'metrics', 'http:/h/metrics'].map(originForm),
    ['/metrics', '/metrics?a', '/stats', '/?q', '/', '*', 'metrics', 'http:/h/metrics'],
    'originForm keeps origin-form targets and anything that is not http(s)://authority as they are',
  )

  const handler = createHandler(fakeHost())
  const sent = []
  const res = { statusCode: 0, headersSent: false, destroyed: false, setHeader() {}, once() { return res }, on() { return res }, end(body) { sent.push(body) } }
  t.equal(handler({ url: 'http://x/healthz', method: 'GET', headers: {} }, res), true, 'a mounted handler serves an absolute target too')
  t.equal(handler({ url: 'http://x/admin', method: 'GET', headers: {} }, res), false, 'and leaves other paths to the broker')
})
