'use strict'
// Removing one of several names that share a label (design §3.5, docs/metrics.md label rule 4):
// the label's series keeps what the removed name counted — counters keep growing from where they
// stood, last_seq keeps its highest value — as long as a live name has the label; it leaves with
// the last one. The removed name's cells still count while a call under way may land in them
// (played threads, as in removal.test.js), then move into the label's carry, which checkpoints
// restate and a late thread replays.
const t = require('tap')
const path = require('node:path')
const { Worker } = require('node:worker_threads')
const { backends, surfaceOn, played, faultsOf } = require('./helpers')
const { mergeCollisions } = require('../dist/exposition/merge')
const { announce } = require('../dist/core/reclamation')
const { leftClock, LEFT_MS } = require('../dist/core/left')

/** `name{labels}` → value, every sample of a /metrics body. */
function samples(text) {
  const out = new Map()
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue
    const at = line.lastIndexOf(' ')
    out.set(line.slice(0, at), Number(line.slice(at + 1)))
  }
  return out
}

/** The merged series of `label` as the exposition sees it (undefined: no series). */
function seriesOf(read, label) {
  const s = mergeCollisions(read()).find((x) => x.label === label)
  if (s === undefined) return undefined
  return {
    produced: s.produced, bytes: s.bytes, delivered: s.delivered, dropped: s.dropped, dlq: s.dlq,
    lastSeq: Object.fromEntries(s.partitionNumbers.map((p, i) => [p, s.lastSeq[i]])),
    retries: Object.fromEntries(s.groups.map((g) => [g.label, g.retries])),
  }
}

