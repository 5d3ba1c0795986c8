'use strict'
// The per-message lifecycle (docs/integration.md): append() assigns seqs, send() puts a message
// in flight, redeliver() counts a retry without counting it in flight twice, settle() counts the
// outcome and keeps the floor from out-of-order settlements; dispatched() counts without refusing;
// `from: 'latest'`; gaps; conservation from registration. Every case on both backends.
const t = require('tap')
const { backends, surfaceOn, faultsOf, played, prng, scriptedWorker } = require('./helpers')
const { ConservationChecker } = require('../dist/core/conservation')
const { C_SLOT_CHUNKS } = require('../dist/core/layout')

const codes = (faults) => faults.map((f) => f.code)
const group = (s, topic, name) => s.stats('groups', { topic, group: name }).groups[0]
const conservation = (s, topic, name) => s.stats('conservation', { topic, group: name }).topics[0].groups[0]

for (const backend of backends()) {
  t.test(`${backend}: append() assigns the next seqs; a batch returns its last; read_only refuses with 0`, (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    t.same([topic.append(0, 10), topic.append(0, 10), topic.append(0, 30, 3), topic.append(1, 5)], [1, 2, 5, 1])
    t.equal(topic.lastSeq(0), 5)
    t.equal(topic.lastSeq(7), 0, 'a partition never written: 0')
    s.replicationRound({ replicas: 3, inSync: 1 })
    t.equal(topic.append(0, 10), 0, 'read_only: refused')
    t.same(codes(faults), ['WRITE_WHILE_READ_ONLY'])
    t.equal(topic.lastSeq(0), 5, 'and nothing changed')
    t.throws(() => topic.append(0, 10, 0), RangeError, 'count 0 appends nothing: refused')
    t.throws(() => topic.append(0, -1), RangeError)
    t.throws(() => topic.append('0', 1), TypeError)
    t.equal(s.stats('topics').totals.produced, 6)
    t.end()
  })

  t.test(`${backend}: out-of-order settlements keep the floor, depth, lag and in_flight in one call`, (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    const g = topic.group('billing')
    for (let i = 0; i < 6; i++) topic.append(0, 100)
    for (const seq of [1, 2, 3, 4]) t.ok(g.send(0, seq))
    t.equal(g.inFlight(), 4)
    t.ok(g.settle(0, 3, 'delivered'))
    t.ok(g.settle(0, 2, 'dropped'))
    t.equal(g.floor(0), 0, 'seq 1 is still owed: the floor stays')
    t.same([group(s, 'orders', 'billing').lag, group(s, 'orders', 'billing').in_flight], [6, 2])
    t.ok(g.settle(0, 1, 'delivered'))
    t.equal(g.floor(0), 3, 'seqs 1–3 settled: the floor jumps over all of them')
    t.ok(g.settle(0, 6, 'dropped'), 'a message never sent (expired) is settled without a dispatch')
    t.equal(g.inFlight(), 1, 'and leaves in_flight alone')
    t.ok(g.settle(0, 4, 'delivered'))
    t.ok(g.settle(0, 5, 'delivered'))
    const numbers = group(s, 'orders', 'billing')
    t.same([numbers.delivered, numbers.dropped, numbers.in_flight, numbers.lag, numbers.depth, g.floor(0)], [4, 2, 0, 0, 0, 6])
    t.same(s.stats('partitions').partitions[0].depth, 0)
    t.equal(conservation(s, 'orders', 'billing').residual, 0)
    t.same(codes(faults), [])
    t.end()
  })

  t.test(`${backend}: a thread stopped inside a group's locked call is not taken for a broken identity; once it is out, a real one shows`, (t) => {
    // A worker descheduled half-way through settle() leaves torn numbers (delivered counted, its
    // floor not yet) that two reads can both see. Forced here: the release of the group's lock after
    // a settle() is held back, as if the thread had stopped before its last writes.
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    const g = topic.group('g')
    const h = topic.group('h')
    topic.append(0, 1)
    t.ok(g.send(0, 1))
    const cas = Atomics.compareExchange
    let held
    Atomics.compareExchange = function (cells, index, expected, replacement) {
      if (held === undefined && replacement === 0 && expected !== 0) return (held = [cells, index, expected]), expected // the release, skipped
      return cas(cells, index, expected, replacement)
    }
    try {
      t.ok(g.settle(0, 1, 'delivered'))
    } finally {
      Atomics.compareExchange = cas
    }
    t.ok(held !== undefined && Atomics.load(held[0], held[1]) !== 0, "g's lock is still held")
    t.ok(h.dispatch(1))
    h.delivered(1) // counted, but h's floor never moves: a real break, quiet (nothing in flight)
    const hOf = () => s.stats('conservation').topics[0].groups.find((x) => x.group === 'h')
    t.same([hOf().residual, hOf().quiet], [-1, false], "while g's lock is held, no group of the topic is quiet")
    t.same(codes(faults), [])
    cas(held[0], held[1], held[2], 0) // the thread goes on and releases it
    t.same([hOf().residual, hOf().quiet], [-1, true])
    t.same(codes(faults), ['CONSERVATION_BROKEN'], 'then the break is reported')
    t.end()
  })

  t.test(`${backend}: a busy group settled per message has its identity checked at every scrape, not only when nothing is in flight`, (t) => {
    // A broker under load always has something in flight: the check waited for a quiet window
    // that never came, and a double count went unseen for as long as the load lasted.
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s, { ignore: ['IN_FLIGHT_UNDERFLOW'] })
    const topic = s.topic('orders')
    const g = topic.group('g')
    for (let i = 1; i <= 20; i++) {
      topic.append(0, 1)
      g.send(0, i)
      if (i > 2) g.settle(0, i - 2, 'delivered') // two in flight at every moment
      if (i % 5 === 0) s.stats('conservation')
    }
    t.same(codes(faults), [], 'honest and busy: nothing reported')
    t.same([conservation(s, 'orders', 'g').residual, conservation(s, 'orders', 'g').in_flight], [0, 2])
    // A double count: a message counted by count as well as per message, which delivered() allows
    // only while some partition of the topic has no window of the group (a new one, here).
    topic.append(1, 1)
    g.delivered(1)
    t.ok(g.send(1, 1), 'a window on every partition again: settled per message')
    const row = conservation(s, 'orders', 'g')
    t.same([row.residual, row.quiet, row.in_flight], [-1, false, 2], 'busy, not quiet')
    t.same(codes(faults), ['CONSERVATION_BROKEN'], 'reported at the first scrape after it, messages still in flight')
    t.end()
  })

  t.test(`${backend}: topic.partitions() lists the partitions seen, by any thread, ascending`, async (t) => {
    const s = surfaceOn(t, backend)
    const topic = s.topic('orders')
    t.same(topic.partitions(), [], 'none before the first append')
    topic.append(3, 1)
    topic.group('g').ackFloor(1, 0) // an ack floor makes a partition seen too
    const list = topic.partitions()
    t.same(list, [1, 3])
    list.push(9)
    t.same(topic.partitions(), [1, 3], 'a copy the caller may change')
    const worker = await scriptedWorker(s)
    t.teardown(() => worker.close())
    await worker.call('orders', undefined, 'append', 0, 1)
    t.same(topic.partitions(), [0, 1, 3], 'one a worker appended to')
    s.removeTopic('orders')
    t.throws(() => topic.partitions(), { code: 'TOPIC_REMOVED' })
  })

  t.test(`${backend}: a second settlement, one above last_seq, or outside the window counts nothing`, (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    const g = topic.group('billing', { settle_window: 32 })
    t.same([g.settleWindow, g.maxInFlight, topic.group('other').settleWindow], [32, s.config.max_in_flight, 1024], 'a group says its window and bound (the default window 1024)')
    for (let i = 0; i < 40; i++) topic.append(0, 1)
    t.ok(g.settle(0, 2, 'delivered'))
    const before = JSON.stringify(group(s, 'orders', 'billing'))
    t.notOk(g.settle(0, 2, 'dropped'), 'settled already')
    t.notOk(g.settle(0, 41, 'delivered'), 'never appended')
    t.notOk(g.settle(0, 33, 'delivered'), 'floor 0 + window 32: seq 33 is beyond it')
    t.notOk(g.send(0, 2), 'sending a settled message')
    // Seq 34 shares its bit with seq 2 (34 mod 32), which is settled: still beyond the window.
    t.notOk(g.settle(0, 34, 'delivered'), 'beyond the window, where a settled seq\'s bit is')
    t.notOk(g.send(0, 34))
    t.notOk(g.redeliver(0, 34))
    t.equal(JSON.stringify(group(s, 'orders', 'billing')), before, 'nothing changed')
    t.same(codes(faults), ['ALREADY_SETTLED', 'SEQ_NOT_APPENDED', 'SETTLE_WINDOW_EXCEEDED', 'ALREADY_SETTLED', 'SETTLE_WINDOW_EXCEEDED', 'SETTLE_WINDOW_EXCEEDED', 'SETTLE_WINDOW_EXCEEDED'])
    t.same(faults[0].labels, { topic: 'orders', group: 'billing', partition: '0' })
    t.ok(g.settle(0, 1, 'delivered'))
    t.equal(g.floor(0), 2)
    t.ok(g.settle(0, 33, 'delivered'), 'the window moved with the floor')
    t.notOk(g.settle(0, 1, 'delivered'), 'below the floor: settled already')
    t.throws(() => g.settle(0, 0, 'delivered'), { name: 'RangeError', message: 'seq must be an integer from 1 to 2^53 - 1 (the first message of a partition has seq 1), got 0' })
    t.throws(() => g.send(0, '1'), { name: 'TypeError', message: 'seq must be an integer from 1 to 2^53 - 1 (the first message of a partition has seq 1), got the string "1"' }, 'the rule of a seq, not of a count')
    t.throws(() => g.settle(0, 3, 'acked'), TypeError)
    t.throws(() => g.settle(-1, 3, 'delivered'), RangeError)
    t.throws(() => g.settle(0, 1.5, 'delivered'), RangeError)
    t.end()
  })

  t.test(`${backend}: a redelivery counts a retry, never a second message in flight`, (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    const g = topic.group('billing')
    topic.append(0, 1, 2)
    g.send(0, 1)
    for (let i = 0; i < 5; i++) t.ok(g.redeliver(0, 1))
    t.equal(g.inFlight(), 1)
    t.notOk(g.send(0, 1), 'send() again is a fault: use redeliver()')
    t.notOk(g.redeliver(0, 2), 'a message not in flight cannot be redelivered')
    t.same(codes(faults), ['ALREADY_IN_FLIGHT', 'NOT_IN_FLIGHT'])
    g.settle(0, 1, 'delivered')
    t.notOk(g.redeliver(0, 1), 'nor one settled')
    const numbers = group(s, 'orders', 'billing')
    t.same([numbers.retries, numbers.in_flight, numbers.delivered], [5, 0, 1])
    t.end()
  })

  t.test(`${backend}: dispatched() and send() count past max_in_flight and say so; dispatch() still refuses`, (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s, { ignore: ['CONSERVATION_BROKEN'] })
    const topic = s.topic('orders')
    const g = topic.group('billing', { max_in_flight: 2 })
    topic.append(0, 1, 3)
    t.ok(g.dispatched(2))
    t.notOk(g.dispatched(1), 'past the bound: counted, and false')
    t.equal(g.inFlight(), 3)
    t.notOk(g.dispatch(1), 'the refusing form refuses')
    t.equal(g.inFlight(), 3)
    const h = topic.group('other', { max_in_flight: 1 })
    h.send(0, 1)
    t.ok(h.send(0, 2), 'send() counts past the bound (true: the message is in flight)')
    t.equal(h.inFlight(), 2)
    t.same(codes(faults), ['IN_FLIGHT_LIMIT_PASSED', 'IN_FLIGHT_LIMIT_PASSED'])
    t.same([faults[0].previous, faults[0].attempted], [2, 3])
    t.end()
  })

  t.test(`${backend}: from: 'latest' starts at last_seq; 'earliest' owes everything; both balance from registration`, (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    topic.append(0, 1, 10)
    topic.append(1, 1, 4)
    const latest = topic.group('latest', { from: 'latest' })
    const earliest = topic.group('earliest')
    t.same([latest.floor(0), latest.floor(1), earliest.floor(0)], [10, 4, 0])
    t.same([group(s, 'orders', 'latest').lag, group(s, 'orders', 'earliest').lag], [0, 10])
    topic.append(0, 1)
    latest.send(0, 11)
    latest.settle(0, 11, 'delivered')
    t.equal(latest.floor(0), 11)
    t.same([conservation(s, 'orders', 'latest').residual, conservation(s, 'orders', 'earliest').residual], [0, 0])
    t.equal(topic.group('latest', { from: 'earliest' }), latest, 'an existing group: the start is ignored')
    t.throws(() => topic.group('x', { from: 'oldest' }), TypeError)
    t.throws(() => topic.group('x', { settle_window: 33 }), RangeError)
    t.throws(() => topic.group('x', { settle_window: '64' }), TypeError, 'a non-number: TypeError, as for every argument')
    t.throws(() => topic.group('x', { max_in_flight: '5' }), TypeError)
    t.throws(() => topic.group('x', { max_in_flight: 0 }), RangeError)
    t.throws(() => topic.group('x', []), { name: 'TypeError', message: 'group options must be an object, got an array' })
    t.notOk(s.stats('groups').groups.some((g) => g.group === 'x'), 'and no group x was registered')
    // Own keys only, as the configuration reads them: an inherited key is not something the caller wrote.
    const inherited = topic.group('inherited', Object.create({ from: 'latest', max_in_flight: 5, settle_window: 64 }))
    t.equal(inherited.floor(0), 0, 'an inherited from: \'latest\' is not read: the group starts at the earliest')
    t.equal(group(s, 'orders', 'inherited').max_in_flight, 1000, 'an inherited max_in_flight is not read')
    t.equal(topic.group('inherited', Object.create({ max_in_flight: 7, settle_window: 32 })), inherited, 'nor compared with the existing group\'s')
    t.equal(topic.group('inherited', Object.create({ from: 'oldest' })), inherited, 'nor checked')
    t.throws(() => topic.group('latest', { settle_window: 64 }), /registered with settle_window 1024/)
    t.same(codes(faults), [])
    t.end()
  })

  t.test(`${backend}: from committed floors: a group resumes at the seqs it had settled, by partition; bad starts register nothing`, async (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    topic.append(0, 1, 10)
    topic.append(1, 1, 4)
    t.ok(topic.produced(2, 110, 10, 10), 'a resumed log: its counts start after seq 100')
    const resumed = topic.group('resumed', { from: { 0: 6, 2: 105 } })
    t.same([resumed.floor(0), resumed.floor(1), resumed.floor(2)], [6, 0, 105], 'partition 1, left out, starts at its start')
    t.same([group(s, 'orders', 'resumed').depth, group(s, 'orders', 'resumed').lag], [4 + 4 + 5, 5])
    t.equal(conservation(s, 'orders', 'resumed').residual, 0, 'what the start passed over counts as settled before the group')
    t.equal(topic.group('at-base', { from: { 2: 100, 0: 0, 7: 0 } }).floor(2), 100, "a partition's base, or 0 where nothing was appended: its start")
    t.notOk(resumed.settle(0, 6, 'delivered'), 'a seq at or below the committed floor is settled already')
    t.same(codes(faults), ['ALREADY_SETTLED'])
    faults.length = 0
    // Per message on partition 0, floor-level on partition 2 (a commit: the floor first, then the count).
    for (const seq of [7, 8, 9, 10]) resumed.send(0, seq), resumed.settle(0, seq, 'delivered')
    t.ok(resumed.dispatch(5))
    t.ok(resumed.ackFloor(2, 110))
    resumed.delivered(5)
    const numbers = group(s, 'orders', 'resumed')
    t.same([numbers.delivered, numbers.in_flight, numbers.depth, resumed.floor(0), resumed.floor(2)], [9, 0, 4, 10, 110])
    t.equal(conservation(s, 'orders', 'resumed').residual, 0)
    s.render()
    t.same(codes(faults), [], 'the scrape finds the books balanced')

    const refused = [
      [{ 0: 11 }, RangeError, /cannot start at seq 11 of partition 0: its last_seq is 10/],
      [{ 2: 99 }, RangeError, /counts start after seq 100, so the messages from 100 to 100 were never counted/],
      [{ 5: 1 }, RangeError, /partition 5: its last_seq is 0/],
      [{ 0: 3, 1: 5 }, RangeError, /partition 1: its last_seq is 4/],
      [{ 0: -1 }, RangeError, /from\[0\] must be a non-negative integer/],
      [{ 0: 1.5 }, RangeError, /from\[0\]/],
      [{ 0: '3' }, TypeError, /from\[0\] must be a non-negative integer, got/],
      [{ '-1': 1 }, RangeError, /partition must be an integer from 0/],
      [{ '01': 1 }, TypeError, /from: "01" is not a partition number/],
      [{ p0: 1 }, TypeError, /from: "p0" is not a partition number/],
      [new Map([[0, 3]]), TypeError, /from must be 'earliest', 'latest' or an object of partition → committed seq, got/],
      [[3], TypeError, /from must be/],
      [null, TypeError, /from must be/],
      [6, TypeError, /from must be/],
      [{ [Symbol('p')]: 1 }, TypeError, /from: a symbol is not a partition number/],
    ]
    for (const [from, type, message] of refused) {
      t.throws(() => topic.group('x', { from }), { name: type.name, message }, `from ${JSON.stringify(from) ?? String(from)}`)
    }
    t.notOk(s.stats('groups').groups.some((g) => g.group === 'x'), 'and no group x was registered')
    t.equal(topic.group('resumed', { from: { 0: 1 } }), resumed, 'an existing group: the start is ignored, as any start')
    t.equal(resumed.floor(0), 10)
    const hidden = Object.defineProperty({}, '0', { value: 4, enumerable: false })
    t.equal(topic.group('hidden', { from: hidden }).floor(0), 4, 'a floor under a key not enumerable is read all the same, not passed over')

    // From a worker thread: the same start, checked there the same way.
    const worker = await scriptedWorker(s)
    t.teardown(() => worker.close())
    t.same(await worker.call('orders', undefined, 'group', 'theirs', { from: { 0: 8, 2: 109 } }), { group: 'theirs' })
    const theirs = topic.group('theirs')
    t.same([theirs.floor(0), theirs.floor(1), theirs.floor(2)], [8, 0, 109])
    await t.rejects(worker.call('orders', undefined, 'group', 'bad', { from: { 0: 12 } }), { message: /its last_seq is 10/ })
    t.same(group(s, 'orders', 'theirs').depth, 2 + 4 + 1)
    t.equal(conservation(s, 'orders', 'theirs').residual, 0)
    t.notOk(s.stats('groups').groups.some((g) => g.group === 'bad'))
    t.same(codes(faults), [])
  })

  t.test(`${backend}: a start that skips more than 2^53 − 1 messages over its partitions is kept exact: no false fault`, (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('big')
    const M = Number.MAX_SAFE_INTEGER
    t.ok(topic.produced(0, M, 0, M))
    t.ok(topic.produced(1, M - 1, 0, M - 1))
    const committed = topic.group('committed', { from: { 0: M - 1, 1: M - 2 } })
    const latest = topic.group('latest', { from: 'latest' })
    t.same([committed.floor(0), committed.floor(1), latest.floor(0), latest.floor(1)], [M - 1, M - 2, M, M - 1])
    const groups = s.snapshot().topics[0].groups
    t.same(groups.map((g) => [g.name, g.start]), [['committed', 2n * BigInt(M) - 3n], ['latest', 2n * BigInt(M) - 1n]], 'each start exact: a bigint past 2^53 − 1')
    t.same(conservation(s, 'big', 'committed').residual, 0)
    t.same(conservation(s, 'big', 'latest').residual, 0)
    t.same(group(s, 'big', 'committed').depth, 2)
    s.render()
    t.same(codes(faults), [], 'honest books: no fault')
    committed.dispatch(2)
    committed.ackFloor(0, M)
    committed.delivered(2) // two delivered, the floor passed one
    s.render()
    t.same(codes(faults), ['CONSERVATION_BROKEN'], 'and a mistake there shows')
    t.equal(conservation(s, 'big', 'committed').residual, -1, 'exactly')
    t.end()
  })

  t.test(`${backend}: conservation holds from registration: a mistake before the first scrape is reported`, (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    const g = topic.group('billing')
    topic.produced(0, 5, 50, 5)
    g.dispatch(5)
    g.delivered(5) // five deliveries, but the floor is never raised: the books do not balance
    s.render()
    t.same(codes(faults), ['CONSERVATION_BROKEN'], 'the first scrape reports it')
    t.equal(conservation(s, 'orders', 'billing').residual, -5)
    t.end()
  })

  t.test(`${backend}: a gap in explicit seqs is refused (SEQ_GAP); a log may start above seq 1`, (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    const g = topic.group('billing')
    t.ok(topic.produced(0, 1000, 10, 1), 'a resumed log: the first message is seq 1000')
    t.same([group(s, 'orders', 'billing').lag, g.floor(0)], [1, 999], 'only that message is owed')
    const before = s.stats('topics').totals
    t.throws(() => topic.produced(0, 1002, 10, 1), { code: 'SEQ_GAP', previous: 1000, attempted: 1002 })
    t.same(s.stats('topics').totals, before, 'nothing changed')
    t.equal(topic.lastSeq(0), 1000)
    t.ok(topic.produced(0, 1003, 30, 3), 'a batch that continues the log')
    t.equal(topic.append(0, 1), 1004)
    for (let seq = 1000; seq <= 1004; seq++) g.settle(0, seq, 'delivered')
    t.same([g.floor(0), conservation(s, 'orders', 'billing').residual], [1004, 0])
    t.same(codes(faults), ['SEQ_GAP'])
    t.end()
  })

  t.test(`${backend}: a partition settled per message refuses ackFloor() (one floor, one keeper)`, (t) => {
    const s = surfaceOn(t, backend)
    const topic = s.topic('orders')
    const g = topic.group('billing')
    topic.append(0, 1, 3)
    topic.append(1, 1, 3)
    g.settle(0, 1, 'delivered')
    t.throws(() => g.ackFloor(0, 3), { name: 'UsageError', code: 'FLOOR_KEPT_BY_SETTLE' })
    t.equal(g.floor(0), 1)
    t.ok(g.ackFloor(1, 2), 'another partition keeps its floor by ackFloor()')
    t.end()
  })

  t.test(`${backend}: a group settled per message on every partition refuses count-level dispatch, delivered() and dropped() (IN_FLIGHT_KEPT_BY_SEND)`, (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    const g = topic.group('billing')
    topic.append(0, 1, 3)
    t.ok(g.dispatch(1), 'no window yet: the floor-level style, allowed')
    t.ok(g.send(0, 1), 'and send() of that message too (not caught: the first window is made by it)')
    t.equal(g.inFlight(), 2, 'counted twice, as documented')
    // From now on every in-flight message of this group is one send() counted.
    t.throws(() => g.dispatch(1), { name: 'UsageError', code: 'IN_FLIGHT_KEPT_BY_SEND' }, 'a redelivery counted by dispatch()')
    t.throws(() => g.dispatched(1), { name: 'UsageError', code: 'IN_FLIGHT_KEPT_BY_SEND' }, 'the counting form too')
    t.throws(() => g.dispatch(0), { code: 'IN_FLIGHT_KEPT_BY_SEND' }, 'whatever n')
    t.equal(g.inFlight(), 2, 'nothing counted')
    t.ok(g.redeliver(0, 1), 'the retry path')
    t.ok(g.settle(0, 1, 'delivered'))
    const delivered = () => s.stats('groups').groups.find((x) => x.group === 'billing').delivered
    t.throws(() => g.delivered(1), { name: 'UsageError', code: 'IN_FLIGHT_KEPT_BY_SEND', message: /settle\(\) counts what it delivers and drops, and delivered\(\) would count a message twice.*use settle\(partition, seq, 'delivered'\)/ }, 'an acknowledgement counted by count: settle() counts them')
    t.throws(() => g.dropped(2), { name: 'UsageError', code: 'IN_FLIGHT_KEPT_BY_SEND', message: /use settle\(partition, seq, 'dropped'\)/ }, 'a drop too')
    t.same([g.inFlight(), delivered()], [1, 1], 'nothing counted: the message dispatch() counted stays in flight (docs/integration.md: switch once it is settled)')
    // A second partition kept by floor: dispatch() is for its messages, allowed again.
    topic.append(1, 1, 2)
    t.ok(g.dispatch(1), 'partition 1 has no window')
    t.ok(g.ackFloor(1, 1))
    g.delivered(1)
    g.settle(1, 2, 'delivered') // partition 1 now settled per message as well
    t.throws(() => g.dispatch(1), { code: 'IN_FLIGHT_KEPT_BY_SEND' }, 'every partition has a window again')
    t.ok(topic.group('other').dispatch(1), "another group's windows are its own")
    t.same(codes(faults), [])
    t.end()
  })

  t.test(`${backend}: a message counted in flight twice shows once the group has caught up (IN_FLIGHT_EXCEEDS_DEPTH, once per episode)`, async (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    const g = topic.group('billing')
    const honest = topic.group('audit')
    topic.append(0, 1, 3)
    t.ok(g.dispatch(1), 'no window yet: the floor-level style')
    t.ok(g.send(0, 1), 'and send() of the same message: counted in flight twice')
    t.ok(g.send(0, 2))
    for (const seq of [1, 2, 3]) honest.send(0, seq) // everything owed in flight: in_flight = depth
    s.render()
    t.same(codes(faults), [], 'the group owes 3 and has 3 in flight: nothing to see yet')
    g.settle(0, 1, 'delivered')
    g.settle(0, 2, 'delivered')
    g.settle(0, 3, 'dropped')
    t.same([g.inFlight(), g.floor(0)], [1, 3], 'everything settled, one still in flight for ever')
    const row = conservation(s, 'orders', 'billing')
    t.same([row.residual, row.depth, row.in_flight, row.in_flight_within_depth], [0, 0, 1, false], 'the identity holds; the bound does not')
    t.match(faults, [{ code: 'IN_FLIGHT_EXCEEDS_DEPTH', metric: 'mq_group_in_flight', labels: { topic: 'orders', group: 'billing' }, previous: 0, attempted: 1 }])
    s.render()
    s.stats('conservation')
    t.equal(faults.length, 1, 'once per episode, whichever path reads')
    t.equal(s.stats('faults').counts.IN_FLIGHT_EXCEEDS_DEPTH, 1)
    topic.append(0, 1)
    s.render()
    g.send(0, 4)
    g.settle(0, 4, 'delivered')
    s.render()
    t.same([g.inFlight(), conservation(s, 'orders', 'audit').in_flight_within_depth], [1, true], 'the honest group: in_flight 3, depth 4')
    t.same(codes(faults), ['IN_FLIGHT_EXCEEDS_DEPTH'], 'nothing more: the stuck count is one episode; the honest group never raised one')
  })

  t.test(`${backend}: a switch to per-message settlement with a dispatched message unsettled leaves it in flight: IN_FLIGHT_EXCEEDS_DEPTH`, async (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    const g = topic.group('billing')
    topic.append(0, 1, 3)
    g.dispatch(1)
    g.ackFloor(0, 1)
    g.delivered(1) // the floor-level style, settled in full: safe to switch from here
    g.dispatch(1) // seq 2, counted by dispatch() …
    t.ok(g.send(0, 3), '… then the switch: seq 3 sent per message')
    t.ok(g.settle(0, 2, 'delivered'), 'seq 2 settled per message: counted, the floor moves, in_flight does not')
    t.ok(g.settle(0, 3, 'delivered'))
    t.same([g.inFlight(), g.floor(0)], [1, 3])
    const row = conservation(s, 'orders', 'billing')
    t.same([row.residual, row.in_flight, row.in_flight_within_depth], [0, 1, false], 'nothing counted twice, and yet in flight for good')
    t.match(faults, [{ code: 'IN_FLIGHT_EXCEEDS_DEPTH', previous: 0, attempted: 1 }])
  })

  t.test(`${backend}: IN_FLIGHT_EXCEEDS_DEPTH for a count made in a worker thread`, async (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const worker = await scriptedWorker(s)
    t.teardown(() => worker.close())
    await worker.call('orders', undefined, 'append', 0, 10, 2)
    t.equal(await worker.call('orders', 'g', 'dispatch', 1), true, "a redelivery counted by dispatch() before the group's window")
    for (const seq of [1, 2]) await worker.call('orders', 'g', 'send', 0, seq)
    s.render()
    t.match(faults, [{ code: 'IN_FLIGHT_EXCEEDS_DEPTH', labels: { topic: 'orders', group: 'g' }, previous: 2, attempted: 3 }], 'found by the main thread from shared memory')
    for (const seq of [1, 2]) await worker.call('orders', 'g', 'settle', 0, seq, 'delivered')
    s.render()
    t.same([faults.length, conservation(s, 'orders', 'g').in_flight], [1, 1], 'one episode; the excess stays')
  })

  t.test(`${backend}: a group settled per message on some partitions, whose other floors no ackFloor() moved, is held to in_flight ≤ depth too`, async (t) => {
    // Before, only a group with a window on every partition was checked: a partition another group
    // registered (its ackFloor() on an empty partition) was enough to leave a mistaken dispatch()
    // in flight for good, with no fault.
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    const g = topic.group('billing')
    topic.group('audit').ackFloor(1, 0) // partition 1 registered, empty: billing has no window there
    topic.append(0, 1, 2)
    t.ok(g.dispatch(1), 'accepted: partition 1 has no window of the group')
    for (const seq of [1, 2]) g.send(0, seq), g.settle(0, seq, 'delivered')
    t.same([g.inFlight(), g.floor(0), g.floor(1)], [1, 2, 0], 'everything settled, the dispatch() still in flight')
    const row = conservation(s, 'orders', 'billing')
    t.same([row.residual, row.depth, row.in_flight, row.in_flight_within_depth], [0, 0, 1, false], 'the identity holds; the bound does not')
    t.match(faults, [{ code: 'IN_FLIGHT_EXCEEDS_DEPTH', labels: { topic: 'orders', group: 'billing' }, previous: 0, attempted: 1 }])
    s.render()
    t.equal(faults.length, 1, 'once per episode')
    // The same holds for a group kept by floor that has not moved a floor yet: more in flight than
    // was ever produced.
    const early = s.topic('early').group('g')
    t.ok(early.dispatch(2), 'dispatched before anything was produced')
    t.same(conservation(s, 'early', 'g').in_flight_within_depth, false)
    t.same(codes(faults), ['IN_FLIGHT_EXCEEDS_DEPTH', 'IN_FLIGHT_EXCEEDS_DEPTH'])
  })

  t.test(`${backend}: a switch to per-message settlement on the partitions whose floor ackFloor() moved, the others never used or kept by a floor ackFloor() never moved: IN_FLIGHT_EXCEEDS_DEPTH`, async (t) => {
    // Before, a group whose floor ackFloor() had moved was checked again only with a window on
    // every partition of its topic: a partition it never used (registered by another group) kept
    // the mistake of a switch made with a dispatched message unsettled unreported for good.
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    const g = topic.group('billing')
    topic.group('audit').ackFloor(1, 0) // partition 1 registered, empty: billing never uses it
    topic.append(0, 1, 3)
    g.dispatch(1)
    g.ackFloor(0, 1) // a floor moved: the group was kept by floor
    g.delivered(1)
    g.dispatch(1) // seq 2, counted by dispatch() …
    t.ok(g.send(0, 3), '… then the switch on partition 0: seq 3 sent per message')
    t.ok(g.settle(0, 2, 'delivered'))
    t.ok(g.settle(0, 3, 'delivered'))
    t.same([g.inFlight(), g.floor(0), g.floor(1)], [1, 3, 0])
    const row = conservation(s, 'orders', 'billing')
    t.same([row.residual, row.depth, row.in_flight, row.in_flight_within_depth], [0, 0, 1, false], 'nothing owed, one in flight for good')
    t.match(faults, [{ code: 'IN_FLIGHT_EXCEEDS_DEPTH', labels: { topic: 'orders', group: 'billing' }, previous: 0, attempted: 1 }])
    // A floor the group started at, or one expire() moved, on the partition it never settles: no
    // floor of those leads its counts either, and none leaves the group unchecked.
    for (const [name, options, before] of [['latest', { from: 'latest' }], ['committed', { from: { 0: 0, 1: 2 } }], ['expired', undefined, (h) => h.expire(1, 2)]]) {
      const other = s.topic(name)
      other.append(1, 1, 2) // partition 1: two messages before the group
      const h = other.group('g', options)
      before?.(h)
      other.append(0, 1, 3)
      h.dispatch(1), h.ackFloor(0, 1), h.delivered(1)
      h.dispatch(1)
      h.send(0, 3), h.settle(0, 2, 'delivered'), h.settle(0, 3, 'delivered')
      t.same([h.floor(1), conservation(s, name, 'g').in_flight_within_depth], [2, false], `${name}: a floor at 2 on partition 1, not moved by ackFloor(); checked`)
    }
    t.same(codes(faults), Array(4).fill('IN_FLIGHT_EXCEEDS_DEPTH'))
    // A partition whose floor ackFloor() moved, not settled per message, still leaves the group
    // unchecked: that floor may lead its counts.
    const kept = s.topic('kept-1')
    kept.append(1, 1, 2)
    const h = kept.group('g')
    h.dispatch(2), h.ackFloor(1, 2), h.delivered(2)
    kept.append(0, 1, 3)
    h.dispatch(1), h.ackFloor(0, 1), h.delivered(1)
    h.dispatch(1)
    h.send(0, 3), h.settle(0, 2, 'delivered'), h.settle(0, 3, 'delivered')
    t.same(conservation(s, 'kept-1', 'g').in_flight_within_depth, null, 'partition 1 kept by a floor ackFloor() moved: no verdict')
    // Partitions of one number modulo 32 share a mark: a floor on partition 33 that ackFloor()
    // never moved counts as moved once partition 1's was (no verdict, never a false one); on 34 it
    // does not.
    for (const [other, verdict] of [[33, null], [34, false]]) {
      const topic = s.topic(`beside-${other}`)
      const k = topic.group('g')
      t.ok(k.ackFloor(other, 0), `partition ${other}: a floor of the group, not moved`)
      topic.append(1, 1, 3)
      k.dispatch(1), k.ackFloor(1, 1), k.delivered(1)
      k.dispatch(1)
      k.send(1, 3), k.settle(1, 2, 'delivered'), k.settle(1, 3, 'delivered')
      t.same(conservation(s, `beside-${other}`, 'g').in_flight_within_depth, verdict, `partition 1 switched, ${other} kept by a floor not moved: ${verdict === null ? 'no verdict' : 'checked'}`)
    }
    t.same(codes(faults), Array(5).fill('IN_FLIGHT_EXCEEDS_DEPTH'))
    // Switched on that partition too: checked again.
    kept.append(1, 1)
    t.ok(h.send(1, 3) && h.settle(1, 3, 'delivered'))
    t.same(conservation(s, 'kept-1', 'g').in_flight_within_depth, false, 'settled per message on every partition')
    t.same(codes(faults), Array(6).fill('IN_FLIGHT_EXCEEDS_DEPTH'))
  })

  t.test(`${backend}: a group whose floor ackFloor() moved, in any thread, is not held to in_flight ≤ depth: its ackFloor() comes before its delivered()`, async (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    const g = topic.group('billing')
    topic.append(0, 1)
    topic.append(1, 1, 2)
    g.send(0, 1)
    g.settle(0, 1, 'delivered') // partition 0 settled per message
    t.ok(g.dispatch(2), 'partition 1 kept by floor')
    t.same(conservation(s, 'orders', 'billing').in_flight_within_depth, true, 'checked until a floor moves: 2 in flight, 2 owed')
    const worker = await scriptedWorker(s)
    t.teardown(() => worker.close())
    t.equal(await worker.call('orders', 'billing', 'ackFloor', 1, 2), true, "a worker's ackFloor(), its delivered() not yet made")
    const row = conservation(s, 'orders', 'billing')
    t.same([row.depth, row.in_flight, row.in_flight_within_depth], [0, 2, null], 'in flight above what is owed for now: no verdict')
    s.render()
    g.delivered(2)
    t.same(conservation(s, 'orders', 'billing').residual, 0)
    t.same(codes(faults), [], 'no fault at any point')
  })

  t.test(`${backend}: an ackFloor() refused for want of memory moves no floor, and leaves the group held to in_flight ≤ depth`, async (t) => {
    // A reviewer's replay: the flag was set before the floor's block was registered, which can
    // throw LimitError; the floor stayed where it was and the group went unchecked for good.
    const { main, worker, read } = played(backend)
    const kept = main.handles.topic('kept')
    kept.produced(0, 1, 10)
    const g = kept.group('g')
    const many = main.handles.topic('many')
    many.produced(0, 1, 1)
    const spare = Array.from({ length: 16 }, (_, i) => many.group(`f${i}`)) // registered before the memory fills
    for (const side of [main, worker]) side.registry.slotChunkLimit = main.memory.control[C_SLOT_CHUNKS]
    for (let n = 0, refused = false; n < 20_000 && !refused; n++) {
      try { main.handles.topic(`topic-${n}`).produced(0, 1, 1) } catch (error) { if (error.limit !== 'counter_memory') throw error; refused = true }
    }
    // What is left (under 3 slots) taken by other groups' floors (1 slot each) until none fits.
    for (const f of spare) try { f.ackFloor(0, 1) } catch (error) { if (error.limit !== 'counter_memory') throw error; break }
    const keptTopic = () => read().find((x) => x.name === 'kept')
    t.throws(() => g.ackFloor(0, 1), { name: 'LimitError', limit: 'counter_memory' }, 'the floor is refused')
    t.equal(g.floor(0), 0, 'the floor did not move')
    t.equal(keptTopic().groups[0].inFlightBounded, true, 'and the group is still held to in_flight ≤ depth')
    t.ok(g.dispatch(5), 'five dispatched of one produced')
    const faults = []
    new ConservationChecker((f) => faults.push(f.code)).check({ topics: read() }, keptTopic)
    t.same(faults, ['IN_FLIGHT_EXCEEDS_DEPTH'], 'in_flight 5 against depth 1: reported')
  })

  t.test(`${backend}: IN_FLIGHT_KEPT_BY_SEND counts the partitions and windows other threads registered`, async (t) => {
    const s = surfaceOn(t, backend)
    const topic = s.topic('orders')
    const g = topic.group('billing')
    topic.append(0, 1)
    g.send(0, 1)
    t.throws(() => g.dispatch(1), { code: 'IN_FLIGHT_KEPT_BY_SEND' })
    const worker = await scriptedWorker(s)
    t.teardown(() => worker.close())
    t.equal(await worker.call('orders', undefined, 'append', 1, 1), 1, 'the worker starts partition 1: no window of this group')
    t.ok(g.dispatch(1), 'not refused: partition 1 has no window of the group')
    t.equal(await worker.call('orders', 'billing', 'settle', 1, 1, 'delivered'), true, 'the worker makes its window')
    t.throws(() => g.dispatch(1), { code: 'IN_FLIGHT_KEPT_BY_SEND' }, "refused again: the worker's window counts")
    t.equal(g.inFlight(), 2)
    // A group whose every window another thread made: this thread has not synced since.
    const h = topic.group('shipping')
    t.ok(h.dispatch(1), 'no window yet')
    t.equal(await worker.call('orders', 'shipping', 'send', 0, 1), true)
    t.equal(await worker.call('orders', 'shipping', 'send', 1, 1), true)
    t.throws(() => h.dispatched(1), { code: 'IN_FLIGHT_KEPT_BY_SEND' }, "windows this thread never replayed count too")
    t.equal(h.inFlight(), 3)
    t.end()
  })

  t.test(`${backend}: the window is reused as the floor moves: 20 windows of shuffled settlements`, (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    const g = topic.group('billing', { settle_window: 64 })
    const random = prng(7)
    const total = 64 * 20
    let settled = 0
    let delivered = 0
    let mismatch = 0
    // The model: the floor is the longest settled prefix.
    const done = []
    let floor = 0
    while (settled < total) {
      const last = topic.append(0, 1, 1 + Math.floor(random() * 8))
      const open = []
      for (let seq = floor + 1; seq <= Math.min(last, floor + 64); seq++) if (!done[seq]) open.push(seq)
      for (let i = open.length - 1; i > 0; i--) {
        const j = Math.floor(random() * (i + 1))
        ;[open[i], open[j]] = [open[j], open[i]]
      }
      for (const seq of open.slice(0, 1 + Math.floor(random() * open.length))) {
        if (random() < 0.5) g.send(0, seq)
        const outcome = random() < 0.8 ? 'delivered' : 'dropped'
        if (outcome === 'delivered') delivered++
        g.settle(0, seq, outcome)
        done[seq] = 1
        settled++
        while (done[floor + 1]) floor++
        if (g.floor(0) !== floor) mismatch++
      }
    }
    t.equal(mismatch, 0, 'the floor matched the model after every settlement')
    const numbers = group(s, 'orders', 'billing')
    t.same([numbers.delivered, numbers.in_flight], [delivered, 0])
    t.equal(conservation(s, 'orders', 'billing').residual, 0)
    t.same(codes(faults), [])
    t.end()
  })

  t.test(`${backend}: window positions stay exact for seqs around 2^52, with a window that is not a power of two`, (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    const start = 2 ** 52 - 100
    t.ok(topic.produced(0, start, 1, 1), 'a resumed log starting 100 below 2^52')
    const g = topic.group('billing', { settle_window: 96 })
    const random = prng(11)
    const done = new Set()
    let floor = start - 1
    let mismatch = 0
    let last = start
    while (floor < 2 ** 52 + 150) {
      last = topic.append(0, 1, 1 + Math.floor(random() * 20))
      const open = []
      for (let seq = floor + 1; seq <= Math.min(last, floor + 96); seq++) if (!done.has(seq)) open.push(seq)
      for (let i = open.length - 1; i > 0; i--) {
        const j = Math.floor(random() * (i + 1))
        ;[open[i], open[j]] = [open[j], open[i]]
      }
      for (const seq of open.slice(0, 1 + Math.floor(random() * open.length))) {
        g.send(0, seq)
        if (!g.isInFlight(0, seq)) mismatch++
        g.settle(0, seq, 'delivered')
        done.add(seq)
        while (done.has(floor + 1)) floor++
        if (g.floor(0) !== floor || g.isInFlight(0, seq)) mismatch++
      }
    }
    t.equal(mismatch, 0, 'in flight after send, settled after settle, the floor the longest settled prefix: every time')
    t.equal(g.inFlight(), 0)
    t.same(codes(faults), [])
    t.equal(g.settle(0, floor, 'delivered'), false, 'a seq at the floor is settled already')
    t.same(codes(faults), ['ALREADY_SETTLED'])
    t.end()
  })

  t.test(`${backend}: any thread settles what another sent; windows survive compaction and leave with the group`, async (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    const g = topic.group('billing')
    for (let i = 0; i < 4; i++) topic.append(0, 1)
    g.send(0, 1)
    g.send(0, 2)
    const worker = await scriptedWorker(s)
    t.teardown(() => worker.close())
    t.equal(await worker.call('orders', 'billing', 'settle', 0, 2, 'delivered'), true)
    t.equal(await worker.call('orders', 'billing', 'settle', 0, 2, 'delivered'), false, 'a duplicate from another thread is caught')
    t.equal(await worker.call('orders', 'billing', 'send', 0, 3), true)
    t.equal(g.inFlight(), 2)
    g.settle(0, 1, 'delivered')
    g.settle(0, 3, 'dropped')
    t.equal(await worker.call('orders', 'billing', 'floor', 0), 3, 'the worker reads the floor the main thread raised')
    t.equal(await worker.call('orders', undefined, 'append', 0, 1), 5, 'and appends after the main thread')
    const numbers = group(s, 'orders', 'billing')
    t.same([numbers.delivered, numbers.dropped, numbers.in_flight, numbers.lag], [2, 1, 0, 2])
    await new Promise((resolve) => setTimeout(resolve, 50))
    t.same(codes(faults), ['ALREADY_SETTLED'])
    t.end()
  })

  t.test(`${backend}: in_flight never goes below 0 through a per-message call: IN_FLIGHT_UNDERFLOW at the call`, async (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s, { ignore: ['CONSERVATION_BROKEN'] }) // the misuse below breaks the identity too, by design
    const topic = s.topic('orders')
    const g = topic.group('billing')
    for (let i = 0; i < 3; i++) topic.append(0, 1)
    // One message settled in both styles (a misuse delivered() allows while a partition of the
    // topic, partition 1 here, has no window of the group): settle() finds nothing left in flight to end.
    g.send(0, 1)
    topic.append(1, 1)
    g.delivered(1)
    t.equal(g.settle(0, 1, 'delivered'), true, 'counted all the same')
    t.match(faults, [{ code: 'IN_FLIGHT_UNDERFLOW', previous: 0, attempted: -1 }], 'reported at the call, not at some later scrape')
    t.equal(g.inFlight(), 0)
    g.send(0, 2)
    t.equal(g.inFlight(), 1, 'the next message sent is in flight: in_flight stayed at 0, not -1')
    t.equal(group(s, 'orders', 'billing').in_flight, 1, 'and /stats shows it')
    g.settle(0, 2, 'delivered')
    // A message dispatched once and settled by count in two threads leaves in_flight below 0 (each
    // thread's fast path reads its own share); the next send() brings it back to 0 first.
    const two = s.topic('two')
    const h = two.group('h')
    two.append(0, 1)
    two.append(1, 1)
    const worker = await scriptedWorker(s)
    t.teardown(() => worker.close())
    faults.length = 0
    h.dispatch(1)
    await worker.call('two', 'h', 'delivered', 1) // the worker's share does not cover it: read across threads, in_flight 1 → 0
    h.delivered(1) // this thread's share does: in_flight −1
    t.same(codes(faults), [], 'the second count is not seen at its call (a lock-free fast path)')
    t.equal(h.send(0, 1), true)
    t.match(faults, [{ code: 'IN_FLIGHT_UNDERFLOW', previous: 0, attempted: -1 }], 'send() repairs it first, as dispatch() does')
    t.equal(h.inFlight(), 1, 'and counts its message: in flight 1')
    t.equal(h.settle(0, 1, 'delivered'), true)
    t.equal(h.inFlight(), 0)
    t.equal(faults.length, 1, 'nothing else')
  })

  t.test(`${backend}: in_flight counts a thread's share that appears after a look found its row without this group's cells`, (t) => {
    // Group.#inFlightAll() skips thread rows that had no chunk of the group's cells at its last
    // look until the arena hands out a chunk (a scrape thread's row, on every send()).
    const { played } = require('./helpers')
    const { main, worker } = played(backend)
    const topic = main.handles.topic('orders')
    const g = topic.group('g', { max_in_flight: 100 })
    for (let i = 0; i < 4; i++) topic.append(0, 1)
    topic.append(1, 1) // kept by count (dispatch() below): no window there
    g.send(0, 1)
    t.equal(g.inFlight(), 1, 'the worker row has no chunk of the group yet')
    g.send(0, 2) // looked again, none yet: no lookup until a chunk is handed out
    const wg = worker.handles.topic('orders').group('g') // the worker maps the group's chunk
    t.equal(wg.send(0, 3), true)
    t.equal(g.inFlight(), 3, "the main thread sees the worker's share")
    t.equal(g.dispatch(97), true, 'dispatch() counts it too: 3 + 97 is the bound')
    t.equal(g.dispatch(1), false, 'and refuses past it')
    t.equal(wg.settle(0, 1, 'delivered'), true, "the worker settles a message the main thread sent (its share goes below 0)")
    t.equal(g.inFlight(), 99)
    t.end()
  })

  t.test(`${backend}: a window costs its two bits per seq and its floor's header, whichever threads use it`, async (t) => {
    // docs/integration.md "Memory": 2 bits per seq in the shared row (the largest window fills
    // half a chunk), a 32-byte header, the partition's 8-byte floor; no thread row of a window's chunk.
    const s = surfaceOn(t, backend, { max_partitions_per_topic: 64 })
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    const PARTITIONS = 40
    for (let p = 0; p < PARTITIONS; p++) topic.append(p, 1)
    const g = topic.group('billing', { settle_window: 131072 })
    const small = topic.group('audit') // the default window: 1,024 seqs
    const before = s.arenaUsage()
    for (let p = 0; p < PARTITIONS; p++) g.send(0 + p, 1)
    const sent = s.arenaUsage()
    t.equal(sent.slotsReserved - before.slotsReserved, PARTITIONS * (131072 / 32 + 4 + 1), 'slots: 4,096 per window (32 KiB), 4 per header, 1 per floor')
    // 40 windows fill 20 chunks; the headers take one more, the floors none (they fit chunks this thread has).
    t.ok(sent.chunks - before.chunks <= PARTITIONS / 2 + 2, `arena chunks: ${sent.chunks - before.chunks} for ${PARTITIONS} windows of 32 KiB`)
    for (let p = 0; p < PARTITIONS; p++) small.settle(p, 1, 'dropped')
    const settled = s.arenaUsage()
    t.equal(settled.slotsReserved - sent.slotsReserved, PARTITIONS * (1024 / 32 + 4 + 1), 'slots: 32 per default window, 4 per header, 1 per floor')
    t.ok(settled.chunks - sent.chunks <= 2, `arena chunks: ${settled.chunks - sent.chunks} for ${PARTITIONS} default windows`)
    const floors = topic.group('floors') // a group that keeps floors pays nothing for windows
    floors.dispatch(PARTITIONS)
    floors.delivered(PARTITIONS) // the first message of each partition, acknowledged by floor below
    const kept = s.arenaUsage()
    for (let p = 0; p < PARTITIONS; p++) floors.ackFloor(p, 1)
    t.equal(s.arenaUsage().slotsReserved - kept.slotsReserved, PARTITIONS, 'slots: 1 per ack floor')
    const worker = await scriptedWorker(s)
    t.teardown(() => worker.close())
    const attached = s.arenaUsage()
    for (let p = 0; p < PARTITIONS; p++) t.equal(await worker.call('orders', 'billing', 'settle', p, 1, 'delivered'), true)
    const after = s.arenaUsage()
    t.equal(after.slotsReserved, attached.slotsReserved, 'a worker on the same windows reserves nothing')
    t.ok(after.chunks - attached.chunks <= 3, `a worker settling on every window maps ${after.chunks - attached.chunks} chunks of its own (its floors and last_seqs), none of the windows'`)
    const numbers = group(s, 'orders', 'billing')
    t.same([numbers.delivered, numbers.in_flight, numbers.lag], [PARTITIONS, 0, 0])
    t.same(codes(faults), [])
  })
}

