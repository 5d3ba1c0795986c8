'use strict'
// The JSON of /stats and /healthz (lib/core/json.ts): exact integers, and a /stats view written in
// slices. If this fails, a counter past 2^53 is rounded or a raw name changes on its way to JSON,
// or a large view is written in one hold of the broker's thread (it was: 25–48 ms for 20,000
// topics), or written in slices but not as the same text.
const t = require('tap')
const { toJSON, toJSONSliced, Listing, materialize } = require('../dist/core/json')
const { statsPlanOf, statsRequest, statsViewOf, STATS_VIEWS } = require('../dist/exposition/stats')
const { backends, surfaceOn, request } = require('./helpers')

/** A slicer whose clock moves one step per look: with holdMs 0, every source ends a slice. */
function countingSlicer() {
  let time = 0
  const slicer = { pauses: 0, now: () => time++, pause: async () => void slicer.pauses++ }
  return slicer
}

t.test('toJSON: bigints exact, both signs; a name cannot pass for one', async (t) => {
  t.equal(toJSON({ a: 2n ** 70n, b: -(2n ** 70n), c: [1n, { d: 3 }] }), '{"a":1180591620717411303424,"b":-1180591620717411303424,"c":[1,{"d":3}]}')
  // The mark a bigint becomes during stringify used to be a fixed string, which a raw name could hold.
  for (const name of ['\u0000bigint:5', '\u0000bigint:-5', 'bigint:5']) {
    t.equal(toJSON({ big: 2n ** 64n, name }), `{"big":18446744073709551616,"name":${JSON.stringify(name)}}`, `${JSON.stringify(name)} stays a string beside a bigint`)
  }
  t.equal(toJSON({ a: 1, b: 'x' }), JSON.stringify({ a: 1, b: 'x' }), 'no bigint: what JSON.stringify writes')
  t.equal(toJSON({ a: 2n }, 2), '{\n  "a": 2\n}', 'indented')
  const cycle = {}
  cycle.self = cycle
  t.throws(() => toJSON(cycle), TypeError, 'a cycle is still an error')
})

t.test('toJSONSliced writes what toJSON(materialize()) writes, a source at a time', async (t) => {
  const sources = [{ n: 0 }, { n: 1 }, { n: 2 }, { n: 3 }]
  const cases = {
    'a listing between plain fields': { filter: 'x', items: new Listing(sources, (s) => [{ n: s.n, big: 2n ** 60n + BigInt(s.n) }]), totals: { big: 2n ** 64n } },
    'sources with no entry, and with several': { items: new Listing(sources, (s) => (s.n % 2 === 0 ? [] : [s.n, -s.n])) },
    'every source empty': { items: new Listing(sources, () => []) },
    'no source': { items: new Listing([], () => [1]) },
    'undefined and function fields are left out, as JSON.stringify does': { a: undefined, items: new Listing(sources, (s) => [s.n]), f: () => 1, z: 'end' },
    'names JSON must escape': { items: new Listing(['quote"', 'back\\slash', '\n', '\u0000bigint:5', '\ud800'], (s) => [{ name: s }]) },
    'no listing': { a: 1, b: [1, 2] },
    'entries JSON writes as null in an array': { items: new Listing([1], () => [undefined, () => 1, Symbol('s'), 2]) },
  }
  for (const [what, value] of Object.entries(cases)) {
    const slicer = countingSlicer()
    const text = (await toJSONSliced(value, 0, slicer)).toString('utf8')
    t.equal(text, toJSON(materialize(value)), `${what}: the same text`)
    t.doesNotThrow(() => JSON.parse(text), `${what}: valid JSON`)
    const listing = Object.values(value).find((v) => v instanceof Listing)
    t.equal(slicer.pauses, listing === undefined ? 0 : listing.sources.length, `${what}: a pause after each source when every look passes the deadline`)
  }
  for (const plain of [null, 5, 'x', [1, new Listing([1], () => [1])]]) {
    t.equal((await toJSONSliced(plain, 0, countingSlicer())).toString(), toJSON(plain), `${JSON.stringify(plain)}: written whole`)
  }
  const slicer = countingSlicer()
  await toJSONSliced({ items: new Listing(sources, (s) => [s.n]) }, 1e9, slicer)
  t.equal(slicer.pauses, 0, 'no pause before the deadline')
  // A reader gone (a /stats client that disconnected): the rest is not built.
  const built = []
  const leaving = { ...countingSlicer(), gone: () => built.length >= 2 }
  const cut = await toJSONSliced({ items: new Listing(sources, (s) => (built.push(s.n), [s.n])) }, 0, leaving)
  t.equal(cut, undefined, 'nothing written for a reader gone')
  t.same(built, [0, 1], 'the sources after it went are not built')
})

for (const backend of backends()) {
  t.test(`${backend}: every /stats view, planned and written in slices, is the view surface.stats() gives`, async (t) => {
    const surface = surfaceOn(t, backend, {}, { scrapeThread: false })
    for (let i = 0; i < 30; i++) {
      const topic = surface.topic(i % 7 === 0 ? `t/${i}` : `t_${i}`) // some labels collide (t/7 and t_7…)
      for (let p = 0; p < 3; p++) topic.append(p, 10 * i)
      const group = topic.group(`g${i % 3}`)
      const seq = topic.lastSeq(0)
      group.send(0, seq)
      if (i % 2 === 0) group.settle(0, seq, 'delivered')
    }
    surface.topic('t_7').group('g1').settleUpTo(1, 1, 'dropped')
    for (const view of STATS_VIEWS) {
      for (const filter of [{}, { topic: 't_7' }, { group: 'g1' }]) {
        const context = { snapshot: surface.snapshot(), conservation: surface.stats('conservation'), faults: surface.stats('faults'), config: surface.config, backend, backendReason: '' }
        const req = statsRequest(view, filter)
        const slicer = countingSlicer()
        const text = (await toJSONSliced(statsPlanOf(req, context), 0, slicer)).toString('utf8')
        t.equal(text, toJSON(statsViewOf(req, context)), `${view} ${JSON.stringify(filter)}: the same text (${slicer.pauses} pauses)`)
      }
    }
    const server = await surface.listen({ port: 0 })
    for (const view of ['topics', 'partitions', 'groups']) {
      const answer = await request(server.port, { path: `/stats?filter=${view}` })
      t.strictSame(JSON.parse(answer.text), JSON.parse(toJSON(surface.stats(view))), `GET /stats?filter=${view}: the view surface.stats() gives`)
    }
  })
}
