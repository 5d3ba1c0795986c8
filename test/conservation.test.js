'use strict'
// The conservation checker (SPEC §4) against hand-built snapshots, so each case states its numbers
// exactly. Run `npx tsc -p tsconfig.json` first (it tests dist/conservation.js).
const t = require('tap')
const { ConservationChecker } = require('../dist/conservation.js')

// A tiny model of one topic: partitions with last_seq, groups with counters and ack floors.
// `snapshotOf` derives depth and lag the way SPEC §4 defines them; keys are stable per model.
function model(name, partitions) {
  return { name, label: name.replace(/[^A-Za-z0-9_-]/g, '_'), key: {}, lastSeq: new Array(partitions).fill(0), bytes: 0, groups: new Map() }
}

function addGroup(topic, name, values = {}) {
  const g = { name, label: name, key: {}, delivered: 0, dropped: 0, dlq: 0, retries: 0, inFlight: 0, floors: topic.lastSeq.map(() => 0), ...values }
  topic.groups.set(name, g)
  return g
}

function produce(topic, partition, count) {
  topic.lastSeq[partition] += count
}

function settle(topic, group, partition, delivered, dropped = 0) {
  group.delivered += delivered
  group.dropped += dropped
  group.floors[partition] += delivered + dropped
}

function sum(values) {
  return values.reduce((a, b) => a + b, 0)
}

function topicSnapshot(topic, overrides = {}) {
  const groups = [...topic.groups.values()].map((g) => {
    const behind = topic.lastSeq.map((s, p) => s - g.floors[p])
    return {
      name: g.name,
      label: g.label,
      delivered: g.delivered,
      dropped: g.dropped,
      dlq: g.dlq,
      retries: g.retries,
      inFlight: g.inFlight,
      maxInFlight: 1000,
      lag: Math.max(0, ...behind),
      depth: sum(behind),
      ackFloors: [...g.floors],
      key: g.key,
    }
  })
  return {
    name: topic.name,
    label: topic.label,
    produced: sum(topic.lastSeq),
    bytes: topic.bytes,
    delivered: sum(groups.map((g) => g.delivered)),
    dropped: sum(groups.map((g) => g.dropped)),
    dlq: sum(groups.map((g) => g.dlq)),
    partitions: topic.lastSeq.map((s, p) => ({
      partition: p,
      lastSeq: s,
      depth: s - Math.min(...[...topic.groups.values()].map((g) => g.floors[p]), s),
    })),
    groups,
    key: topic.key,
    ...overrides,
  }
}

function snapshotOf(...topics) {
  return {
    uptimeSeconds: 1,
    connections: 0,
    leaderEpoch: 1,
    quorumState: 0,
    replicas: 3,
    inSync: 3,
    latency: null,
    topics: topics.map((topic) => (Array.isArray(topic.lastSeq) ? topicSnapshot(topic) : topic)), // a model, or a prebuilt snapshot
  }
}

function checker() {
  const faults = []
  const rereads = []
  const c = new ConservationChecker((f) => faults.push(f))
  // The default re-read sees the same numbers (a genuinely quiet window).
  const check = (snapshot, reread = (ts) => ts) =>
    c.check(snapshot, (ts) => {
      rereads.push(ts.name)
      return reread(ts)
    })
  return { check, faults, rereads }
}

function groupRow(report, topic, group) {
  const tr = report.topics.find((x) => x.topic === topic)
  return tr && tr.groups.find((x) => x.group === group)
}

t.test('honest accounting over a scripted workload has residual 0 and no fault in every window', async (t) => {
  const { check, faults } = checker()
  const orders = model('orders', 4)
  const billing = addGroup(orders, 'billing')
  const audit = addGroup(orders, 'audit')
  // Each step leaves both groups quiet (nothing in flight): the identity must hold exactly.
  const steps = [
    ['nothing yet', () => {}],
    ['publishes only', () => [0, 1, 2, 3].forEach((p) => produce(orders, p, 5 + p))],
    ['billing delivers part', () => settle(orders, billing, 0, 3)],
    ['audit delivers and drops', () => { settle(orders, audit, 1, 4, 2); audit.dlq += 1 }],
    ['more publishes', () => produce(orders, 2, 100)],
    ['redeliveries change nothing', () => { billing.retries += 7 }],
    ['everything settled', () => {
      for (const g of [billing, audit]) orders.lastSeq.forEach((s, p) => settle(orders, g, p, s - g.floors[p]))
    }],
  ]
  for (const [name, step] of steps) {
    step()
    const report = check(snapshotOf(orders))
    for (const g of ['billing', 'audit']) {
      const row = groupRow(report, 'orders', g)
      t.equal(row.residual, 0, `${name}: ${g} residual is 0 (a non-zero value would be a false alarm)`)
      t.equal(row.quiet, true, `${name}: ${g} is quiet (nothing in flight)`)
    }
  }
  t.same(faults, [], 'honest accounting never raises CONSERVATION_BROKEN')
})

