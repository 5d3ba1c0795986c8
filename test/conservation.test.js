'use strict'
// The conservation checker (design §4) against hand-built snapshots, so each case states its numbers
// exactly. Run `npx tsc -p tsconfig.json` first (it tests dist/core/conservation.js).
//
// A group's baseline is its balance at registration (`start` in its snapshot: 0 unless it started
// at the partitions' last_seq). A non-zero residual is a fault when a re-read of its topic confirms
// it and no settlement under way explains it: in a quiet window (nothing in flight); at any time
// for a group settled per message; above in_flight for a floor-level group (its floor moves first:
// what it passed is at most what is in flight; counted first, the transient is negative). That
// re-read is the only one a check makes, shared by the topic's groups.
const t = require('tap')
const { ConservationChecker } = require('../dist/core/conservation.js')

// A tiny model of one topic: partitions with last_seq, groups with counters and ack floors.
// `snapshotOf` derives depth and lag the way design §4 defines them; keys are stable per model.
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
      settledPerMessage: g.settledPerMessage ?? false,
      inFlightBounded: g.inFlightBounded ?? g.settledPerMessage ?? false, // no ackFloor() moved a floor of it
      maxInFlight: 1000,
      lag: Math.max(0, ...behind),
      depth: sum(behind),
      ackFloors: [...g.floors],
      start: g.start ?? 0,
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
    partitionNumbers: topic.lastSeq.map((s, p) => p),
    lastSeq: [...topic.lastSeq],
    depth: topic.lastSeq.map((s, p) => s - Math.min(...[...topic.groups.values()].map((g) => g.floors[p]), s)),
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
    topics: topics.map((topic) => (topic.groups instanceof Map ? topicSnapshot(topic) : topic)), // a model, or a prebuilt snapshot
  }
}

