'use strict'
// A group is judged as it leaves (docs/metrics.md, "Checked when a group leaves"): a mistake on a
// group or topic removed before the next scrape is reported, with the rules of a scrape's check
// and once per episode. From a worker thread only a group settled per message is judged: a group
// kept by floor can be caught there between two calls of a settlement the main thread makes.
const t = require('tap')
const { backends, surfaceOn, faultsOf, scriptedWorker, played } = require('./helpers')

const broken = (faults) => faults.filter((f) => f.code === 'CONSERVATION_BROKEN')

// The one way left to break the identity of a group settled per message (its count-level
// delivered() throws once it has a window on every partition): an acknowledgement counted by count
// before its first window, as a broker moving from floors to per-message settlement could, and
// settled per message again after.
function countedTwice(g, partition, seq) {
  g.dispatch(1)
  g.delivered(1)
  g.send(partition, seq)
  g.settle(partition, seq, 'delivered')
}

for (const backend of backends()) {
  t.test(`${backend}: a group settled per message, removed before any scrape with one ack counted twice, is reported as it leaves`, (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('sensors')
    for (let session = 0; session < 3; session++) {
      const g = topic.group(`client-${session}`, { from: 'latest' })
      const q1 = topic.append(0, 32)
      const q2 = topic.append(0, 32)
      countedTwice(g, 0, q1)
      g.send(0, q2)
      g.settle(0, q2, 'delivered')
      t.equal(g.inFlight(), 0)
      t.equal(topic.removeGroup(`client-${session}`), true)
    }
    t.same(broken(faults).map((f) => [f.labels, f.attempted - f.previous]), [0, 1, 2].map((n) => [{ topic: 'sensors', group: `client-${n}` }, -1]), 'one CONSERVATION_BROKEN per group, residual −1, before any scrape')
    s.snapshot()
    s.render()
    t.equal(broken(faults).length, 3, 'and nothing more at the scrapes: the groups are gone')
    t.end()
  })

  t.test(`${backend}: removeTopic() judges every group of the topic, and only the broken one is reported`, (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('tmp')
    const honest = topic.group('honest')
    const g = topic.group('g')
    topic.append(0, 1, 5)
    for (let seq = 1; seq <= 5; seq++) honest.send(0, seq)
    honest.settle(0, 2, 'delivered') // out of order; 4 still in flight: honest
    t.ok(g.dispatch(5))
    g.delivered(5) // counted, its floor never moved
    t.equal(s.removeTopic('tmp'), true)
    t.same(broken(faults).map((f) => f.labels), [{ topic: 'tmp', group: 'g' }])
    t.end()
  })

  t.test(`${backend}: honest removals are not reported, with messages in flight or settled out of order`, (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    topic.append(0, 1, 6)
    const perMessage = topic.group('per-message')
    for (let seq = 1; seq <= 6; seq++) perMessage.send(0, seq)
    perMessage.settle(0, 3, 'delivered')
    perMessage.settle(0, 1, 'dropped')
    const byFloor = topic.group('by-floor')
    t.ok(byFloor.dispatch(4))
    byFloor.ackFloor(0, 2)
    byFloor.delivered(2)
    const idle = topic.group('idle')
    t.equal(topic.removeGroup('per-message'), true)
    t.equal(topic.removeGroup('by-floor'), true)
    t.equal(topic.removeGroup('idle'), true)
    t.equal(s.removeTopic('orders'), true)
    t.same(faults, [], 'no fault')
    t.ok(idle)
    t.end()
  })

  t.test(`${backend}: a group kept by floor whose floor passed messages nobody counted is reported as it leaves the main thread`, (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    topic.append(0, 1, 5)
    const g = topic.group('g')
    g.ackFloor(0, 3) // three messages passed, neither delivered nor dropped
    t.equal(topic.removeGroup('g'), true)
    t.same(broken(faults).map((f) => [f.labels.group, f.previous, f.attempted]), [['g', 2, 5]], 'residual +3: produced 5 where the consumption side accounts for 2')
    t.end()
  })

  t.test(`${backend}: a mistake a scrape reported already is not reported again when its group leaves`, (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    const g = topic.group('g')
    topic.append(0, 1, 2)
    countedTwice(g, 0, 1)
    s.snapshot()
    t.equal(broken(faults).length, 1, 'the scrape reports it')
    topic.removeGroup('g')
    t.equal(broken(faults).length, 1, 'its removal does not, a second time')
    t.end()
  })

  t.test(`${backend}: from a worker thread a group settled per message is judged as it leaves; one kept by floor is not`, async (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const w = await scriptedWorker(s)
    t.teardown(() => w.close())
    await w.call('orders', undefined, 'append', 0, 10, 3)
    await w.call('orders', 'pm', 'dispatch', 1) // counted by count before its first window,
    await w.call('orders', 'pm', 'delivered', 1)
    await w.call('orders', 'pm', 'send', 0, 1) // and per message after it: twice
    await w.call('orders', 'pm', 'settle', 0, 1, 'delivered')
    await w.call('orders', 'floor', 'ackFloor', 0, 2) // two passed, never counted
    t.equal(await w.call('orders', undefined, 'removeGroup', 'pm'), true)
    t.equal(await w.call('orders', undefined, 'removeGroup', 'floor'), true)
    s.snapshot() // a scrape takes in the worker's faults
    t.same(broken(faults).map((f) => [f.labels.group, f.attempted - f.previous]), [['pm', -1]], 'the group settled per message only (docs/metrics.md)')
    t.end()
  })
}