for (const backend of backends()) {
  // Group handles resolve a partition's cells once and keep the last last_seq they saw; what
  // another thread appends after that must still be sendable, and bad input still refused.
  t.test(`${backend}: a handle's cached view of a partition follows appends from other threads`, async (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    const g = topic.group('billing')
    topic.append(0, 1)
    t.ok(g.send(0, 1), 'the partition is resolved here, last_seq 1')
    const worker = await scriptedWorker(s)
    t.teardown(() => worker.close())
    t.equal(await worker.call('orders', undefined, 'append', 0, 1), 2)
    t.equal(await worker.call('orders', undefined, 'append', 0, 1), 3)
    t.ok(g.send(0, 3), 'seq 3, appended by the worker, is sendable from the main thread')
    t.ok(g.settle(0, 1, 'delivered'))
    t.ok(g.settle(0, 2, 'dropped'), 'never sent, settled')
    t.ok(g.settle(0, 3, 'delivered'))
    t.equal(g.floor(0), 3, 'the floor rose over seqs appended by another thread')
    t.notOk(g.send(0, 4), 'above last_seq')
    t.same(codes(faults), ['SEQ_NOT_APPENDED'])
    t.throws(() => g.send('0', 3), TypeError, 'a partition given as a string is refused, even once resolved')
    t.throws(() => g.settle(0.5, 3, 'delivered'), RangeError)
    t.throws(() => g.settle(0, 2.5, 'delivered'), RangeError)
    topic.removeGroup('billing')
    t.throws(() => g.send(0, 9), { code: 'GROUP_REMOVED' }, 'a removed group throws, above last_seq too')
    t.throws(() => g.settle(0, 3, 'delivered'), { code: 'GROUP_REMOVED' })
    t.same(codes(faults), ['SEQ_NOT_APPENDED'], 'and records nothing')
    t.end()
  })
}

