'use strict'
// /stats views (design §7) from hand-built snapshots: each view's exact shape, narrowing, the 400
// errors, and exact integers through lib/core/json.ts. Run `npx tsc -p tsconfig.json` first.
const t = require('tap')
const { statsView, statsFromQuery, StatsError, STATS_VIEWS } = require('../dist/exposition/stats.js')
const { ConservationChecker } = require('../dist/core/conservation.js')
const { FaultLog } = require('../dist/core/faults.js')
const { resolveConfig } = require('../dist/core/config.js')
const { toJSON } = require('../dist/core/json.js')
const { describe } = require('../dist/core/labels.js')

const U64_MAX = 2n ** 64n - 1n
const ALLOWED = 'topics, partitions, groups, quorum, latency, conservation, faults, collisions, config'

function group(name, label, values) {
  return { name, label, delivered: 0, dropped: 0, dlq: 0, retries: 0, inFlight: 0, maxInFlight: 1000, lag: 0, depth: 0, ackFloors: [], settledPerMessage: false, inFlightBounded: false, start: 0, key: {}, ...values }
}

// Two raw topic names share the label `a_b`; in each, two raw group names share the label `g_1`.
function snapshot() {
  return {
    uptimeSeconds: 3723.5,
    connections: 12,
    leaderEpoch: 7,
    quorumState: 1,
    replicas: 3,
    inSync: 2,
    lagging: ['node-3'],
    latency: { p50: 1.5, p90: 4.25, p99: 9.75, count: 1200 },
    topics: [
      {
        name: 'a.b', label: 'a_b', produced: U64_MAX, bytes: 2n ** 60n, delivered: 30, dropped: 4, dlq: 3,
        partitionNumbers: [0, 3], lastSeq: [40, 10], depth: [25, 0],
        groups: [
          // Balances at registration (`start`): g.1 is 7 off (but busy), g/1 balances.
          group('g.1', 'g_1', { delivered: 20, dropped: 3, dlq: 2, retries: 5, inFlight: 2, maxInFlight: 50, lag: 15, depth: 15, ackFloors: [25, 10], start: U64_MAX - 45n }),
          group('g/1', 'g_1', { delivered: 10, dropped: 1, dlq: 1, lag: 30, depth: 35, ackFloors: [15, 0], start: U64_MAX - 46n }),
        ],
        key: {},
      },
      {
        name: 'a/b', label: 'a_b', produced: 5, bytes: 500, delivered: 0, dropped: 0, dlq: 0,
        partitionNumbers: [0], lastSeq: [5], depth: [5],
        groups: [group('g.1', 'g_1', { lag: 5, depth: 5, ackFloors: [0] })],
        key: {},
      },
      {
        name: 'orders', label: 'orders', produced: 1, bytes: 10, delivered: 1, dropped: 0, dlq: 0,
        partitionNumbers: [1], lastSeq: [1], depth: [0],
        groups: [group('billing', 'billing', { delivered: 1, ackFloors: [1] })],
        key: {},
      },
    ],
  }
}

function context(overrides = {}) {
  const snap = snapshot()
  const faults = new FaultLog(2)
  for (const code of ['EPOCH_REGRESSION', 'ACK_FLOOR_INVALID', 'EPOCH_REGRESSION']) {
    faults.add({ code, metric: 'mq_leader_epoch', labels: {}, previous: 7, attempted: 6, at: '2024-01-01T00:00:00.000Z' })
  }
  const checker = new ConservationChecker(() => {})
  return {
    snapshot: snap,
    faults: faults.view(),
    config: resolveConfig({ metrics_auth_token: 'secret', e2e_latency: true }),
    conservation: checker.report(snap, (x) => x),
    backend: 'js',
    backendReason: 'TypeScript backend: chosen by MQ_METRICS_BACKEND=js',
    ...overrides,
  }
}

t.test('STATS_VIEWS is the design §7 list, in order', async (t) => {
  t.strictSame([...STATS_VIEWS], ALLOWED.split(', '))
})