for (const backend of backends()) {
  t.test(`${backend}: a 'fault' listener hears of a leaving group once it has left: it may remove or register that group itself`, (t) => {
    const s = surfaceOn(t, backend)
    const topic = s.topic('orders')
    topic.append(0, 1, 3)
    const broken = (name) => {
      const g = topic.group(name)
      g.dispatch(1)
      g.delivered(1) // counted, the floor never moved
      return g
    }
    broken('a')
    const heard = []
    s.on('fault', (fault) => {
      heard.push([fault.code, fault.labels.group, topic.removeGroup(fault.labels.group)])
      if (fault.labels.group === 'b') topic.group('b') // a subscription reset: registered again, from zero
    })
    t.equal(topic.removeGroup('a'), true, 'the removal the caller asked for is the one made')
    t.same(heard, [['CONSERVATION_BROKEN', 'a', false]], 'the listener ran after it: nothing left for it to remove')
    broken('b')
    t.equal(topic.removeGroup('b'), true)
    t.same(s.stats('groups').groups.map((g) => [g.group, g.delivered]), [['b', 0]], "the listener's new group stays")
    t.end()
  })

  t.test(`${backend}: removeGroup() judges the leaving group alone`, (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    topic.append(0, 1, 3)
    const stay = topic.group('stay')
    stay.dispatch(1)
    stay.delivered(1) // a mistake on a group that stays
    topic.group('leave')
    t.equal(topic.removeGroup('leave'), true)
    t.same(faults, [], 'not reported by another group\'s removal')
    s.snapshot()
    t.same(broken(faults).map((f) => f.labels.group), ['stay'], 'the next scrape reports it')
    t.end()
  })

  t.test(`${backend}: an honest group leaving while a producer tears the first read is not reported: the re-read confirms nothing`, (t) => {
    const { SnapshotReader } = require('../dist/core/reader')
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('orders')
    const g = topic.group('g')
    topic.append(0, 1, 2)
    g.send(0, 1)
    g.settle(0, 1, 'delivered') // honest, settled per message, nothing in flight
    let torn = false
    SnapshotReader.parkAt = (point, name) => { if (name === 'orders' && point === 'lastSeq' && !torn) (torn = true), topic.append(0, 1) }
    try {
      t.equal(topic.removeGroup('g'), true)
    } finally {
      SnapshotReader.parkAt = undefined
    }
    t.ok(torn, 'the first read was torn (produced one ahead of the last_seq it read)')
    t.same(faults, [], 'no CONSERVATION_BROKEN')
    t.end()
  })
}

// group.expire(): messages a group will never get, dropped without a fetch (docs/api.md).
for (const backend of backends()) {
  t.test(`${backend}: expire() on a partition kept by floor: the floor moves and what it passes is dropped, in_flight unchanged, in one call`, async (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('log')
    topic.append(0, 10, 8)
    const g = topic.group('committer')
    t.ok(g.dispatch(2), 'two fetched')
    t.ok(g.ackFloor(0, 2))
    g.delivered(2)
    t.ok(g.dispatch(1), 'seq 3 fetched, in flight')
    t.equal(g.expire(0, 2), 0, 'nothing below the floor: 0, no fault')
    t.equal(g.expire(0, 9), 0, 'past last_seq')
    t.match(faults, [{ code: 'SEQ_NOT_APPENDED', previous: 8, attempted: 9 }])
    faults.length = 0
    t.ok(g.ackFloor(0, 3))
    g.dropped(1) // seq 3, in flight, given up: the floor first
    t.equal(g.expire(0, 6), 3, 'seqs 4…6, never fetched, retention deleted them')
    t.equal(g.floor(0), 6)
    t.equal(g.inFlight(), 0, 'in_flight unchanged by expire()')
    t.ok(g.deadLettered(2), 'drops are DLQ credit')
    const row = s.stats('conservation').topics[0].groups[0]
    t.same([row.delivered, row.dropped, row.depth, row.residual], [2, 4, 2, 0], 'the identity holds')
    s.snapshot()
    t.same(faults, [], 'no fault')
    const w = await scriptedWorker(s)
    t.teardown(() => w.close())
    t.equal(await w.call('log', 'committer', 'expire', 0, 7), 1, 'from a worker')
    t.equal(g.expire(0, 7), 0, 'expired already (another thread): counted once')
    t.equal(s.stats('groups').groups[0].dropped, 5)
    t.throws(() => g.expire(0, 1.5), { name: 'RangeError' })
    t.throws(() => g.expire(-1, 2), { name: 'RangeError' })
    t.end()
  })

  t.test(`${backend}: expire() on a partition settled per message is settleUpTo(…, 'dropped'); it makes no window where floors are kept`, (t) => {
    const s = surfaceOn(t, backend)
    const faults = faultsOf(s)
    const topic = s.topic('q')
    topic.append(0, 1, 4)
    topic.append(1, 1, 4)
    const g = topic.group('g')
    g.send(0, 1)
    g.settle(0, 2, 'delivered')
    t.equal(g.expire(0, 3), 2, 'seqs 1 (in flight) and 3; 2 was settled')
    t.equal(g.inFlight(), 0, 'the one in flight ended')
    t.equal(g.expire(0, 3), 0, 'at the floor: 0, no fault')
    t.ok(g.dispatch(1), 'partition 1 has no window: dispatch() is still for it')
    t.equal(g.expire(1, 2), 2)
    t.ok(g.dispatch(1), 'expire() made no window on partition 1 (a window on every partition would refuse dispatch())')
    t.same(faults, [])
    t.end()
  })
}

