'use strict'
// A /metrics body longer than V8's longest string (2^29 − 24 characters): surface.render() is a
// RangeError that points to listen(), not V8's ERR_STRING_TOO_LONG, and GET /metrics still sends
// the whole body. About 2.5 GB of memory per backend, one backend at a time; together they take
// about 30 s, tap's default for a file run with plain node, so the file sets its own. The first
// byte comes ~20 s after the request (the render is paced on the scrape thread): past the socket's
// idle timeout on a loaded machine, which must not count while the broker prepares the answer.
const t = require('tap')
const http = require('node:http')
const { constants } = require('node:buffer')
const { backends, surfaceOn } = require('./helpers')

t.setTimeout(300_000)

const TOPICS = 42000 // × (a 1,004-character name, a 901-character group): a 553 MB body, 3% past the limit

for (const backend of backends()) {
  t.test(`${backend}: a body past the string limit`, async (t) => {
    const surface = surfaceOn(t, backend, { max_topics: TOPICS })
    const long = 'x'.repeat(1000)
    const group = 'g' + 'y'.repeat(900)
    for (let n = 0; n < TOPICS; n++) {
      const topic = surface.topic(long + n)
      topic.produced(0, 1, 1)
      topic.group(group)
    }
    t.throws(() => surface.render(), { name: 'RangeError', message: /longer than a JavaScript string can be.*listen\(\)/ })
    const { port } = await surface.listen({ port: 0, host: '127.0.0.1' })
    const bytes = await new Promise((resolve, reject) => {
      http.get({ host: '127.0.0.1', port, path: '/metrics' }, (res) => {
        let n = 0
        let last = ''
        res.on('data', (chunk) => { n += chunk.length; last = chunk.subarray(-200).toString('latin1') })
        res.on('end', () => resolve({ status: res.statusCode, n, last }))
      }).on('error', reject)
    })
    t.equal(bytes.status, 200)
    t.ok(bytes.n > constants.MAX_STRING_LENGTH, `GET /metrics sent all ${bytes.n} bytes`)
    t.match(bytes.last, /\n$/, 'ending with a complete line')
  })
}