for (const backend of backends()) {
  t.test(`${backend}: settleUpTo() settles a backlog at once; isInFlight() and isSettled() tell a resend from a first send`, (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    const g = topic.group('session', { settle_window: 32 })
    topic.append(0, 1, 100)
    g.send(0, 1)
    g.send(0, 2)
    g.settle(0, 3, 'delivered')
    t.same([g.isInFlight(0, 1), g.isInFlight(0, 3), g.isInFlight(0, 4)], [true, false, false])
    t.same([1, 3, 4, 40].map((seq) => g.isSettled(0, seq)), [false, true, false, false], 'isSettled(): only seq 3, above the floor')
    t.equal(g.settleUpTo(0, 100, 'dropped'), 99, 'everything but seq 3 (settled already), the window and beyond it')
    t.same([1, 3, 50, 100].map((seq) => g.isSettled(0, seq)), [true, true, true, true], 'and at or below the floor, all of them')
    const numbers = group(s, 'orders', 'session')
    t.same([numbers.delivered, numbers.dropped, numbers.in_flight, numbers.lag, g.floor(0)], [1, 99, 0, 0, 100])
    t.equal(g.settleUpTo(0, 100, 'dropped'), 0)
    t.equal(conservation(s, 'orders', 'session').residual, 0)
    t.same(codes(faults), ['ALREADY_SETTLED'])
    t.end()
  })
}