for (const backend of backends()) {
  t.test(`${backend}: expire() counts from every thread's floor, not the shared hint a racing ackFloor() can leave behind`, (t) => {
    const { SLOTS_PER_CHUNK } = require('../dist/core/layout')
    const { main, worker, read } = played(backend)
    const mine = main.handles.topic('log')
    mine.produced(0, 100, 100, 100)
    const g = mine.group('c')
    const theirs = worker.handles.topic('log').group('c')
    g.dispatch(90)
    // Two commits racing: the other thread writes 90 and raises the hint to 90; this one had read
    // the hint (0) before that, writes 80 and stores its 80 over the hint last.
    theirs.ackFloor(0, 90)
    g.ackFloor(0, 80)
    const slot = g.entity.floorSlot(0)
    main.recorder.sharedChunks[Math.floor(slot / SLOTS_PER_CHUNK)][slot % SLOTS_PER_CHUNK] = 80
    g.delivered(90)
    t.equal(g.floor(0), 90)
    t.equal(g.expire(0, 100), 10, 'seqs 91…100: the ten the floor had not passed')
    const [topic] = read().filter((x) => x.name === 'log')
    const [row] = topic.groups
    t.same([row.dropped, row.depth, topic.produced - row.delivered - row.dropped - row.depth], [10, 0, 0], 'the identity holds')
    t.end()
  })

  t.test(`${backend}: a 'fault' listener hears of a removed topic's groups once the topic is gone: it may register the topic again`, (t) => {
    const s = surfaceOn(t, backend)
    const topic = s.topic('orders')
    topic.append(0, 1, 3)
    const g = topic.group('g')
    g.dispatch(1)
    g.delivered(1) // counted, the floor never moved
    s.on('fault', () => s.topic('orders').append(0, 1))
    t.equal(s.removeTopic('orders'), true)
    t.same(s.stats('topics').topics.map((x) => [x.topic, x.produced]), [['orders', 1]], "the listener's new topic stays")
    t.end()
  })
}

for (const backend of backends()) {
  t.test(`${backend}: expire() counts under the group's lock: another thread's expire() of the same messages, made while this one waited, is counted once`, (t) => {
    const { SLOTS_PER_CHUNK } = require('../dist/core/layout')
    const { G_LOCK } = require('../dist/core/entities')
    const { acquire, release } = require('../dist/core/lock')
    const { threads, main, worker, read } = played(backend)
    const mine = main.handles.topic('log')
    mine.produced(0, 10, 10, 10)
    const g = mine.group('c')
    const theirs = worker.handles.topic('log').group('c')
    t.equal(theirs.floor(0), 0)
    // The other thread holds the group's lock. While this thread waits for it (and asks whether
    // its holder still lives), the other lets it go and expires seqs 1…10 itself.
    const slot = g.entity.slot
    const cells = worker.memory.sharedI32(Math.floor(slot / SLOTS_PER_CHUNK))
    const at = ((slot % SLOTS_PER_CHUNK) + G_LOCK) * 2
    acquire(cells, at, worker.memory.lockTag)
    let theirCount
    threads[2] = {
      get alive() {
        if (theirCount === undefined) {
          release(cells, at, worker.memory.lockTag)
          theirCount = theirs.expire(0, 10)
        }
        return true
      },
    }
    t.equal(g.expire(0, 10), 0, 'nothing left once it has the lock')
    t.equal(theirCount, 10, 'the other thread expired them')
    const [row] = read().find((x) => x.name === 'log').groups
    t.same([row.dropped, row.depth], [10, 0], 'ten dropped, not twenty')
    t.end()
  })
}