t.test('a group with no consumers yet counts everything produced as its depth', async (t) => {
  const { check, faults } = checker()
  const topic = model('fresh', 2)
  addGroup(topic, 'idle')
  for (const n of [0, 3, 10]) {
    produce(topic, 0, n)
    produce(topic, 1, n * 2)
    const report = check(snapshotOf(topic))
    t.equal(groupRow(report, 'fresh', 'idle').depth, topic.lastSeq[0] + topic.lastSeq[1], `after +${n}: depth_g = Σ last_seq`)
    t.equal(groupRow(report, 'fresh', 'idle').residual, 0, `after +${n}: residual 0`)
  }
  t.same(faults, [])
})

t.test('the baseline is taken when a topic or group is first seen', async (t) => {
  const { check, faults } = checker()
  const topic = model('midstream', 2)
  // Numbers that do not satisfy the identity from zero (e.g. counted before a restart of the
  // checker, or a floor set from persisted state): first sight must still show residual 0.
  produce(topic, 0, 50)
  produce(topic, 1, 50)
  const early = addGroup(topic, 'early', { delivered: 1234, dropped: 17, floors: [10, 20] })
  let report = check(snapshotOf(topic))
  t.equal(groupRow(report, 'midstream', 'early').residual, 0, 'a group first seen with non-zero values has residual 0')

  const late = addGroup(topic, 'late', { delivered: 999, floors: [40, 0] })
  produce(topic, 0, 5)
  settle(topic, early, 1, 5)
  report = check(snapshotOf(topic))
  t.equal(groupRow(report, 'midstream', 'late').residual, 0, 'a group added later is measured from its own first sight, not the topic\'s')
  t.equal(groupRow(report, 'midstream', 'early').residual, 0, 'the earlier group keeps its baseline')

  settle(topic, late, 1, 30, 3)
  report = check(snapshotOf(topic))
  t.equal(groupRow(report, 'midstream', 'late').residual, 0, 'later honest progress keeps residual 0')
  t.same(faults, [])
})

t.test('a quiet non-zero residual raises one CONSERVATION_BROKEN per episode', async (t) => {
  const { check, faults } = checker()
  const topic = model('pay/ments', 2)
  const g = addGroup(topic, 'ledger')
  addGroup(topic, 'honest')
  produce(topic, 0, 10)
  produce(topic, 1, 10)
  settle(topic, g, 0, 4)
  check(snapshotOf(topic))
  t.equal(faults.length, 0, 'honest start')

  // Broken accounting: the ack floor passes 3 messages nobody delivered or dropped.
  g.floors[1] += 3
  let report = check(snapshotOf(topic))
  t.equal(groupRow(report, 'pay/ments', 'ledger').residual, 3, 'residual = Δproduced − Δdelivered − Δdropped − Δdepth = 0 − 0 − 0 − (−3)')
  t.equal(groupRow(report, 'pay/ments', 'ledger').quiet, true, 'the window is quiet')
  t.equal(groupRow(report, 'pay/ments', 'honest').residual, 0, 'the other group of the topic is unaffected')
  t.equal(faults.length, 1, 'the first quiet non-zero check raises the fault')
  const fault = faults[0]
  t.match(fault, {
    code: 'CONSERVATION_BROKEN',
    metric: 'mq_topic_messages_produced_total',
    labels: { topic: 'pay_ments', group: 'ledger' },
    previous: 17, // produced expected from the consumption side: 20 − 3
    attempted: 20, // produced as counted
  }, 'the fault names the metric, the sanitized labels, and expected vs actual produced')
  t.same(Object.keys(fault).sort(), ['at', 'attempted', 'code', 'labels', 'metric', 'previous'], 'the fault has exactly the SPEC §5 fields')
  t.equal(new Date(fault.at).toISOString(), fault.at, 'at is an ISO time')

  for (let i = 0; i < 5; i++) check(snapshotOf(topic))
  t.equal(faults.length, 1, 'the same episode is not re-raised on every scrape')

  // Recovery: the 3 messages are accounted as delivered after all.
  g.delivered += 3
  report = check(snapshotOf(topic))
  t.equal(groupRow(report, 'pay/ments', 'ledger').residual, 0, 'residual back to 0 ends the episode')
  check(snapshotOf(topic))
  t.equal(faults.length, 1, 'no fault while healthy')

  g.dropped += 2 // dropped counted with no floor movement
  report = check(snapshotOf(topic))
  t.equal(groupRow(report, 'pay/ments', 'ledger').residual, -2, 'a new break has its own residual')
  t.equal(faults.length, 2, 'a new episode after recovery raises the fault again')
  t.equal(faults[1].previous, 22)
  t.equal(faults[1].attempted, 20)
})