t.test('topics view', async (t) => {
  t.strictSame(statsView('topics', {}, context()), {
    filter: 'topics',
    topics: [
      { topic: 'a.b', label: 'a_b', produced: U64_MAX, delivered: 30, dropped: 4, dlq: 3, bytes: 2n ** 60n, partitions: 2, groups: 2 },
      { topic: 'a/b', label: 'a_b', produced: 5, delivered: 0, dropped: 0, dlq: 0, bytes: 500, partitions: 1, groups: 1 },
      { topic: 'orders', label: 'orders', produced: 1, delivered: 1, dropped: 0, dlq: 0, bytes: 10, partitions: 1, groups: 1 },
    ],
    totals: { produced: U64_MAX + 6n, delivered: 31, dropped: 4, dlq: 3, bytes: 2n ** 60n + 510n },
  }, 'raw names beside labels; counts per topic; totals summed exactly (a float sum would lose the +6)')
})

t.test('partitions view', async (t) => {
  t.strictSame(statsView('partitions', {}, context()), {
    filter: 'partitions',
    partitions: [
      { topic: 'a.b', label: 'a_b', partition: 0, last_seq: 40, depth: 25 },
      { topic: 'a.b', label: 'a_b', partition: 3, last_seq: 10, depth: 0 },
      { topic: 'a/b', label: 'a_b', partition: 0, last_seq: 5, depth: 5 },
      { topic: 'orders', label: 'orders', partition: 1, last_seq: 1, depth: 0 },
    ],
  })
})

t.test('groups view', async (t) => {
  const base = { dlq: 0, retries: 0, in_flight: 0, max_in_flight: 1000 }
  t.strictSame(statsView('groups', {}, context()), {
    filter: 'groups',
    groups: [
      { topic: 'a.b', topic_label: 'a_b', group: 'g.1', label: 'g_1', delivered: 20, dropped: 3, dlq: 2, retries: 5, in_flight: 2, max_in_flight: 50, lag: 15, depth: 15, ack_floors: { 0: 25, 3: 10 } },
      { topic: 'a.b', topic_label: 'a_b', group: 'g/1', label: 'g_1', delivered: 10, dropped: 1, ...base, dlq: 1, lag: 30, depth: 35, ack_floors: { 0: 15, 3: 0 } },
      { topic: 'a/b', topic_label: 'a_b', group: 'g.1', label: 'g_1', delivered: 0, dropped: 0, ...base, lag: 5, depth: 5, ack_floors: { 0: 0 } },
      { topic: 'orders', topic_label: 'orders', group: 'billing', label: 'billing', delivered: 1, dropped: 0, ...base, lag: 0, depth: 0, ack_floors: { 1: 1 } },
    ],
  }, 'ack_floors are keyed by decimal partition number')
})

t.test('quorum view', async (t) => {
  const cases = [[0, 'healthy', 2], [1, 'soft', 1], [2, 'read_only', 0]]
  for (const [state, status, level] of cases) {
    const ctx = context()
    ctx.snapshot.quorumState = state
    t.strictSame(statsView('quorum', {}, ctx), {
      filter: 'quorum', quorum_state: state, status, runbook_level: level, replicas: 3, in_sync: 2, lagging: ['node-3'], leader_epoch: 7,
      connections: 12, uptime_seconds: 3723.5,
    }, `quorum_state ${state} is ${status}, runbook level ${level}`)
  }
})

t.test('latency view', async (t) => {
  t.strictSame(statsView('latency', {}, context()), { filter: 'latency', enabled: true, p50: 1.5, p90: 4.25, p99: 9.75, count: 1200 })
  const empty = context({ config: resolveConfig({}) })
  empty.snapshot.latency = null
  t.strictSame(statsView('latency', {}, empty), { filter: 'latency', enabled: false, p50: null, p90: null, p99: null, count: 0 }, 'no window: null quantiles, zero samples')
})

t.test('conservation view', async (t) => {
  // context() runs a fresh checker once, with a re-read that sees the same numbers: each group's
  // residual is measured from its balance at registration (`start`), busy or not.
  const view = statsView('conservation', {}, context())
  t.equal(view.filter, 'conservation')
  t.strictSame(view.topics[0], {
    topic: 'a.b', label: 'a_b', produced: U64_MAX, dropped: 4, dlq: 3, dlq_within_dropped: true,
    groups: [
      { group: 'g.1', label: 'g_1', delivered: 20, dropped: 3, depth: 15, residual: 7, quiet: false, in_flight: 2, in_flight_within_depth: null },
      { group: 'g/1', label: 'g_1', delivered: 10, dropped: 1, depth: 35, residual: 0, quiet: true, in_flight: 0, in_flight_within_depth: null },
    ],
  }, 'a busy group shows its residual (not quiet: no fault); a quiet, balanced one has residual 0')
  t.equal(view.topics.length, 3)
  t.strictSame(view.topics.slice(1).map((x) => x.groups.map((g) => [g.residual, g.quiet])), [[[0, true]], [[0, true]]], 'the quiet groups of the other topics: residual 0')
  t.match(toJSON(view), /"group":"g\.1","label":"g_1","delivered":20,"dropped":3,"depth":15,"residual":7,"quiet":false,"in_flight":2,"in_flight_within_depth":null\}/, 'a residual is a JSON number')
})