function checker() {
  const faults = []
  const rereads = []
  const c = new ConservationChecker((f) => faults.push(f))
  // The default re-read sees the same numbers (a genuinely quiet window). report() runs the
  // check and builds the /stats report; check() alone (the /metrics path) is tested below.
  const check = (snapshot, reread = (ts) => ts) =>
    c.report(snapshot, (ts) => {
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
  const { check, faults, rereads } = checker()
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
  t.same(rereads, [], 'baselines come with the groups (registration): a zero residual costs no re-read')
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

t.test('the baseline is the group\'s balance at registration, so a mistake before the first check shows', async (t) => {
  const { check, faults, rereads } = checker()
  const topic = model('midstream', 2)
  produce(topic, 0, 50)
  produce(topic, 1, 50)
  // A group that started at floors 10 and 20 (`from: 'latest'` at that moment): its balance at
  // registration, 100 − 30 = 70, is its start; honest progress from there keeps residual 0.
  const early = addGroup(topic, 'early', { floors: [10, 20], start: 30 })
  let report = check(snapshotOf(topic))
  t.equal(groupRow(report, 'midstream', 'early').residual, 0, 'a group measured from its registration balance')
  t.same(rereads, [], 'no re-read: nothing to confirm')

  produce(topic, 0, 5)
  settle(topic, early, 1, 5)
  report = check(snapshotOf(topic))
  t.equal(groupRow(report, 'midstream', 'early').residual, 0, 'honest progress keeps residual 0')

  // A group registered at zero whose numbers were wrong before anyone looked: reported at once.
  const wrong = addGroup(topic, 'wrong', { delivered: 7 })
  report = check(snapshotOf(topic))
  t.equal(groupRow(report, 'midstream', 'wrong').residual, -7, 'the residual counts from registration, not from first sight')
  t.match(faults, [{ code: 'CONSERVATION_BROKEN', labels: { topic: 'midstream', group: 'wrong' } }], 'and the first check raises it')
  t.same(rereads, ['midstream'], 'confirmed by one re-read of the topic')
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
    names: { topic: 'pay/ments', group: 'ledger' },
    previous: 17, // produced expected from the consumption side: 20 − 3
    attempted: 20, // produced as counted
  }, 'the fault names the metric, the sanitized labels, and expected vs actual produced')
  t.same(Object.keys(fault).sort(), ['at', 'attempted', 'code', 'labels', 'metric', 'names', 'previous'], 'the fault has exactly the design §5 fields')
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

t.test('an episode ends only on a zero residual a re-read confirms: a torn read showing 0 does not end it', async (t) => {
  const { check, faults, rereads } = checker()
  const topic = model('orders', 1)
  const g = addGroup(topic, 'g')
  produce(topic, 0, 3)
  settle(topic, g, 0, 1)
  g.delivered += 1 // one acknowledgement counted twice: residual −1
  check(snapshotOf(topic))
  t.equal(faults.length, 1, 'the mistake is reported')
  // A read torn by an honest producer between its two writes: produced seen one ahead of last_seq,
  // which makes this group's residual read 0; the re-read sees the real numbers again.
  const torn = topicSnapshot(topic, { produced: sum(topic.lastSeq) + 1 })
  let report = check(snapshotOf(torn), () => topicSnapshot(topic))
  t.equal(groupRow(report, 'orders', 'g').residual, 0, 'the torn read shows 0')
  t.equal(groupRow(report, 'orders', 'g').quiet, false, 'numbers that moved between the two reads are not a quiet window')
  check(snapshotOf(topic))
  t.equal(faults.length, 1, 'the episode went on: the same mistake is not reported a second time')
  // The mistake put right (the floor over the message the extra ack was for): a confirmed 0 ends the episode.
  g.floors[0] += 1
  const before = rereads.length
  report = check(snapshotOf(topic))
  t.equal(groupRow(report, 'orders', 'g').residual, 0)
  t.equal(rereads.length, before + 1, 'ending an episode costs one re-read')
  g.dropped += 1
  check(snapshotOf(topic))
  t.equal(faults.length, 2, 'a new mistake after the episode ended is a new episode')
})

t.test('an episode ends on two equal reads showing 0: on a topic that never stands still it stays open until it does', async (t) => {
  const { check, faults } = checker()
  const topic = model('busy', 1)
  const g = addGroup(topic, 'g')
  produce(topic, 0, 5)
  settle(topic, g, 0, 2)
  g.dropped += 1 // a drop counted, the floor never moved: residual −1
  check(snapshotOf(topic))
  t.equal(faults.length, 1)
  // A producer appends between the read of last_seq and of produced, every time: each read is torn
  // so that the residual shows 0 — and so does the re-read. The mistake is still there.
  const torn = () => topicSnapshot(topic, { produced: sum(topic.lastSeq) + 1 })
  for (let i = 0; i < 5; i++) {
    const report = check(snapshotOf(torn()), () => (produce(topic, 0, 1), torn()))
    t.equal(groupRow(report, 'busy', 'g').residual, 0, 'a torn read shows 0')
  }
  check(snapshotOf(topic))
  t.equal(faults.length, 1, 'the episode did not end on them: the same mistake is not reported again')
  g.floors[0] += 1 // put right
  check(snapshotOf(topic))
  g.floors[0] += 1 // a new mistake: the floor passes a message nobody counted
  check(snapshotOf(topic))
  t.equal(faults.length, 2, 'after two equal reads showed 0, a new mistake is a new episode')
})

t.test('check() (the /metrics path, no report) keeps baselines and episodes exactly as report() does', async (t) => {
  // If this failed, /metrics scrapes (which only check) and /stats (which reports) would disagree
  // about baselines or raise an episode's fault twice or never.
  const faults = []
  const c = new ConservationChecker((f) => faults.push(f))
  const same = (ts) => ts
  const topic = model('mixed', 1)
  const g = addGroup(topic, 'g')
  produce(topic, 0, 10)
  t.equal(c.check(snapshotOf(topic), same), undefined, 'check() builds no report')
  g.floors[0] += 3 // broken: 3 settled that nobody delivered or dropped
  c.check(snapshotOf(topic), same)
  t.equal(faults.length, 1, 'check() raises the fault of a quiet non-zero residual')
  t.equal(groupRow(c.report(snapshotOf(topic), same), 'mixed', 'g').residual, 3, 'report() sees the baseline check() took')
  c.check(snapshotOf(topic), same)
  t.equal(faults.length, 1, 'the episode is raised once, whichever of the two runs')
  g.delivered += 3
  c.check(snapshotOf(topic), same)
  g.dropped += 1
  c.report(snapshotOf(topic), same)
  t.equal(faults.length, 2, 'an episode ended by check() lets report() raise the next one')
})

t.test('a non-zero residual with messages in flight is not a fault', async (t) => {
  const { check, faults, rereads } = checker()
  const topic = model('busy', 1)
  const g = addGroup(topic, 'workers')
  produce(topic, 0, 10)
  check(snapshotOf(topic))
  t.same(rereads, [], 'a zero residual needs no re-read (the baseline came with the group)')
  // A delivery counted before its ack floor moved: transient, expected while busy.
  g.delivered += 2
  g.inFlight = 3
  const report = check(snapshotOf(topic))
  t.equal(groupRow(report, 'busy', 'workers').residual, -2, 'the transient residual is reported')
  t.equal(groupRow(report, 'busy', 'workers').quiet, false, 'not quiet: 3 in flight')
  t.same(faults, [], 'no fault outside a quiet window')
  t.same(rereads, [], 'no re-read is needed for a busy group')
  g.delivered += 5 // counted before the floor moved, more than is in flight now: still a transient
  check(snapshotOf(topic))
  t.same([faults, rereads], [[], []], 'a negative residual of any size waits for a quiet window')
})

t.test('a group settled per message is judged while busy: its calls leave no transient outside its lock', async (t) => {
  const { check, faults, rereads } = checker()
  const topic = model('busy', 1)
  const g = addGroup(topic, 'workers', { settledPerMessage: true })
  produce(topic, 0, 10)
  settle(topic, g, 0, 4)
  g.inFlight = 3 // a busy group: something in flight at every scrape
  check(snapshotOf(topic))
  t.same([faults, rereads], [[], []], 'honest and busy: residual 0, nothing to confirm')
  g.delivered += 1 // one message counted delivered twice (delivered() as well as settle())
  let report = check(snapshotOf(topic), (ts) => ({ ...ts, groups: ts.groups.map((x) => ({ ...x, inFlight: 2 })) }))
  t.same(faults, [], 'a re-read that saw it move: not judged')
  report = check(snapshotOf(topic))
  t.equal(groupRow(report, 'busy', 'workers').quiet, false, 'not quiet: 3 in flight')
  t.match(faults, [{ code: 'CONSERVATION_BROKEN', labels: { topic: 'busy', group: 'workers' } }], 'confirmed by a re-read: the double count is reported while the group is busy')
  check(snapshotOf(topic))
  t.equal(faults.length, 1, 'confirmed again: once per episode')
})

t.test('a floor-level group with more settled than it has in flight is judged while busy', async (t) => {
  const { check, faults } = checker()
  const topic = model('leaky', 1)
  const g = addGroup(topic, 'g')
  produce(topic, 0, 10)
  g.inFlight = 3
  g.floors[0] += 3 // ackFloor(0, 3) made, delivered(3) not yet: a settlement under way
  check(snapshotOf(topic))
  t.same(faults, [], 'a positive residual within in_flight: a settlement under way, not judged')
  g.delivered += 3
  g.inFlight = 1 // one count that no settlement ends (a retry counted with dispatch()): never quiet again
  check(snapshotOf(topic))
  g.floors[0] += 4 // four settled that nobody counted delivered or dropped
  const report = check(snapshotOf(topic))
  t.equal(groupRow(report, 'leaky', 'g').residual, 4)
  t.match(faults, [{ code: 'CONSERVATION_BROKEN', labels: { topic: 'leaky', group: 'g' }, previous: 6, attempted: 10 }], 'above in_flight: no settlement under way explains it, reported though never quiet')
})

// Re-reads that differ from the first read: something moved in between.
const RACES = [
  ['a producer appended meanwhile', (ts) => ({ ...ts, produced: ts.produced + 1 })],
  ['a delivery was counted meanwhile', (ts) => ({ ...ts, groups: ts.groups.map((g) => ({ ...g, delivered: g.delivered + 1 })) })],
  ['a drop was counted meanwhile', (ts) => ({ ...ts, groups: ts.groups.map((g) => ({ ...g, dropped: g.dropped + 1 })) })],
  ['an ack floor moved meanwhile', (ts) => ({ ...ts, groups: ts.groups.map((g) => ({ ...g, depth: g.depth - 1 })) })],
  ['a dispatch started meanwhile', (ts) => ({ ...ts, groups: ts.groups.map((g) => ({ ...g, inFlight: 1 })) })],
  ['the group was removed meanwhile', (ts) => ({ ...ts, groups: [] })],
  ['the topic was removed and created again', (ts) => ({ ...ts, key: {} })],
]

t.test('the re-read protects against a concurrent writer between two reads', async (t) => {
  for (const [name, reread] of RACES) {
    const { check, faults, rereads } = checker()
    const topic = model('race', 1)
    const a = addGroup(topic, 'a')
    const b = addGroup(topic, 'b')
    produce(topic, 0, 10)
    check(snapshotOf(topic))
    t.same(rereads, [], `${name}: residual 0: no re-read`)
    a.delivered += 1 // both groups look broken in the first read
    b.delivered += 1
    const report = check(snapshotOf(topic), reread)
    t.same(faults, [], `${name}: no fault when the re-read differs`)
    t.equal(groupRow(report, 'race', 'a').quiet, false, `${name}: the window is reported as not quiet`)
    t.equal(groupRow(report, 'race', 'b').quiet, false, `${name}: for both groups`)
    t.same(rereads, ['race'], `${name}: one re-read per topic in this check, shared by its groups`)
  }
})

t.test('a group\'s baseline does not depend on how it is first seen (busy, or moving between two reads)', async (t) => {
  for (const [name, reread] of RACES) {
    const { check, faults } = checker()
    const topic = model('warmup', 1)
    const g = addGroup(topic, 'g')
    produce(topic, 0, 10)
    g.delivered += 3 // counted before its floor moved: a transient at first sight
    g.inFlight = 1
    let report = check(snapshotOf(topic), reread)
    t.equal(groupRow(report, 'warmup', 'g').residual, -3, `${name}: the transient shows, measured from registration`)
    g.floors[0] += 3 // the settlement completes
    g.inFlight = 0
    report = check(snapshotOf(topic))
    t.equal(groupRow(report, 'warmup', 'g').residual, 0, `${name}: and is gone once the settlement completes`)
    t.same(faults, [], `${name}: no fault: nothing was frozen into a baseline`)
  }
})

t.test('regression: a settlement half-recorded at first sight never becomes a permanent CONSERVATION_BROKEN', async (t) => {
  // A worker thread settles 2 messages in two writes (counter and ack floor, in either order). The
  // checker's first read lands between them, with nothing in flight any more, and the second write
  // lands before the re-read. Freezing that first read into the baseline would leave residual ±2
  // in every quiet window after it: a false CONSERVATION_BROKEN for ever.
  const orders = [
    ['delivered counted, ack floor not yet moved', (g) => { g.delivered += 2 }, (g) => { g.floors[0] += 2 }, 10],
    ['ack floor moved, delivered not yet counted', (g) => { g.floors[0] += 2 }, (g) => { g.delivered += 2 }, 8],
  ]
  for (const [name, first, second, depthSeen] of orders) {
    const { check, faults, rereads } = checker()
    const topic = model('settling', 1)
    const g = addGroup(topic, 'workers')
    produce(topic, 0, 10)
    first(g)
    // The worker finishes the settlement between the two reads, and in any case before the next
    // check (so the model moves on even for a checker that does not re-read).
    let finished = false
    const finish = () => { if (!finished) { finished = true; second(g) } }
    let report = check(snapshotOf(topic), () => {
      finish()
      return topicSnapshot(topic)
    })
    finish()
    t.strictSame(groupRow(report, 'settling', 'workers'), {
      group: 'workers', label: 'workers', delivered: name.startsWith('delivered') ? 2 : 0, dropped: 0, depth: depthSeen, residual: name.startsWith('delivered') ? -2 : 2, quiet: false, in_flight: 0, in_flight_within_depth: null,
    }, `${name}: the half-recorded settlement shows as a transient, not quiet (the re-read saw it move)`)
    t.same(rereads, ['settling'], `${name}: one re-read, which saw the numbers move`)

    for (let i = 0; i < 5; i++) {
      if (i > 0) {
        produce(topic, 0, 3)
        settle(topic, g, 0, 3)
      }
      report = check(snapshotOf(topic))
      t.equal(groupRow(report, 'settling', 'workers').residual, 0, `${name}: check ${i + 2} has residual 0`)
      t.equal(groupRow(report, 'settling', 'workers').quiet, true, `${name}: check ${i + 2} is quiet`)
    }
    t.same(rereads, ['settling'], `${name}: residual 0 from then on: no further re-read`)
    t.same(faults, [], `${name}: no CONSERVATION_BROKEN, then or ever after`)
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
  t.same(rereads, [], 'a zero residual costs no re-read')
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
    partitionNumbers: [0], lastSeq: [depth], depth: [depth],
    groups: [{ name: 'g', label: 'g', key: gkey, delivered, dropped: 0, dlq: 0, retries: 0, inFlight: 0, maxInFlight: 1, lag: depth, depth, ackFloors: [0], start: 0, ...extra }],
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

t.test('the report has the design §7 shape', async (t) => {
  const { check } = checker()
  const topic = model('shape', 1)
  addGroup(topic, 'g', { delivered: 2, dropped: 1, floors: [3] })
  produce(topic, 0, 5)
  t.same(check(snapshotOf(topic)), {
    topics: [{
      topic: 'shape', label: 'shape', produced: 5, dropped: 1, dlq: 0, dlq_within_dropped: true,
      groups: [{ group: 'g', label: 'g', delivered: 2, dropped: 1, depth: 2, residual: 0, quiet: true, in_flight: 0, in_flight_within_depth: null }],
    }],
  })
  t.throws(() => new (require('../dist/core/conservation.js').ConservationChecker)(), TypeError, 'the callback is required')
})

t.test('a producer stopped mid-write (its writing marker set) is never taken for a quiet moment', async (t) => {
  // The torn state a preempted producer leaves looks the same to both reads; only its marker
  // (TopicSnapshot.producing) tells it apart. Without that check it would raise a false
  // CONSERVATION_BROKEN.
  const { check, faults } = checker()
  const topic = model('torn', 1)
  const g = addGroup(topic, 'g')
  produce(topic, 0, 5)
  settle(topic, g, 0, 5)
  const torn = topicSnapshot(topic, { produced: 6, producing: true }) // counter written, last_seq not yet
  let report = check(snapshotOf(torn), () => torn)
  t.same([groupRow(report, 'torn', 'g').residual, groupRow(report, 'torn', 'g').quiet], [1, false], 'a producer mid-write: a transient, never a quiet moment')
  produce(topic, 0, 1) // the producer finishes its write
  report = check(snapshotOf(topic))
  t.same([groupRow(report, 'torn', 'g').residual, groupRow(report, 'torn', 'g').quiet], [0, true], 'the finished write balances')
  settle(topic, g, 0, 1)
  report = check(snapshotOf(topic))
  t.equal(groupRow(report, 'torn', 'g').residual, 0, 'and honest progress stays at residual 0')
  t.same(faults, [], 'no false CONSERVATION_BROKEN')
})

t.test('the residual is exact across the number/bigint boundaries (against a BigInt reference)', async (t) => {
  // The baseline is one balance (produced − delivered − dropped − depth, at registration): this checks that
  // its fast path (plain numbers) and its bigint path agree with exact arithmetic everywhere.
  const { prng } = require('./helpers')
  const random = prng(4242)
  const near = [0n, 2n ** 50n - 3n, 2n ** 50n, 2n ** 52n, 2n ** 53n - 1n, 2n ** 53n + 1n, 2n ** 63n]
  const pick = () => near[Math.floor(random() * near.length)] + BigInt(Math.floor(random() * 1000))
  const asCount = (v) => (v <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(v) : v)
  let wrong = 0
  for (let i = 0; i < 300; i++) {
    const { check } = checker()
    const key = {}
    const gkey = {}
    const at = (produced, delivered, dropped, depth, start) => snapshotOf({
      name: 'edge', label: 'edge', key, produced: asCount(produced), bytes: 0, delivered: asCount(delivered), dropped: asCount(dropped), dlq: 0,
      partitionNumbers: [0], lastSeq: [Number(depth)], depth: [Number(depth)],
      groups: [{ name: 'g', label: 'g', key: gkey, delivered: asCount(delivered), dropped: asCount(dropped), dlq: 0, retries: 0, inFlight: 0, maxInFlight: 1, lag: Number(depth), depth: Number(depth), ackFloors: [0], start }],
    })
    const first = [pick(), pick(), pick(), BigInt(Math.floor(random() * 1e6))]
    const second = [pick(), pick(), pick(), BigInt(Math.floor(random() * 1e6))]
    const balance = first[0] - first[1] - first[2] - first[3] // the balance at registration, exact
    const start = balance <= BigInt(Number.MAX_SAFE_INTEGER) && balance >= -BigInt(Number.MAX_SAFE_INTEGER) ? Number(balance) : balance
    const got = check(at(...second, start)).topics[0].groups[0].residual
    const expected = (second[0] - first[0]) - (second[1] - first[1]) - (second[2] - first[2]) - (second[3] - first[3])
    const exact = expected <= BigInt(Number.MAX_SAFE_INTEGER) && expected >= -BigInt(Number.MAX_SAFE_INTEGER) ? Number(expected) : expected
    if (got !== exact) {
      wrong++
      if (wrong <= 3) t.equal(got, exact, `case ${i}: ${first} → ${second}`)
    }
  }
  t.equal(wrong, 0, '300 random pairs of moments around 2^50, 2^52, 2^53 and 2^63: every residual exact')
})

t.test('in_flight above depth, in a group settled per message, is IN_FLIGHT_EXCEEDS_DEPTH: once per episode, on confirmed numbers only', async (t) => {
  // Every message in flight is one the group has not settled, so in_flight ≤ depth. A message
  // counted in flight twice (dispatch() and send()) breaks that once the group has caught up.
  const { check, faults, rereads } = checker()
  const topic = model('orders', 2)
  const g = addGroup(topic, 'g', { settledPerMessage: true })
  produce(topic, 0, 3)
  produce(topic, 1, 2)
  g.inFlight = 5 // everything owed is in flight: the bound, held
  let row = groupRow(check(snapshotOf(topic)), 'orders', 'g')
  t.same([row.in_flight, row.depth, row.in_flight_within_depth], [5, 5, true])
  t.same([faults, rereads], [[], []], 'in_flight = depth: no fault, and no re-read needed')

  settle(topic, g, 0, 3)
  settle(topic, g, 1, 1)
  g.inFlight = 2 // one owed (depth 1), two in flight: one of them counted twice
  const busy = check(snapshotOf(topic), (ts) => ({ ...ts, groups: ts.groups.map((x) => ({ ...x, inFlight: 1 })) }))
  t.equal(groupRow(busy, 'orders', 'g').in_flight_within_depth, true, 'a re-read that saw in_flight move is no quiet moment: the report does not judge it')
  t.same(faults, [], 'nor does the check')
  check(snapshotOf(topicSnapshot(topic, { producing: true })))
  t.same(faults, [], 'nor is one with a write under way')
  t.equal(groupRow(check(snapshotOf(topic)), 'orders', 'g').in_flight_within_depth, false, 'confirmed: the report shows the bound broken')
  t.match(faults, [{ code: 'IN_FLIGHT_EXCEEDS_DEPTH', metric: 'mq_group_in_flight', labels: { topic: 'orders', group: 'g' }, previous: 1, attempted: 2 }],
    'confirmed by a re-read: previous is what the group owes, attempted what in_flight says')
  check(snapshotOf(topic))
  t.equal(faults.length, 1, 'once per episode')

  produce(topic, 0, 10)
  row = groupRow(check(snapshotOf(topic)), 'orders', 'g')
  t.same([row.in_flight_within_depth, faults.length], [true, 1], 'a backlog hides the excess: nothing to report')
  settle(topic, g, 0, 10)
  settle(topic, g, 1, 1)
  g.inFlight = 1 // the stuck count, visible again
  check(snapshotOf(topic))
  t.equal(faults.length, 1, 'the same episode: a count stuck above depth is reported once')

  g.inFlight = 0 // the broker ended what dispatch() counted (delivered(1))
  check(snapshotOf(topic), (ts) => ({ ...ts, groups: ts.groups.map((x) => ({ ...x, inFlight: 1 })) }))
  produce(topic, 0, 1)
  g.inFlight = 2
  check(snapshotOf(topic))
  t.equal(faults.length, 1, 'an end seen by only one read is no end')
  g.inFlight = 0
  check(snapshotOf(topic)) // confirmed: the episode ends
  produce(topic, 1, 1)
  settle(topic, g, 0, 1)
  settle(topic, g, 1, 1)
  g.inFlight = 2 // a new mistake: nothing owed, two in flight
  check(snapshotOf(topic))
  t.same(faults.map((f) => [f.code, f.previous, f.attempted]), [['IN_FLIGHT_EXCEEDS_DEPTH', 1, 2], ['IN_FLIGHT_EXCEEDS_DEPTH', 0, 2]], 'nothing in flight ended the episode: the next excess is a new one')
})

t.test('a group kept by floor is not held to in_flight ≤ depth: its ackFloor() comes before its delivered()', async (t) => {
  // A worker between the two calls shows the floor moved and the message still in flight, for as
  // long as it is preempted; only a group settled per message moves both under one lock.
  const { check, faults } = checker()
  const topic = model('floors', 1)
  const g = addGroup(topic, 'g')
  produce(topic, 0, 4)
  g.inFlight = 4
  g.floors[0] = 4 // ackFloor(0, 4) made, delivered(4) not yet
  const row = groupRow(check(snapshotOf(topic)), 'floors', 'g')
  t.same([row.in_flight, row.depth, row.in_flight_within_depth], [4, 0, null], 'the report shows the numbers, and no verdict')
  t.same(faults, [], 'nor a fault')
})