t.test('a non-zero residual with messages in flight is not a fault', async (t) => {
  const { check, faults, rereads } = checker()
  const topic = model('busy', 1)
  const g = addGroup(topic, 'workers')
  produce(topic, 0, 10)
  check(snapshotOf(topic))
  // A delivery counted before its ack floor moved: transient, expected while busy.
  g.delivered += 2
  g.inFlight = 3
  const report = check(snapshotOf(topic))
  t.equal(groupRow(report, 'busy', 'workers').residual, -2, 'the transient residual is reported')
  t.equal(groupRow(report, 'busy', 'workers').quiet, false, 'not quiet: 3 in flight')
  t.same(faults, [], 'no fault outside a quiet window')
  t.same(rereads, [], 'no re-read is needed for a busy group')
})

t.test('the re-read protects against a concurrent writer between two reads', async (t) => {
  const cases = [
    ['a producer appended meanwhile', (ts) => ({ ...ts, produced: ts.produced + 1 })],
    ['a delivery was counted meanwhile', (ts) => ({ ...ts, groups: ts.groups.map((g) => ({ ...g, delivered: g.delivered + 1 })) })],
    ['a drop was counted meanwhile', (ts) => ({ ...ts, groups: ts.groups.map((g) => ({ ...g, dropped: g.dropped + 1 })) })],
    ['an ack floor moved meanwhile', (ts) => ({ ...ts, groups: ts.groups.map((g) => ({ ...g, depth: g.depth - 1 })) })],
    ['a dispatch started meanwhile', (ts) => ({ ...ts, groups: ts.groups.map((g) => ({ ...g, inFlight: 1 })) })],
    ['the group was removed meanwhile', (ts) => ({ ...ts, groups: [] })],
    ['the topic was removed and created again', (ts) => ({ ...ts, key: {} })],
  ]
  for (const [name, reread] of cases) {
    const { check, faults, rereads } = checker()
    const topic = model('race', 1)
    const a = addGroup(topic, 'a')
    const b = addGroup(topic, 'b')
    produce(topic, 0, 10)
    check(snapshotOf(topic))
    a.delivered += 1 // both groups look broken in the first read
    b.delivered += 1
    const report = check(snapshotOf(topic), reread)
    t.same(faults, [], `${name}: no fault when the re-read differs`)
    t.equal(groupRow(report, 'race', 'a').quiet, false, `${name}: the window is reported as not quiet`)
    t.same(rereads, ['race'], `${name}: one re-read per topic, shared by its groups`)
  }
})

t.test('the re-read runs only for a quiet non-zero residual', async (t) => {
  const { check, rereads } = checker()
  const topic = model('calm', 2)
  addGroup(topic, 'g')
  for (let i = 0; i < 3; i++) {
    produce(topic, i % 2, 4)
    check(snapshotOf(topic))
  }
  t.same(rereads, [], 'a zero residual costs no second read')
})