t.test('faults view', async (t) => {
  const view = statsView('faults', {}, context())
  t.strictSame(Object.keys(view), ['filter', 'capacity', 'counts', 'recent', 'total'])
  t.equal(view.capacity, 2)
  t.strictSame(view.counts, { ACK_FLOOR_INVALID: 1, EPOCH_REGRESSION: 2 }, 'counts per code, including faults the bounded log dropped')
  t.strictSame(view.recent.map((f) => f.code), ['ACK_FLOOR_INVALID', 'EPOCH_REGRESSION'], 'recent: at most capacity, newest last')
  t.equal(view.total, 3)
})

t.test('collisions view', async (t) => {
  t.strictSame(statsView('collisions', {}, context()), {
    filter: 'collisions',
    topics: [{ label: 'a_b', names: ['a.b', 'a/b'] }],
    groups: [{ topic_label: 'a_b', label: 'g_1', names: [{ topic: 'a.b', group: 'g.1' }, { topic: 'a.b', group: 'g/1' }, { topic: 'a/b', group: 'g.1' }] }],
  }, 'only labels shared by two or more raw names; groups collide across colliding topics too')
})

t.test('config view', async (t) => {
  t.strictSame(statsView('config', {}, context()), {
    filter: 'config', metrics_enabled: true, max_in_flight: 1000, max_attempts: 5, e2e_latency: true, e2e_latency_timer: true, metrics_auth_token: 'set',
    max_topics: 10000, max_partitions_per_topic: 4096, max_groups_per_topic: 256, backend: 'js',
    backend_reason: 'TypeScript backend: chosen by MQ_METRICS_BACKEND=js',
  }, 'the token itself never appears')
  t.equal(statsView('config', {}, context({ config: resolveConfig({}), backend: 'native' })).metrics_auth_token, 'unset')
  t.notMatch(toJSON(statsView('config', {}, context())), /secret/, 'the token text is not in the JSON')
})

t.test('topic= and group= narrow to exact raw names', async (t) => {
  const ctx = context()
  const cases = [
    ['topics', { topic: 'a.b' }, (v) => v.topics.map((x) => x.topic), ['a.b']],
    ['topics', { topic: 'a_b' }, (v) => v.topics.map((x) => x.topic), []],
    ['topics', { group: 'billing' }, (v) => v.topics.map((x) => x.topic), ['orders']],
    ['partitions', { topic: 'a/b' }, (v) => v.partitions.map((x) => `${x.topic}#${x.partition}`), ['a/b#0']],
    ['groups', { group: 'g.1' }, (v) => v.groups.map((x) => `${x.topic}/${x.group}`), ['a.b/g.1', 'a/b/g.1']],
    ['groups', { topic: 'a.b', group: 'g/1' }, (v) => v.groups.map((x) => `${x.topic}/${x.group}`), ['a.b/g/1']],
    ['groups', { topic: 'nope' }, (v) => v.groups, []],
    ['conservation', { group: 'g/1' }, (v) => v.topics.map((x) => [x.topic, x.groups.map((g) => g.group)]), [['a.b', ['g/1']]]],
    ['collisions', { topic: 'orders' }, (v) => [v.topics, v.groups], [[], []]],
    ['collisions', { topic: 'a/b' }, (v) => [v.topics.length, v.groups.length], [1, 1]],
    ['collisions', { group: 'g/1' }, (v) => [v.topics.length, v.groups.length], [0, 1]],
    ['quorum', { topic: 'nope' }, (v) => v.quorum_state, 1],
  ]
  for (const [view, filter, pick, expected] of cases) {
    t.strictSame(pick(statsView(view, filter, ctx)), expected, `${view} ${JSON.stringify(filter)}`)
  }
})