for (const backend of backends()) {
  t.test(`${backend}: removing a topic whose label another topic has keeps the series' counters and last_seq`, (t) => {
    const surface = surfaceOn(t, backend)
    const faults = faultsOf(surface, { ignore: ['CONSERVATION_BROKEN'] }) // this test keeps no honest books
    const a = surface.topic('a.b')
    const b = surface.topic('a_b')
    a.produced(0, 40, 400)
    a.produced(1, 7, 70)
    b.produced(0, 5, 50)
    const ga = a.group('g')
    ga.ackFloor(0, 39) // its base: partition 0 starts at seq 40
    ga.dispatch(3)
    ga.redelivered(2)
    ga.delivered(2)
    ga.dropped(1)
    ga.deadLettered(1)
    const gb = b.group('g')
    gb.redelivered(1)
    const before = samples(surface.render())
    const key = (name, labels) => `${name}{${labels}}`
    t.equal(before.get(key('mq_topic_messages_produced_total', 'topic="a_b"')), 3)
    t.equal(before.get(key('mq_group_retries_total', 'topic="a_b",group="g"')), 3)

    t.equal(surface.removeTopic('a.b'), true)
    const after = samples(surface.render())
    for (const name of ['mq_topic_messages_produced_total', 'mq_topic_messages_delivered_total', 'mq_topic_messages_dropped_total', 'mq_topic_messages_dlq_total', 'mq_topic_bytes_total']) {
      t.equal(after.get(key(name, 'topic="a_b"')), before.get(key(name, 'topic="a_b"')), `${name} does not go down`)
    }
    t.equal(after.get(key('mq_partition_last_seq', 'topic="a_b",partition="0"')), 40, 'last_seq keeps the removed name\'s highest')
    t.notOk(after.has(key('mq_partition_last_seq', 'topic="a_b",partition="1"')), 'a partition only the removed name had leaves with it')
    t.equal(after.get(key('mq_group_retries_total', 'topic="a_b",group="g"')), 3, 'the group series keeps its retries')
    t.equal(after.get(key('mq_group_in_flight', 'topic="a_b",group="g"')), 0, 'gauges are the live names\' own')
    t.same(JSON.parse(JSON.stringify(surface.stats('collisions'))), {
      filter: 'collisions',
      topics: [{ label: 'a_b', names: ['a_b'], removed: { produced: 2, delivered: 2, dropped: 1, dlq: 1, bytes: 470, last_seq: { 0: 40 } } }],
      groups: [{ topic_label: 'a_b', label: 'g', names: [{ topic: 'a_b', group: 'g' }], removed_retries: 2 }],
    }, '/stats?filter=collisions shows what the removed topic still adds to the series')

    b.produced(0, 6, 60)
    gb.redelivered(4)
    const later = samples(surface.render())
    t.equal(later.get(key('mq_topic_messages_produced_total', 'topic="a_b"')), 4, 'and grow from there')
    t.equal(later.get(key('mq_topic_bytes_total', 'topic="a_b"')), 580)
    t.equal(later.get(key('mq_group_retries_total', 'topic="a_b",group="g"')), 7)
    t.equal(later.get(key('mq_partition_last_seq', 'topic="a_b",partition="0"')), 40, 'last_seq stays at the maximum until a live name passes it')
    b.produced(0, 41, 35, 35) // seqs 7…41
    t.equal(samples(surface.render()).get(key('mq_partition_last_seq', 'topic="a_b",partition="0"')), 41)
    t.same(surface.stats('topics', { topic: 'a_b' }).topics.map((x) => [x.topic, x.produced]), [['a_b', 37]], '/stats shows the raw name\'s own numbers')

    // A name created again under the removed name is one more share of the same series, from zero.
    const again = surface.topic('a.b')
    again.produced(0, 1, 1)
    t.equal(samples(surface.render()).get(key('mq_topic_messages_produced_total', 'topic="a_b"')), 40)
    t.same(faults, [], 'no fault')

    // The last names of the label leave: so does the series, and what it carried.
    surface.removeTopic('a_b')
    surface.removeTopic('a.b')
    t.notOk([...samples(surface.render()).keys()].some((k) => k.includes('topic="a_b"')), 'the series leaves with the last name')
    surface.topic('a.b').produced(0, 1, 1)
    t.equal(samples(surface.render()).get(key('mq_topic_messages_produced_total', 'topic="a_b"')), 1, 'a series of the label started again starts from zero')
    t.end()
  })

  t.test(`${backend}: a removed topic counts from its cells until no call can land there, then from the carry`, (t) => {
    const { main, worker, side, read } = played(backend)
    const a = worker.handles.topic('a.b')
    const b = main.handles.topic('a_b')
    a.produced(0, 9, 90)
    const ga = a.group('g')
    ga.redelivered(5)
    b.group('g')
    b.produced(0, 2, 20)
    t.same(seriesOf(read, 'a_b'), { produced: 2, bytes: 110, delivered: 0, dropped: 0, dlq: 0, lastSeq: { 0: 9 }, retries: { g: 5 } })

    const slotsBefore = main.registry.slotsInUse()
    t.equal(main.registry.removeTopic('a.b'), true)
    t.equal([...main.registry.retiringTopics()].length, 1, 'the worker has not announced since the removal: the topic retires')
    // The worker was stopped inside calls begun before the removal; they land now, in its row.
    const cell = (slot) => { const [cells, index] = worker.recorder.cells(slot); return { add: (n) => { cells[index] += n } } }
    cell(a.entity.slot).add(1)
    cell(a.entity.slot + 1).add(5)
    cell(ga.entity.slot + 3).add(2) // retries
    t.same(seriesOf(read, 'a_b'), { produced: 3, bytes: 115, delivered: 0, dropped: 0, dlq: 0, lastSeq: { 0: 9 }, retries: { g: 7 } }, 'the late calls count in the label\'s series')
    t.equal(main.registry.slotsInUse(), slotsBefore, 'its blocks are held while it retires')

    announce(worker.memory)
    const retired = seriesOf(read, 'a_b')
    t.equal([...main.registry.retiringTopics()].length, 0, 'once the worker announced, it retired')
    t.same(retired, { produced: 3, bytes: 115, delivered: 0, dropped: 0, dlq: 0, lastSeq: { 0: 9 }, retries: { g: 7 } }, 'into the carry: the series is unchanged')
    t.ok(main.registry.slotsInUse() < slotsBefore, 'and its blocks are free')
    t.same(seriesOf(() => read(worker), 'a_b'), retired, 'the worker replays the same carry from the log')

    // A checkpoint restates the carry: a thread that attaches after it replays only that.
    main.registry.compact()
    const late = side(false, 3)
    t.same(seriesOf(() => read(late), 'a_b'), retired, 'a thread attached after a compaction sees the same series')
    t.end()
  })

  t.test(`${backend}: a checkpoint restates a topic still retiring, and a new topic of its name`, (t) => {
    const { main, worker, side, read } = played(backend)
    worker.handles.topic('a.b').produced(0, 4, 40)
    main.handles.topic('a_b').produced(0, 1, 10)
    main.registry.removeTopic('a.b')
    main.handles.topic('a.b').produced(0, 2, 1) // the same name again: a new share
    main.registry.compact()
    t.equal([...main.registry.retiringTopics()].length, 1, 'still retiring at the checkpoint')
    const expected = { produced: 3, bytes: 51, delivered: 0, dropped: 0, dlq: 0, lastSeq: { 0: 4 }, retries: {} }
    t.same(seriesOf(read, 'a_b'), expected)
    const late = side(false, 3)
    t.same(seriesOf(() => read(late), 'a_b'), expected, 'a thread attached after the checkpoint')
    t.same([...late.registry.topics.keys()].sort(), ['a.b', 'a_b'], 'it knows the live topics by name')
    t.equal([...late.registry.retiringTopics()].length, 1, 'and the one retiring (the worker has not announced)')
    // The worker replays the checkpoint over its picture, in which the removed topic was live;
    // reading, it is past its own calls, and the main thread has announced: the topic retires.
    t.same(seriesOf(() => read(worker), 'a_b'), expected, 'the worker')
    t.same([...worker.registry.topics.keys()].sort(), ['a.b', 'a_b'], 'it knows the live topics by name')
    t.not(worker.registry.topics.get('a.b').id, main.registry.retiringTopics().next().value?.id ?? -1, 'the name is the new topic\'s')
    announce(worker.memory)
    t.same(seriesOf(read, 'a_b'), expected, 'retired after the checkpoint: unchanged')
    t.equal([...main.registry.retiringTopics()].length, 0)
    t.same(seriesOf(() => read(late), 'a_b'), expected, 'the late thread replays the retirement')
    t.end()
  })

  t.test(`${backend}: removing one of two groups sharing a label keeps the group series' retries`, (t) => {
    let now = 1e12
    const clock = leftClock.now
    leftClock.now = () => now
    t.teardown(() => (leftClock.now = clock))
    const surface = surfaceOn(t, backend)
    const topic = surface.topic('t')
    topic.produced(0, 10, 1)
    const g1 = topic.group('g.1')
    const g2 = topic.group('g_1')
    g1.redelivered(4)
    g2.redelivered(1)
    const key = 'mq_group_retries_total{topic="t",group="g_1"}'
    t.equal(samples(surface.render()).get(key), 5)
    t.equal(topic.removeGroup('g.1'), true)
    t.notOk(samples(surface.render()).has(key), 'a group left: no retries line for a while (docs/metrics.md, "A group that left")')
    now += LEFT_MS
    t.equal(samples(surface.render()).get(key), 5, 'retries do not go down')
    g2.redelivered(2)
    t.equal(samples(surface.render()).get(key), 7, 'and grow from there')
    t.equal(topic.removeGroup('g_1'), true)
    t.notOk(samples(surface.render()).has(key), 'the series leaves with the last group of the label')
    topic.group('g.1').redelivered(1)
    t.notOk(samples(surface.render()).has(key), 'a group of the topic left: no retries series for a while (docs/metrics.md)')
    now += LEFT_MS
    t.equal(samples(surface.render()).get(key), 1, 'a group series started again starts from zero')
    t.end()
  })

  t.test(`${backend}: what stays is decided at the removal: a series gone then comes back from zero, even while the removed name retires`, (t) => {
    const { main, worker, side, read } = played(backend)
    // A group removed with no other group of its label, created again before the worker announced.
    const topic = main.handles.topic('t')
    topic.append(0, 10, 10)
    topic.group('g').redelivered(7)
    topic.removeGroup('g')
    topic.group('g').redelivered(1)
    t.same(seriesOf(read, 't').retries, { g: 1 }, 'a group created again under a removed name starts from zero while the old one retires')
    // A partition and a group label only the removed topic had.
    const ab = main.handles.topic('a.b')
    ab.produced(1, 50, 500, 50)
    ab.group('h').redelivered(9)
    ab.group('k').redelivered(2)
    const a_b = main.handles.topic('a_b')
    a_b.produced(0, 3, 30, 3)
    a_b.group('k').redelivered(1)
    main.registry.removeTopic('a.b')
    t.same(seriesOf(read, 'a_b').lastSeq, { 0: 3 }, 'partition 1 left with the removed topic')
    t.same(seriesOf(read, 'a_b').retries, { k: 3 }, 'group h left with it; k keeps its retries')
    a_b.append(1, 10, 1)
    a_b.group('h')
    t.same(seriesOf(read, 'a_b').lastSeq, { 0: 3, 1: 1 }, 'partition 1 back: its own last_seq, not the removed topic\'s')
    t.same(seriesOf(read, 'a_b').retries, { h: 0, k: 3 }, 'group h back: from zero')
    // The label's last group k leaves while the removed topic still retires: k's series goes, and
    // what the removed topic left in it.
    a_b.removeGroup('k')
    a_b.group('k')
    t.same(seriesOf(read, 'a_b').retries, { h: 0, k: 0 }, 'a series that left comes back from zero')
    // A checkpoint restates what stays; a thread attached after it agrees.
    main.registry.compact()
    const late = side(false, 3)
    t.same(seriesOf(() => read(late), 'a_b'), seriesOf(read, 'a_b'), 'a thread attached after a checkpoint')
    const before = seriesOf(read, 'a_b')
    announce(worker.memory)
    t.same(seriesOf(read, 't').retries, { g: 1 }, 'and once everything retired')
    t.same(seriesOf(read, 'a_b'), before)
    t.same(seriesOf(() => read(late), 'a_b'), before)
    t.end()
  })

  t.test(`${backend}: churning names of a shared label keeps memory bounded`, (t) => {
    const surface = surfaceOn(t, backend)
    const keep = surface.topic('x_y')
    keep.produced(0, 1, 1)
    keep.group('g')
    for (let i = 0; i < 300; i++) {
      const gone = surface.topic('x.y')
      gone.produced(i % 4, i + 1, 1)
      gone.group(i % 2 === 0 ? 'g' : `h${i}`).redelivered(1)
      surface.removeTopic('x.y')
      if (i === 50) surface.render()
    }
    const first = surface.arenaUsage()
    for (let i = 0; i < 300; i++) {
      const gone = surface.topic('x.y')
      gone.produced(i % 4, i + 1, 1)
      gone.group(i % 2 === 0 ? 'g' : `h${i}`).redelivered(1)
      surface.removeTopic('x.y')
    }
    const second = surface.arenaUsage()
    t.ok(second.slotsInUse <= first.slotsInUse, `slots in use do not grow (${first.slotsInUse} → ${second.slotsInUse})`)
    t.ok(second.slotsReserved <= first.slotsReserved + 64, `nor does the arena (${first.slotsReserved} → ${second.slotsReserved})`)
    const s = samples(surface.render())
    t.equal(s.get('mq_topic_messages_produced_total{topic="x_y"}'), 601, 'every removed name counted once')
    t.equal(s.get('mq_group_retries_total{topic="x_y",group="g"}'), 300, 'the retries of the removed groups with a live label')
    t.equal(s.get('mq_partition_last_seq{topic="x_y",partition="0"}'), 297, 'last_seq: the highest on a partition a live name has')
    t.equal([...s.keys()].filter((k) => k.includes('group="h')).length, 0, 'no series of a group label no live group has')
    t.end()
  })

  t.test(`${backend}: a worker's counts stay in the series of their label when its group and topic are removed`, async (t) => {
    const surface = surfaceOn(t, backend)
    surface.topic('a_b').produced(0, 1, 10)
    const worker = new Worker(`
      const { workerData, parentPort } = require('node:worker_threads')
      const { attachSurface } = require(${JSON.stringify(path.join(__dirname, '..', 'dist'))})
      const a = attachSurface(workerData.shared).topic('a.b')
      a.produced(0, 20, 200)
      a.group('g.1').redelivered(3)
      a.group('g_1').redelivered(1)
      parentPort.postMessage('counted')
      parentPort.once('message', () => { a.removeGroup('g.1'); parentPort.postMessage('removed') })
    `, { eval: true, workerData: { shared: surface.share() }, execArgv: [] })
    const next = () => new Promise((resolve) => worker.once('message', resolve))
    await next()
    surface.topic('a_b').group('g_1')
    const keys = ['mq_topic_messages_produced_total{topic="a_b"}', 'mq_topic_bytes_total{topic="a_b"}', 'mq_partition_last_seq{topic="a_b",partition="0"}', 'mq_group_retries_total{topic="a_b",group="g_1"}']
    const before = samples(surface.render())
    t.same(keys.map((k) => before.get(k)), [2, 210, 20, 4])
    worker.postMessage('remove')
    await next()
    t.notOk(samples(surface.render()).has(keys[3]), 'the removal marks the topic: no retries line for a while (docs/metrics.md)')
    // This thread's clock moved on past the mark (made with the worker's clock).
    const clock = leftClock.now
    leftClock.now = () => clock() + LEFT_MS
    t.teardown(() => (leftClock.now = clock))
    const afterGroup = samples(surface.render())
    t.same(keys.map((k) => afterGroup.get(k)), [2, 210, 20, 4], 'the worker removed a group whose label another group has: nothing goes down')
    t.equal(surface.removeTopic('a.b'), true)
    const afterTopic = samples(surface.render())
    t.same(keys.map((k) => afterTopic.get(k)), [2, 210, 20, 4], 'the main thread removed the worker\'s topic: nothing goes down')
    await worker.terminate()
    await new Promise((resolve) => setTimeout(resolve, 50))
    const afterExit = samples(surface.render())
    t.same(keys.map((k) => afterExit.get(k)), [2, 210, 20, 4], 'nor once the worker is gone (retired into the carry)')
    t.end()
  })
}

for (const backend of backends()) {
  t.test(`${backend}: a removed group whose label a live group of its topic has is a group collision, not a topic one`, (t) => {
    const surface = surfaceOn(t, backend)
    const pay = surface.topic('pay')
    pay.append(0, 1)
    const dotted = pay.group('g.1')
    pay.group('g_1')
    dotted.send(0, 1)
    dotted.redeliver(0, 1)
    t.equal(pay.removeGroup('g.1'), true)
    t.same(JSON.parse(JSON.stringify(surface.stats('collisions'))), {
      filter: 'collisions',
      topics: [],
      groups: [{ topic_label: 'pay', label: 'g_1', names: [{ topic: 'pay', group: 'g_1' }], removed_retries: 1 }],
    }, 'the topic has one name and no removed one: its label collides with nothing')
    t.equal(pay.removeGroup('g_1'), true)
    t.same(JSON.parse(JSON.stringify(surface.stats('collisions'))), { filter: 'collisions', topics: [], groups: [] }, 'and nothing is left once the last group with the label leaves')
    t.end()
  })
}