t.test('dlq_within_dropped per topic', async (t) => {
  const { check } = checker()
  const cases = [
    ['nothing dropped', { dropped: 0, dlq: 0 }, true],
    ['some DLQ writes failed', { dropped: 5, dlq: 3 }, true],
    ['every drop reached the DLQ', { dropped: 5, dlq: 5 }, true],
    ['dlq above dropped', { dropped: 2, dlq: 3 }, false],
    ['bigint dropped', { dropped: 2n ** 64n - 1n, dlq: 5 }, true],
    ['bigint dlq above number dropped', { dropped: 5, dlq: 2n ** 60n }, false],
  ]
  const topics = cases.map(([name, counts]) => ({ ...topicSnapshot(model(name, 1)), ...counts }))
  const report = check(snapshotOf(...topics))
  for (const [name, counts, expected] of cases) {
    const row = report.topics.find((x) => x.topic === name)
    t.equal(row.dlq_within_dropped, expected, `${name}: dlq ${counts.dlq} ≤ dropped ${counts.dropped} is ${expected}`)
    t.equal(row.dlq, counts.dlq, `${name}: dlq shown exactly`)
  }
})

t.test('exact arithmetic above 2^53', async (t) => {
  const { check, faults } = checker()
  const key = {}
  const gkey = {}
  const huge = 2n ** 64n - 100n
  const topicAt = (produced, delivered, depth, extra = {}) => ({
    name: 'big', label: 'big', key, produced, bytes: 0, delivered, dropped: 0, dlq: 0,
    partitions: [{ partition: 0, lastSeq: depth, depth }],
    groups: [{ name: 'g', label: 'g', key: gkey, delivered, dropped: 0, dlq: 0, retries: 0, inFlight: 0, maxInFlight: 1, lag: depth, depth, ackFloors: [0], ...extra }],
  })
  let report = check(snapshotOf(topicAt(huge, huge - 10n, 10)))
  t.equal(report.topics[0].groups[0].residual, 0, 'baseline residual 0')
  t.equal(report.topics[0].produced, huge, 'produced passes through as an exact bigint')

  // +7 produced, +9 delivered, depth −2: honest (a float would round 2^64 − 100 + 7 away).
  report = check(snapshotOf(topicAt(huge + 7n, huge - 1n, 8)))
  t.equal(report.topics[0].groups[0].residual, 0, 'honest progress above 2^53 stays exactly 0')
  t.same(faults, [])

  report = check(snapshotOf(topicAt(huge + 8n, huge - 1n, 8)))
  t.equal(report.topics[0].groups[0].residual, 1, 'a residual of 1 above 2^53 is seen, as a number')
  t.equal(faults.length, 1, 'and raised')

  report = check(snapshotOf(topicAt(huge + 8n, 0, 8)))
  t.equal(typeof report.topics[0].groups[0].residual, 'bigint', 'a residual beyond 2^53 stays an exact bigint')
  t.equal(report.topics[0].groups[0].residual, huge, '8 − (0 − (huge − 10)) − 0 − (8 − 10) = huge, digit for digit')
})

t.test('a removed topic is forgotten: the same name created again starts a new baseline', async (t) => {
  const { check, faults } = checker()
  let topic = model('reborn', 1)
  addGroup(topic, 'g')
  produce(topic, 0, 10)
  check(snapshotOf(topic))
  topic = model('reborn', 1) // removeTopic + topic(): new identity, counters from zero
  addGroup(topic, 'g', { delivered: 3, floors: [3] })
  produce(topic, 0, 4)
  const report = check(snapshotOf(topic))
  t.equal(groupRow(report, 'reborn', 'g').residual, 0, 'no residual carried over from the removed topic')
  t.same(faults, [])
  t.same(check(snapshotOf()).topics, [], 'a snapshot without topics reports none')
})

t.test('the report has the SPEC §7 shape', async (t) => {
  const { check } = checker()
  const topic = model('shape', 1)
  addGroup(topic, 'g', { delivered: 2, dropped: 1, floors: [3] })
  produce(topic, 0, 5)
  t.same(check(snapshotOf(topic)), {
    topics: [{
      topic: 'shape', label: 'shape', produced: 5, dropped: 1, dlq: 0, dlq_within_dropped: true,
      groups: [{ group: 'g', label: 'g', delivered: 2, dropped: 1, depth: 2, residual: 0, quiet: true }],
    }],
  })
  t.throws(() => new (require('../dist/conservation.js').ConservationChecker)(), TypeError, 'the callback is required')
})