t.test('statsView rejects an unknown view with the allowed list', async (t) => {
  for (const view of ['nope', '', 'TOPICS']) {
    t.throws(() => statsView(view, {}, context()), { name: 'StatsError', code: 'INVALID_FILTER', statusCode: 400, message: new RegExp(`allowed views: ${ALLOWED}$`) }, `view ${String(view)}`)
  }
  // Not a string: a TypeError (errors.md), not "unknown view \"topics\"" for ['topics'].
  for (const [view, got] of [[['topics'], 'an array'], [new String('topics'), 'an object'], [null, 'null'], [42, '42'], [Symbol('topics'), 'Symbol\\(topics\\)']]) {
    t.throws(() => statsView(view, {}, context()), { name: 'TypeError', message: new RegExp(`^stats view must be a string \\(${ALLOWED}\\), got ${got}$`) }, `view ${String(view)}`)
  }
  t.throws(() => statsView(undefined, {}, context()), { name: 'StatsError', code: 'MISSING_FILTER', statusCode: 400, message: new RegExp(`^a view is required, e.g. stats\\('topics'\\); allowed views: ${ALLOWED}$`) }, 'no view')
  const error = (() => { try { statsView('x', {}, context()) } catch (e) { return e } })()
  t.ok(error instanceof StatsError && error instanceof Error, 'a StatsError is an Error')
})

t.test('statsView rejects a filter object with an unknown key (a typo must not widen the view)', async (t) => {
  for (const filter of [{ topics: 'a.b' }, { topic: 'a.b', grop: 'g' }, { Topic: 'a.b' }]) {
    t.throws(() => statsView('groups', filter, context()), { name: 'StatsError', code: 'INVALID_QUERY', message: /unknown stats filter key ".+" \(known: topic, group\)/ }, JSON.stringify(filter))
  }
  t.same(statsView('topics', { topic: 'a.b' }, context()).topics.map((x) => x.topic), ['a.b'], 'the known keys narrow as before')
  t.ok(statsView('topics', Object.create({ topic: 'a.b' }), context()).topics.length > 1, 'an inherited key is not read: the view is not narrowed')
  t.throws(() => statsView('topics', [], context()), { name: 'TypeError', message: /must be an object/ }, 'an array is not a filter (it would read as no filter)')
  const surface = require('../dist').createSurface({}, { scrapeThread: false })
  t.teardown(() => surface.close())
  for (const filter of [null, [], 'a.b']) t.throws(() => surface.stats('topics', filter), { name: 'TypeError', message: /^stats filter must be an object, got / }, `surface.stats() with ${JSON.stringify(filter)}`)
  for (const view of [['topics'], new String('topics')]) t.throws(() => surface.stats(view), { name: 'TypeError', message: /^stats view must be a string / }, `surface.stats() with ${describe(view)}`)
})

t.test('statsFromQuery: validation before the context is built', async (t) => {
  const cases = [
    ['', 'MISSING_FILTER', /filter query parameter is required.*allowed views: topics, partitions/],
    ['filter=', 'MISSING_FILTER', /allowed views: /],
    ['topic=a.b', 'MISSING_FILTER', /allowed views: /],
    ['filter=nope', 'INVALID_FILTER', new RegExp(`unknown view "nope"; allowed views: ${ALLOWED}`)],
    ['filter=topics&filter=groups', 'INVALID_FILTER', /filter must be given once.*allowed views: /],
    ['filter=topics&filter=topics', 'INVALID_FILTER', /once/],
    ['filter=topics&limit=3', 'INVALID_QUERY', /unknown query parameter "limit"; allowed parameters: filter, topic, group/],
    ['filter=topics&topic=a&topic=b', 'INVALID_QUERY', /topic must be given at most once/],
    ['filter=groups&group=x&group=x', 'INVALID_QUERY', /group must be given at most once/],
    ['filter=topics&topic=', 'INVALID_QUERY', /topic must be a non-empty/],
    ['filter=groups&group=', 'INVALID_QUERY', /group must be a non-empty/],
    [`filter=topics&topic=${'t'.repeat(1025)}`, 'INVALID_QUERY', /^topic must be at most 1024 characters long, as a topic name is \(UTF-16 code units\), got 1025$/],
  ]
  for (const [query, code, message] of cases) {
    let built = 0
    const answer = statsFromQuery(new URLSearchParams(query), () => (built++, context()))
    t.equal(answer.statusCode, 400, `?${query}: 400`)
    t.strictSame(Object.keys(answer.body), ['error'], `?${query}: body is { error }`)
    t.equal(answer.body.error.code, code, `?${query}: ${code}`)
    t.match(answer.body.error.message, message, `?${query}: message`)
    t.equal(built, 0, `?${query}: no snapshot taken for a bad request`)
  }
})

