'use strict'
// The recording API (docs/api.md): each recording call's effect, each invariant, bad inputs, config,
// removal and caps — against every backend.
const t = require('tap')
const { lib, backends, surfaceOn, faultsOf, topicNumbers, played } = require('./helpers')
const { announce } = require('../dist/core/reclamation')
const { C_SLOT_CHUNKS, LOG_CHUNK_INTS } = require('../dist/core/layout')

for (const backend of backends()) {
  t.test(`${backend}: surface.backend says which backend is live`, async (t) => {
    const surface = surfaceOn(t, backend)
    t.equal(surface.backend, backend, 'MQ_METRICS_BACKEND must select the backend')
    t.equal(surface.enabled, true)
    t.equal(surface.quorumState, 0)
  })

  t.test(`${backend}: each call moves exactly its numbers`, async (t) => {
    const surface = surfaceOn(t, backend)
    const orders = surface.topic('orders')
    t.equal(surface.topic('orders'), orders, 'same name must give the same handle')
    const billing = orders.group('billing')
    const audit = orders.group('audit')
    t.equal(orders.group('billing'), billing, 'same group name must give the same handle')
    t.equal(orders.produced(0, 1, 100), true)
    t.equal(orders.produced(0, 3, 50, 2), true)
    t.equal(orders.produced(1, 1, 7), true)
    t.equal(billing.dispatch(2), true)
    billing.delivered(1)
    billing.redelivered(3)
    billing.dropped(1)
    t.equal(billing.deadLettered(1), true)
    t.equal(billing.ackFloor(0, 2), true)
    audit.dispatch()
    audit.delivered()
    t.equal(audit.ackFloor(0, 1), true)
    const n = topicNumbers(surface, 'orders')
    t.same(
      { produced: n.produced, bytes: n.bytes, delivered: n.delivered, dropped: n.dropped, dlq: n.dlq },
      { produced: 4, bytes: 157, delivered: 2, dropped: 1, dlq: 1 },
      'topic counters: produced/bytes as recorded, delivered/dropped/dlq summed over groups',
    )
    t.same(n.partitions, [
      { partition: 0, lastSeq: 3, depth: 2 }, // slowest group (audit) has floor 1
      { partition: 1, lastSeq: 1, depth: 1 },
    ], 'depth = last_seq − the slowest group\'s ack floor')
    const byName = Object.fromEntries(n.groups.map((g) => [g.name, g]))
    t.same(
      { delivered: byName.billing.delivered, dropped: byName.billing.dropped, dlq: byName.billing.dlq, retries: byName.billing.retries, inFlight: byName.billing.inFlight, lag: byName.billing.lag, depth: byName.billing.depth },
      { delivered: 1, dropped: 1, dlq: 1, retries: 3, inFlight: 0, lag: 1, depth: 2 },
      'billing: lag = max_p(last_seq − floor), depth_g = Σ_p(last_seq − floor)',
    )
    t.same({ lag: byName.audit.lag, depth: byName.audit.depth, inFlight: byName.audit.inFlight }, { lag: 2, depth: 3, inFlight: 0 })
    t.same(n.groups.map((g) => g.name), ['audit', 'billing'], 'groups ordered by label')
  })

  t.test(`${backend}: broker-wide gauges`, async (t) => {
    const surface = surfaceOn(t, backend)
    const faults = faultsOf(surface)
    surface.connectionOpened()
    surface.connectionOpened()
    surface.connectionClosed()
    t.equal(surface.snapshot().connections, 1)
    t.equal(surface.setLeaderEpoch(5), true)
    t.equal(surface.setLeaderEpoch(5), true, 'the same epoch again is not a decrease')
    t.equal(surface.setLeaderEpoch(3), false, 'a decrease must be refused')
    t.equal(surface.snapshot().leaderEpoch, 5, 'the stored epoch must be kept')
    t.match(faults, [{ code: 'EPOCH_REGRESSION', metric: 'mq_leader_epoch', previous: 5, attempted: 3 }])
    surface.connectionClosed()
    surface.connectionClosed()
    t.equal(surface.snapshot().connections, 0, 'connections never go below 0')
    t.equal(faults[1].code, 'CONNECTIONS_UNDERFLOW')
  })

  t.test(`${backend}: design §5 invariants — fault or fatal, value kept, nothing half-applied`, async (t) => {
    const surface = surfaceOn(t, backend, { max_in_flight: 3 })
    const faults = faultsOf(surface, { ignore: ['CONSERVATION_BROKEN'] })
    const orders = surface.topic('orders')
    const g = orders.group('g')
    orders.produced(0, 10, 100, 10)
    const before = topicNumbers(surface, 'orders')

    t.throws(() => orders.produced(0, 9, 1), { name: 'FatalInvariantError', code: 'SEQ_REGRESSION', previous: 10, attempted: 9 })
    t.same(topicNumbers(surface, 'orders'), before, 'a fatal last_seq decrease must change nothing')
    t.equal(faults.at(-1).code, 'SEQ_REGRESSION', 'the fatal error is also in the fault log')

    // design §4: the n-th message of a partition has seq n. A batch of `count` ending at `seq` is
    // seqs seq − count + 1 … seq, and each must be above last_seq (10 here).
    const refused = [
      ['the same seq again (one message counted twice)', 10, 1, 10, /would not increase: a batch of 1 ending at seq 10 starts at 10, not above last_seq 10/],
      ['a batch reaching back to last_seq', 12, 3, 10, /a batch of 3 ending at seq 12 starts at 10/],
      ['a batch reaching below it', 11, 5, 7, /starts at 7/],
      ['a batch reaching below seq 1', 11, 15, -3, /a batch of 15 ending at seq 11 would start at seq -3, and a partition's seqs start at 1/],
      ['a lower seq', 9, 1, 9, /would decrease from 10 to 9/],
      ['a lower seq with count 0', 9, 0, 9, /would decrease from 10 to 9/],
    ]
    for (const [what, seq, count, attempted, message] of refused) {
      const faultsBefore = faults.length
      t.throws(() => orders.produced(0, seq, 1, count), { name: 'FatalInvariantError', code: 'SEQ_REGRESSION', previous: 10, attempted, message }, what)
      t.same(topicNumbers(surface, 'orders'), before, `${what}: nothing changes`)
      t.match(faults.slice(faultsBefore), [{ code: 'SEQ_REGRESSION', previous: 10, attempted }], `${what}: in the fault log`)
    }
    const fresh = surface.topic('fresh')
    t.throws(() => fresh.produced(0, 0, 1, 1), { code: 'SEQ_REGRESSION', previous: 0, attempted: 0 }, 'seq 0 for a message: sequences count from 1')
    t.throws(() => fresh.produced(1, 2, 1, 3), { code: 'SEQ_REGRESSION', previous: 0, attempted: 0, message: /a batch of 3 ending at seq 2 would start at seq 0, and a partition's seqs start at 1/ }, 'a first batch of 3 cannot end at 2')
    t.throws(() => fresh.produced(1, 5, 1, 10), { code: 'SEQ_REGRESSION', previous: 0, attempted: -4, message: /a batch of 10 ending at seq 5 would start at seq -4/ }, 'nor a first batch of 10 at 5: the message names the batch')
    t.equal(fresh.produced(0, 0, 0, 0), true, 'count 0 at seq 0: nothing appended, allowed')
    t.equal(fresh.produced(0, 3, 30, 3), true, 'a first batch of 3 ends at 3')
    t.equal(fresh.produced(0, 3, 0, 0), true, 'count 0 at last_seq: nothing appended, allowed')
    t.equal(fresh.produced(0, 4, 10), true, 'the next message is 4')
    t.throws(() => fresh.produced(0, 9, 10, 2), { name: 'FatalInvariantError', code: 'SEQ_GAP', previous: 4, attempted: 8 }, 'a gap is refused (seqs 5–7 never appended)')
    t.match(faults.at(-1), { code: 'SEQ_GAP', labels: { topic: 'fresh', partition: '0' } }, 'and in the fault log')
    t.match(topicNumbers(surface, 'fresh'), { produced: 4, bytes: 40, partitions: [{ partition: 0, lastSeq: 4 }] }, 'nothing of it was counted')
    t.equal(topicNumbers(surface, 'fresh').partitions.length, 1, 'the refused first batch on partition 1 did not register it (its series never appeared)')

    t.equal(g.dispatch(4), false, 'dispatch past max_in_flight must be refused')
    t.equal(g.dispatch(3), true)
    t.equal(g.dispatch(1), false, 'in_flight must never pass max_in_flight')
    t.equal(topicNumbers(surface, 'orders').groups[0].inFlight, 3)

    const override = orders.group('small', { max_in_flight: 1 })
    t.equal(override.dispatch(1), true)
    t.equal(override.dispatch(1), false, 'a per-group max_in_flight override applies')
    t.throws(() => orders.group('small', { max_in_flight: 2 }), RangeError, 'a conflicting override is an error')

    g.delivered(5)
    const n = topicNumbers(surface, 'orders').groups.find((x) => x.name === 'g')
    t.equal(n.delivered, 5, 'an underflowing delivery is still counted')
    t.equal(n.inFlight, 0, 'in_flight stays 0')
    t.match(faults.at(-1), { code: 'IN_FLIGHT_UNDERFLOW', previous: 3, attempted: -2 })

    t.equal(g.deadLettered(1), false, 'a DLQ success without a prior drop is refused')
    t.equal(faults.at(-1).code, 'DLQ_WITHOUT_DROP')
    g.dropped(2)
    t.equal(g.deadLettered(2), true)
    t.equal(g.deadLettered(1), false, 'dlq must never pass dropped')
    const after = topicNumbers(surface, 'orders')
    t.same([after.dropped, after.dlq], [2, 2])

    t.equal(g.ackFloor(0, 11), false, 'an ack floor past last_seq is refused')
    t.equal(g.ackFloor(0, 6), true)
    t.equal(g.ackFloor(0, 5), false, 'an ack floor must not decrease')
    t.equal(faults.at(-1).code, 'ACK_FLOOR_INVALID')
    t.equal(g.ackFloor(7, 1), false, 'a floor on an unseen partition (last_seq 0) is refused')
    t.same(topicNumbers(surface, 'orders').partitions.map((p) => p.partition), [0], 'a refused ack floor must not create the partition')
    t.equal(g.ackFloor(7, 0), true, 'floor 0 on an unseen partition is valid and makes it seen')
    t.same(topicNumbers(surface, 'orders').partitions.map((p) => p.partition), [0, 7])
  })

  t.test(`${backend}: sparse and out-of-order partitions up to 2^31 − 1 (the registry's sorted arrays)`, async (t) => {
    // If this failed, the dense-array fast path of the registry (partition p at index p) would
    // have mixed up partitions that are not 0…n−1, or lost one registered out of order.
    const surface = surfaceOn(t, backend)
    const faults = faultsOf(surface, { ignore: ['CONSERVATION_BROKEN'] }) // floors without deliveries: not the subject
    const big = 2 ** 31 - 1
    const topic = surface.topic('sparse')
    const g = topic.group('g')
    const h = topic.group('h')
    const order = [5, big, 0, 1_000_000_000, 3, 1, 2]
    order.forEach((p, i) => t.equal(topic.produced(p, 10 + i, 1, 10 + i), true, `produced on partition ${p}`))
    t.equal(g.ackFloor(big, 4), true, 'a floor on the largest partition')
    t.equal(g.ackFloor(3, 2), true, 'a floor on a middle partition')
    t.equal(h.ackFloor(0, 12), true)
    t.equal(g.ackFloor(big, 3), false, 'the largest partition\'s floor is found again (a decrease is refused)')
    t.equal(topic.lastSeqKnown(big), 11, 'lastSeqKnown finds the largest partition')
    t.equal(topic.lastSeqKnown(4), 0, 'and knows partition 4 was never seen')
    const n = topicNumbers(surface, 'sparse')
    const seq = (p) => 10 + order.indexOf(p)
    const floorG = { [big]: 4, 3: 2 }
    const floorH = { 0: 12 }
    const expected = [0, 1, 2, 3, 5, 1_000_000_000, big].map((p) => ({
      partition: p,
      lastSeq: seq(p),
      depth: seq(p) - Math.min(floorG[p] ?? 0, floorH[p] ?? 0),
    }))
    t.same(n.partitions, expected, 'partitions ascending, each with its own last_seq and depth')
    t.same(n.partitionNumbers, expected.map((p) => p.partition), 'the column of partition numbers matches')
    const byName = Object.fromEntries(n.groups.map((x) => [x.name, x]))
    t.same(byName.g.ackFloors, expected.map((p) => floorG[p.partition] ?? 0), 'g\'s floors line up with the partitions')
    t.same(byName.h.ackFloors, expected.map((p) => floorH[p.partition] ?? 0), 'h\'s floors line up with the partitions')
    t.equal(byName.g.depth, expected.reduce((sum, p) => sum + p.lastSeq - (floorG[p.partition] ?? 0), 0), 'g: depth_g sums every partition')
    const body = surface.render()
    t.match(body, new RegExp(`mq_partition_last_seq\\{topic="sparse",partition="${big}"\\} ${seq(big)}\n`), 'the largest partition renders with its number')
    t.same(faults.map((f) => f.code), ['ACK_FLOOR_INVALID'], 'no fault but the refused decrease')
    const inUse = surface.slotsInUse()
    t.equal(surface.removeTopic('sparse'), true)
    const again = surface.topic('sparse')
    for (const p of order) again.produced(p, 1, 1)
    again.group('g').ackFloor(big, 1)
    again.group('g').ackFloor(3, 1)
    again.group('h').ackFloor(0, 1)
    t.equal(surface.slotsInUse(), inUse, 'the removed topic\'s slots were freed and reused, none leaked')
  })

  t.test(`${backend}: bad inputs are precise errors and record nothing`, async (t) => {
    const surface = surfaceOn(t, backend)
    const orders = surface.topic('orders')
    const g = orders.group('g')
    orders.produced(0, 1, 10)
    g.dispatch(1)
    const before = JSON.stringify(topicNumbers(surface, 'orders'))
    const bad = [
      [NaN, RangeError], [Infinity, RangeError], [-1, RangeError], [1.5, RangeError], [2 ** 64, RangeError],
      ['3', TypeError], [undefined, TypeError], [null, TypeError], [3n, TypeError],
    ]
    for (const [value, type] of bad) {
      const label = typeof value === 'bigint' ? `${value}n` : typeof value === 'string' ? JSON.stringify(value) : String(value)
      t.throws(() => orders.produced(0, value, 1), type, `produced seq ${label}`)
      t.throws(() => orders.produced(0, 2, value), type, `produced bytes ${label}`)
      if (value !== undefined) t.throws(() => orders.produced(0, 2, 1, value), type, `produced count ${label}`)
      t.throws(() => orders.produced(value, 2, 1), type === TypeError || value === undefined ? TypeError : RangeError, `produced partition ${label}`)
      if (value !== undefined) {
        for (const method of ['dispatch', 'delivered', 'dropped', 'redelivered', 'deadLettered']) {
          t.throws(() => g[method](value), type, `${method}(${label})`)
        }
      }
      t.throws(() => g.ackFloor(0, value), type, `ackFloor floor ${label}`)
      t.throws(() => surface.setLeaderEpoch(value), type, `setLeaderEpoch(${label})`)
    }
    for (const [name, type] of [['', RangeError], ['x'.repeat(1025), RangeError], [undefined, TypeError], [42, TypeError]]) {
      t.throws(() => surface.topic(name), type, `topic name ${String(name).slice(0, 10)}`)
      t.throws(() => orders.group(name), type, `group name ${String(name).slice(0, 10)}`)
    }
    t.ok(surface.topic('x'.repeat(1024)), 'a 1024-character name is allowed')
    surface.removeTopic('x'.repeat(1024))
    t.equal(JSON.stringify(topicNumbers(surface, 'orders')), before, 'no bad input may change any number')
    t.same(surface.snapshot().topics.map((x) => x.name), ['orders'], 'no bad name may register a topic')
  })

  t.test(`${backend}: removeTopic drops the series; recreating starts from zero`, async (t) => {
    const surface = surfaceOn(t, backend)
    const old = surface.topic('orders')
    old.produced(0, 5, 50, 5)
    old.group('g').dispatch(2)
    t.equal(surface.removeTopic('orders'), true)
    t.equal(surface.removeTopic('orders'), false, 'removing an absent topic says so')
    t.same(surface.snapshot().topics, [], 'its series must be gone')
    t.throws(() => old.produced(0, 6, 1), { code: 'TOPIC_REMOVED' }, 'a stale handle must not write into reused slots')
    const fresh = surface.topic('orders')
    t.not(fresh, old)
    fresh.produced(0, 1, 1)
    const n = topicNumbers(surface, 'orders')
    t.same([n.produced, n.bytes, n.partitions[0].lastSeq, n.groups.length], [1, 1, 1, 0], 'a recreated topic starts from zero')
    // Churn reuses slots: the table does not grow without bound.
    const inUse = surface.slotsInUse()
    for (let i = 0; i < 200; i++) {
      const x = surface.topic(`churn-${i % 5}`)
      x.produced(0, 1, 1)
      x.group('g').dispatch(1)
      surface.removeTopic(`churn-${i % 5}`)
    }
    t.ok(surface.slotsInUse() <= inUse + 20, `slots are reused after removal (${inUse} → ${surface.slotsInUse()})`)
  })

  t.test(`${backend}: cardinality caps are RangeErrors and leave existing series alone`, async (t) => {
    const surface = surfaceOn(t, backend, { max_topics: 2, max_partitions_per_topic: 2, max_groups_per_topic: 1 })
    const a = surface.topic('a')
    surface.topic('b')
    // Each message says what to do about it, not only what is wrong.
    t.throws(() => surface.topic('c'), { name: 'LimitError', code: 'LIMIT_REACHED', limit: 'max_topics',
      message: 'cannot register topic "c": max_topics (2) reached; raise max_topics in the configuration, or remove a topic no longer in use (surface.removeTopic())' })
    a.produced(0, 1, 1)
    a.produced(1, 1, 1)
    t.throws(() => a.produced(2, 1, 1), { name: 'LimitError', limit: 'max_partitions_per_topic',
      message: 'cannot register partition 2 of topic "a": max_partitions_per_topic (2) reached; raise max_partitions_per_topic in the configuration' })
    a.group('g')
    t.throws(() => a.group('h'), { name: 'LimitError', limit: 'max_groups_per_topic',
      message: 'cannot register group "h" on topic "a": max_groups_per_topic (1) reached; raise max_groups_per_topic in the configuration, or remove a group no longer in use (topic.removeGroup())' })
    const n = topicNumbers(surface, 'a')
    t.same([n.produced, n.partitions.length, n.groups.length], [2, 2, 1])
    surface.removeTopic('b')
    t.ok(surface.topic('c'), 'removing a topic frees room under max_topics')
  })

  t.test(`${backend}: a full registration log refuses each kind of registration whole, keeps room for removals, and takes registrations again once they retired`, async (t) => {
    const { main, worker, read } = played(backend)
    main.registry.logCapacityInts = 4 * LOG_CHUNK_INTS // 3 chunks for registrations, 1 kept
    const kept = main.handles.topic('kept')
    kept.produced(0, 1, 10)
    const g = kept.group('g')
    const name = (i) => `topic-${String(i).padStart(5, '0')}-${'x'.repeat(90)}`
    let n = 0
    let refused
    for (; n < 10_000 && refused === undefined; n++) {
      try { main.handles.topic(name(n)) } catch (error) { refused = error }
    }
    t.ok(refused instanceof lib.MqMetricsError, 'an MqMetricsError')
    t.match(refused, { name: 'LimitError', code: 'LIMIT_REACHED', limit: 'registration_log', message: /registration log is full .*nothing was registered/ })
    t.ok(n > 500, `${n - 1} topics fit in 3 chunks of 64 KiB`)
    let p = 1 // then partitions, the smallest entries, until not even one fits
    for (; p < 100; p++) {
      try { kept.produced(p, 1, 1) } catch (error) { t.equal(error.limit, 'registration_log'); break }
    }
    t.ok(p < 100, `${p - 1} partitions took what was left`)
    const slots = main.registry.slotsInUse()
    const numbers = () => read().map((x) => [x.name, x.produced, x.bytes, [...x.partitionNumbers], [...x.lastSeq], x.groups.map((y) => [y.name, y.inFlight, y.delivered, y.dropped])])
    const before = numbers()
    let refusals = 0
    for (let k = 0; k < 100; k++) try { main.handles.topic(name(n + k)) } catch (error) { if (error.limit === 'registration_log') refusals++ }
    const refuses = (what, call) => t.throws(call, { name: 'LimitError', limit: 'registration_log' }, what)
    refuses('a new partition', () => kept.produced(p, 1, 5))
    refuses('a new group', () => kept.group('h', { from: 'latest' }))
    refuses('a group\'s settlement window', () => g.send(0, 1))
    refuses('a group\'s ack floor', () => g.ackFloor(0, 1))
    t.equal(refusals, 100, 'every further topic is refused')
    t.equal(main.registry.slotsInUse(), slots, 'refused registrations hold no slots')
    t.same(numbers(), before, 'and change no number')
    t.equal(g.inFlight(), 0)
    // Every topic removed, past what the reserve alone holds, retiring as they go (the threads
    // announce every 100), reads throughout: the log is compacted as it fills, nothing fails.
    let removed = 0
    let readsFailed = 0
    for (let k = 0; k < n - 1; k++) {
      if (main.registry.removeTopic(name(k))) removed++
      if (k % 100 === 99) announce(worker.memory), announce(main.memory)
      if (k % 25 === 0) try { read() } catch { readsFailed++ }
    }
    t.equal(removed, n - 1, 'every removal is taken in a full log')
    t.equal(readsFailed, 0, 'and every read')
    announce(worker.memory)
    announce(main.memory)
    kept.produced(p, 1, 5)
    t.equal(g.send(0, 1), true)
    const [, , , partitions, lastSeq, groups] = numbers().find(([name]) => name === 'kept')
    t.same([partitions.at(-1), lastSeq.at(-1), groups], [p, 1, [['g', 1, 0, 0]]], 'once the removed topics retired, a partition and a window register again')
    let again = 0
    for (let k = 0; k < n - 1; k++) try { main.handles.topic(name(n + 100 + k)) && again++ } catch (error) { if (error.limit !== 'registration_log') throw error }
    t.ok(again >= 0.95 * (n - 1), `and nearly as many topics as were removed (${again} of ${n - 1}: the partitions filled the rest)`)
  })

  t.test(`${backend}: a full counter memory refuses each kind of registration whole, and takes them again in the room removals free`, async (t) => {
    const { main, worker, read } = played(backend)
    const kept = main.handles.topic('kept')
    kept.produced(0, 1, 10)
    const g = kept.group('g') // no settlement window yet: windows come from chunks of their own
    const many = main.handles.topic('many') // removed below: blocks of each kind to reuse
    for (let p = 0; p < 3; p++) many.produced(p, 1, 1)
    const floors = [0, 1, 2, 3].map((i) => many.group(`f${i}`)).flatMap((group) => [0, 1, 2].map((p) => () => group.ackFloor(p, 1)))
    const control = main.memory.control
    // No chunk more (every thread's registry applies the limit): what fits in the chunks open still registers.
    for (const side of [main, worker]) side.registry.slotChunkLimit = control[C_SLOT_CHUNKS]
    const name = (i) => `topic-${i}`
    let n = 0
    let refused
    for (; n < 10_000 && refused === undefined; n++) {
      try { main.handles.topic(name(n)).produced(0, 1, 1) } catch (error) { refused = error }
    }
    t.ok(refused instanceof lib.MqMetricsError, 'an MqMetricsError')
    t.match(refused, { name: 'LimitError', code: 'LIMIT_REACHED', limit: 'counter_memory', message: /the counter memory is full \(\d+ chunks of 64 KiB, .*\); nothing was registered\. Remove topics or groups/ })
    t.ok(n > 100, `${n - 1} topics with a partition each filled the chunk open`)
    // What is left of it (less than a topic or a partition: 3 slots) takes ack floors (1 slot) until none fits.
    let taken = 0
    for (const floor of floors) {
      try { floor() } catch (error) { t.equal(error.limit, 'counter_memory', `full after ${taken} floors`); break }
      taken++
    }
    t.ok(taken < 3, `${taken} floors took what was left`)
    const slots = main.registry.slotsInUse()
    const usage = main.registry.arenaUsage()
    const numbers = () => read().map((x) => [x.name, x.produced, [...x.partitionNumbers], [...x.lastSeq], x.groups.map((y) => [y.name, y.inFlight, y.delivered, y.dropped])])
    const before = numbers()
    const refuses = (what, call) => t.throws(call, { name: 'LimitError', limit: 'counter_memory' }, what)
    refuses('a new topic', () => main.handles.topic('new'))
    refuses('a new partition', () => kept.produced(1, 1, 5))
    refuses('a new group', () => kept.group('h', { from: 'latest' }))
    refuses('a group\'s settlement window', () => g.send(0, 1))
    refuses('from a worker too', () => worker.handles.topic('kept').group('g').settle(0, 1, 'delivered'))
    refuses('a group\'s ack floor', () => g.ackFloor(0, 1))
    t.equal(main.registry.slotsInUse(), slots, 'refused registrations hold no slots')
    // (The worker's first call mapped its own row's chunks: `chunks` grew by those, no slot did.)
    const registered = ({ chunks, ...rest }) => rest
    t.same(registered(main.registry.arenaUsage()), registered(usage), 'nor any slot or log room')
    t.same(numbers(), before, 'and change no number')
    t.same(read(worker).map((x) => x.name).sort(), before.map(([x]) => x).sort(), 'the worker sees what the main thread does')
    // No window was registered: the group still keeps floors (a window would refuse dispatch()).
    t.equal(g.dispatch(1), true)
    g.delivered(1)
    // Removed topics' blocks are reused once they retired: topics, partitions and groups register again.
    main.registry.removeTopic('many')
    refuses('a freed block waits for its retirement', () => main.handles.topic('new'))
    read(worker)
    announce(worker.memory)
    announce(main.memory)
    t.ok(main.handles.topic('new'), 'a topic in a freed block')
    t.equal(kept.produced(1, 1, 5), true, 'a partition in a freed block')
    t.ok(kept.group('h', { from: 'latest' }), 'a group in a freed block')
    refuses('a window needs a chunk of windows', () => g.send(0, 1))
    main.registry.slotChunkLimit += 3 // a chunk of ack floors (group h took the freed ones), one of windows, one of their headers
    t.equal(g.send(0, 1), true, 'with room, the window registers')
    t.equal(g.settle(0, 1, 'delivered'), true)
    t.same(numbers().find(([x]) => x === 'kept')[4], [['g', 0, 2, 0], ['h', 0, 0, 0]], 'and counts')
  })

  t.test(`${backend}: removals while a thread holds their retirements back stop before the log's end, and go on once it is back between tasks`, async (t) => {
    const { main, worker, read } = played(backend)
    main.registry.logCapacityInts = 4 * LOG_CHUNK_INTS
    const names = []
    for (let k = 0; k < 100 && names.length === k * 200; k++) {
      const topic = main.handles.topic(`t${k}`)
      for (let g = 0; g < 200; g++) try { topic.group(`g${g}`) && names.push([topic, `g${g}`]) } catch (error) { t.equal(error.limit, 'registration_log'); break }
    }
    let removed = 0
    let refusal
    for (const [topic, name] of names) {
      try { topic.removeGroup(name); removed++ } catch (error) { refusal = error; break }
      if (removed % 50 === 0) read() // the main thread announces in each read; the worker never does: nothing retires
    }
    t.match(refusal, { name: 'LimitError', limit: 'registration_log', message: /cannot remove: .*nothing was removed/ }, `a removal is refused after ${removed} of ${names.length}`)
    const [refusedTopic, refusedName] = names[removed]
    t.ok(read().find((x) => x.name === refusedTopic.name).groups.some((y) => y.name === refusedName), 'and its group is still there')
    t.ok(read(), 'reads still work')
    let more = 0
    for (const [topic, name] of names.slice(removed)) {
      if (more % 50 === 0) announce(worker.memory), announce(main.memory) // back between tasks: both announce as removals ring
      try { if (topic.removeGroup(name)) more++ } catch (error) { t.fail(`removal after the worker announced: ${error.message}`); break }
    }
    t.equal(removed + more, names.length, 'then every removal is taken')
    announce(worker.memory)
    announce(main.memory)
    t.ok(main.handles.topic('after'), 'and registrations are taken again')
  })

  t.test(`${backend}: a full log of topics sharing labels in pairs: removing a label's last topic is always taken and makes room`, async (t) => {
    const { main, worker, read } = played(backend)
    main.registry.logCapacityInts = 4 * LOG_CHUNK_INTS
    let pairs = 0
    try {
      for (; pairs < 10_000; pairs++) for (const name of [`a.${pairs}`, `a_${pairs}`]) main.handles.topic(name).produced(0, 1, 1)
    } catch (error) {
      t.equal(error.limit, 'registration_log', `full at pair ${pairs}`)
    }
    const removeAll = (names) => {
      let refused = 0
      for (const name of names) {
        try { main.registry.removeTopic(name) } catch (error) { if (error.limit !== 'registration_log') throw error; refused++ }
        announce(worker.memory), announce(main.memory), read()
      }
      return refused
    }
    // One of each pair retires into its label's carry (the log grows: some are refused); the
    // other, then its label's last topic, frees the label's room at once: always taken.
    const removed = []
    for (let k = 0; k < pairs; k++) if (removeAll([`a.${k}`]) === 0) removed.push(k)
    t.ok(removed.length > 0 && removed.length < pairs, `some of the first of each pair are refused (${pairs - removed.length} of ${pairs}): the carries grow the log`)
    t.equal(removeAll(removed.map((k) => `a_${k}`)), 0, 'a label\'s last topic is always taken')
    let registered = 0
    for (let k = 0; k < 200; k++) try { main.handles.topic(`after-${k}`) && registered++ } catch (error) { t.fail(`topic ${k}: ${error.message}`); break }
    t.equal(registered, 200, 'and what they freed takes registrations again')
  })

  t.test(`${backend}: a log full of settlement windows, all removed, takes registrations again (what they freed fits in less than they took)`, async (t) => {
    const { main, worker } = played(backend)
    main.registry.logCapacityInts = 16 * LOG_CHUNK_INTS // a reserve small beside the log: the freed blocks' entries must fit where the windows were
    const topic = main.handles.topic('wide')
    for (let p = 0; p < 200; p++) topic.produced(p, 1, 1)
    let groups = 0
    try {
      for (; groups < 256; groups++) {
        const group = topic.group(`g${groups}`, { settle_window: 64 })
        for (let p = 0; p < 200; p++) group.send(p, 1)
      }
    } catch (error) {
      t.equal(error.limit, 'registration_log', `the log filled at group ${groups}`)
    }
    t.ok(groups > 20 && groups < 256, `${groups} groups of 200 windows filled it`)
    for (let k = 0; k <= groups; k++) {
      try { topic.removeGroup(`g${k}`) } catch (error) { t.fail(String(error)) }
      if (k % 20 === 0) announce(worker.memory), announce(main.memory)
    }
    announce(worker.memory)
    announce(main.memory)
    let registered = 0
    for (let k = 0; k < 200; k++) try { main.handles.topic(`after-${k}`) && registered++ } catch (error) { t.fail(`topic ${k}: ${error.message}`); break }
    t.equal(registered, 200, 'topics register again')
  })

  t.test(`${backend}: counters above 2^53 stay exact`, async (t) => {
    const surface = surfaceOn(t, backend)
    const big = surface.topic('big')
    const max = Number.MAX_SAFE_INTEGER
    big.produced(0, 1, max)
    big.produced(0, 2, max)
    big.produced(0, 3, 5)
    t.equal(surface.snapshot().topics[0].bytes, 2n * BigInt(max) + 5n, 'bytes must be exact past 2^53')
    const g = big.group('g')
    g.redelivered(max)
    g.redelivered(max)
    g.redelivered(max)
    t.equal(surface.snapshot().topics[0].groups[0].retries, 3n * BigInt(max))
  })

  t.test(`${backend}: metrics_enabled false keeps the recording API working`, async (t) => {
    const surface = surfaceOn(t, backend, { metrics_enabled: false })
    t.equal(surface.enabled, false)
    surface.topic('x').produced(0, 1, 1)
    t.equal(topicNumbers(surface, 'x').produced, 1)
  })
}

t.test('configuration: every key validated, unknown keys refused, read once', async (t) => {
  const cases = [
    [{ metrics_enabled: 'yes' }, 'metrics_enabled'],
    [{ metrics_enabled: 1 }, 'metrics_enabled'],
    [{ max_in_flight: 0 }, 'max_in_flight'],
    [{ max_in_flight: 1.5 }, 'max_in_flight'],
    [{ max_in_flight: '10' }, 'max_in_flight'],
    [{ max_in_flight: 2 ** 31 }, 'max_in_flight'],
    [{ max_attempts: -1 }, 'max_attempts'],
    [{ max_attempts: NaN }, 'max_attempts'],
    [{ e2e_latency: 'true' }, 'e2e_latency'],
    [{ metrics_auth_token: 5 }, 'metrics_auth_token'],
    [{ metrics_auth_token: '' }, 'metrics_auth_token'],
    [{ metrics_auth_token: 'has space' }, 'metrics_auth_token'],
    [{ max_topics: 0 }, 'max_topics'],
    [{ max_partitions_per_topic: Infinity }, 'max_partitions_per_topic'],
    [{ max_groups_per_topic: null }, 'max_groups_per_topic'],
    [{ metricsEnabled: true }, 'metricsEnabled'],
    ['config', 'config'],
    [null, 'config'],
  ]
  for (const [config, key] of cases) {
    t.throws(() => lib.createSurface(config), { name: 'ConfigError', key }, `${JSON.stringify(config)} must name ${key}`)
  }
  const config = { max_in_flight: 2 }
  const surface = lib.createSurface(config)
  t.teardown(() => surface.close())
  config.max_in_flight = 100
  const g = surface.topic('t').group('g')
  t.equal(g.dispatch(3), false, 'changing the caller\'s object after createSurface has no effect')
  t.throws(() => { surface.config.max_in_flight = 5 }, TypeError, 'the resolved config is frozen')
})

t.test('MQ_METRICS_BACKEND: garbage is a startup error naming the variable', async (t) => {
  const before = process.env.MQ_METRICS_BACKEND
  t.teardown(() => { if (before === undefined) delete process.env.MQ_METRICS_BACKEND; else process.env.MQ_METRICS_BACKEND = before })
  for (const value of ['jS', 'wasm', ' native']) {
    process.env.MQ_METRICS_BACKEND = value
    t.throws(() => lib.createSurface(), { name: 'ConfigError', key: 'MQ_METRICS_BACKEND' }, `value ${JSON.stringify(value)}`)
  }
})