t.test('surface.stats(): a refused call reads nothing, so it raises and counts no fault', async (t) => {
  const { backends, surfaceOn } = require('./helpers')
  const refused = [
    ['an unknown view', (s) => s.stats('bogus'), 'INVALID_FILTER'],
    ['no view', (s) => s.stats(), 'MISSING_FILTER'],
    ['a filter key typo', (s) => s.stats('topics', { topics: 'orders' }), 'INVALID_QUERY'],
    ['a filter value that is not a string', (s) => s.stats('groups', { group: 5 }), 'TypeError'],
    ['an empty topic, as ?topic= is refused', (s) => s.stats('groups', { topic: '' }), 'INVALID_QUERY'],
    ['an empty group', (s) => s.stats('groups', { group: '' }), 'INVALID_QUERY'],
    ['a group longer than any name', (s) => s.stats('groups', { group: 'g'.repeat(1025) }), 'INVALID_QUERY'],
  ]
  for (const backend of backends()) {
    for (const [what, call, code] of refused) {
      // A group that delivered more than was produced: the next read raises CONSERVATION_BROKEN.
      const surface = surfaceOn(t, backend, {}, { scrapeThread: false })
      const orders = surface.topic('orders')
      for (let i = 0; i < 5; i++) orders.append(0, 10)
      orders.group('billing').delivered(7)
      const emitted = []
      surface.on('fault', (fault) => emitted.push(fault.code))
      t.throws(() => call(surface), code === 'TypeError' ? { name: 'TypeError', message: /^stats filter group must be a string \(an exact raw name\), got 5$/ } : { name: 'StatsError', code }, `${backend}, ${what}: refused`)
      t.strictSame(emitted, [], `${backend}, ${what}: no fault emitted (the refused call would have read the snapshot)`)
      // The first call that is answered reads, and finds the broken identity.
      t.equal(surface.stats('faults').counts.CONSERVATION_BROKEN, 1, `${backend}, ${what}: the answered call raises CONSERVATION_BROKEN, once`)
      t.strictSame(emitted, ['CONSERVATION_BROKEN'], `${backend}, ${what}: emitted by the answered call`)
    }
  }
})

t.test('statsFromQuery: a good request', async (t) => {
  let built = 0
  const answer = statsFromQuery(new URLSearchParams('filter=groups&topic=a.b&group=g%2F1'), () => (built++, context()))
  t.equal(answer.statusCode, 200)
  t.equal(built, 1, 'the context is built once')
  t.strictSame(answer.body.groups.map((g) => g.group), ['g/1'], 'percent-decoded exact raw names')
  t.equal(statsFromQuery(new URLSearchParams(`filter=topics&topic=${'t'.repeat(1024)}`), () => context()).statusCode, 200, 'a filter of the longest name: answered')
  t.throws(() => statsFromQuery(new URLSearchParams('filter=topics'), () => { throw new Error('boom') }), /boom/, 'a failure to build the context is not a 400')
})

t.test('exact big integers in the JSON text', async (t) => {
  const text = toJSON(statsView('topics', { topic: 'a.b' }, context()))
  t.match(text, /"produced":18446744073709551615,/, '2^64 − 1 appears digit for digit')
  t.match(text, /"bytes":1152921504606846976,/, '2^60 exactly')
  t.match(toJSON(statsView('topics', {}, context())), /"totals":\{"produced":18446744073709551621,/, 'totals beyond 2^64 exactly')
  t.equal(JSON.parse(text).topics[0].topic, 'a.b', 'the text is valid JSON')
  const weird = context()
  weird.snapshot.topics[2].name = 'quote" back\\slash \n ünï 🚀'
  const parsed = JSON.parse(toJSON(statsView('topics', { topic: weird.snapshot.topics[2].name }, weird)))
  t.equal(parsed.topics[0].topic, 'quote" back\\slash \n ünï 🚀', 'raw names round-trip through JSON escaping')
})
