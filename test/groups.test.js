'use strict'
// topic.removeGroup(name): a subscription that ends. Its series leave the next scrape, what it
// delivered, dropped and dead-lettered stays in the topic's counters, depth is recomputed from the
// groups that remain, and its handles throw GROUP_REMOVED, in every thread.
const t = require('tap')
const { backends, surfaceOn, faultsOf, scriptedWorker, prng } = require('./helpers')
const { leftClock, LEFT_MS } = require('../dist/core/left.js')

const series = (body, name) => body.split('\n').filter((line) => line.startsWith(name))

for (const backend of backends()) {
  t.test(`${backend}: a removed group's series leave; the topic keeps its counts; depth follows the groups that remain`, (t) => {
    const surface = surfaceOn(t, backend)
    const faults = faultsOf(surface)
    const topic = surface.topic('orders')
    topic.produced(0, 200, 2000, 200)
    const stays = topic.group('stays')
    const ends = topic.group('ends')
    // 'stays' settles everything; 'ends' settles 150 (140 delivered, 10 dropped, 4 to the DLQ)
    // and stops: 50 messages are owed to it and its lag pins the partition's depth.
    stays.ackFloor(0, 200)
    for (let i = 0; i < 200; i++) if (stays.dispatch()) stays.delivered()
    ends.ackFloor(0, 150)
    ends.dispatch(150)
    ends.delivered(140)
    ends.dropped(10)
    ends.deadLettered(4)
    ends.redelivered(3)
    surface.render() // conservation baselines taken
    let body = surface.render()
    t.same(series(body, 'mq_partition_depth'), ['mq_partition_depth{topic="orders",partition="0"} 50'])
    let now = 1e12
    const clock = leftClock.now
    leftClock.now = () => now
    t.teardown(() => (leftClock.now = clock))
    t.equal(topic.removeGroup('ends'), true)
    body = surface.render()
    t.same(series(body, 'mq_group_lag'), ['mq_group_lag{topic="orders",group="stays"} 0'], 'its lag left')
    t.same(series(body, 'mq_group_in_flight'), ['mq_group_in_flight{topic="orders",group="stays"} 0'])
    t.same(series(body, 'mq_group_retries_total'), [], `its retries left with it, and for ${LEFT_MS} ms the topic shows none (docs/metrics.md, "A group that left")`)
    now += LEFT_MS - 1
    t.same(series(surface.render(), 'mq_group_retries_total'), [], 'none just before that')
    now += 1
    t.same(series(surface.render(), 'mq_group_retries_total'), ['mq_group_retries_total{topic="orders",group="stays"} 0'], 'the remaining group\'s after')
    t.same(series(body, 'mq_partition_depth'), ['mq_partition_depth{topic="orders",partition="0"} 0'], 'depth is recomputed from the groups that remain')
    t.same(series(body, 'mq_topic_messages_delivered_total'), ['mq_topic_messages_delivered_total{topic="orders"} 340'], 'counters never go down: 200 + 140')
    t.same(series(body, 'mq_topic_messages_dropped_total'), ['mq_topic_messages_dropped_total{topic="orders"} 10'])
    t.same(series(body, 'mq_topic_messages_dlq_total'), ['mq_topic_messages_dlq_total{topic="orders"} 4'])
    t.same(surface.stats('groups', { topic: 'orders' }).groups.map((g) => g.group), ['stays'], '/stats lists the groups that remain')
    t.same(surface.stats('conservation').topics[0].groups.map((g) => [g.group, g.residual]), [['stays', 0]], 'the remaining group\'s identity is unaffected')
    // The last group leaves: no one has consumed the partition's messages any more, so its depth
    // is every message since its base, as before the first group (docs/metrics.md).
    t.equal(topic.removeGroup('stays'), true)
    body = surface.render()
    t.same(series(body, 'mq_partition_depth'), ['mq_partition_depth{topic="orders",partition="0"} 200'], 'with no group left, depth is all 200 messages')
    t.same(series(body, 'mq_group_lag'), [], 'no group series')
    t.same(series(body, 'mq_topic_messages_delivered_total'), ['mq_topic_messages_delivered_total{topic="orders"} 340'], 'and the counters stay')
    t.same(faults, [], 'no fault')
    t.end()
  })

  t.test(`${backend}: old handles throw GROUP_REMOVED; the name registers again from zero; bad input changes nothing`, (t) => {
    const surface = surfaceOn(t, backend)
    const topic = surface.topic('t')
    topic.produced(0, 5, 50, 5)
    const old = topic.group('g', { max_in_flight: 7 })
    old.dispatch(3)
    old.delivered(1)
    t.throws(() => topic.removeGroup(''), RangeError)
    t.throws(() => topic.removeGroup(42), TypeError)
    t.throws(() => topic.removeGroup('x'.repeat(1025)), RangeError)
    t.equal(topic.removeGroup('never-registered'), false, 'an unknown group: false')
    t.equal(surface.stats('groups').groups.length, 1, 'nothing changed')
    t.equal(topic.removeGroup('g'), true)
    t.equal(topic.removeGroup('g'), false, 'twice: false')
    for (const call of [() => old.dispatch(), () => old.delivered(), () => old.dropped(), () => old.redelivered(), () => old.deadLettered(), () => old.ackFloor(0, 1), () => old.inFlight()]) {
      t.throws(call, { code: 'GROUP_REMOVED', name: 'RemovedGroupError' })
    }
    const again = topic.group('g')
    t.not(again, old, 'a new handle')
    const stats = surface.stats('groups').groups[0]
    t.same([stats.delivered, stats.in_flight, stats.max_in_flight, stats.lag], [0, 0, 1000, 5], 'a group created again starts from zero (and from the default bound)')
    t.equal(surface.topic('t').group('g'), again, 'same name → same handle again')
    surface.removeTopic('t')
    t.throws(() => again.delivered(), { code: 'TOPIC_REMOVED' }, 'a group of a removed topic says so')
    t.throws(() => topic.removeGroup('g'), { code: 'TOPIC_REMOVED' })
    t.end()
  })

  t.test(`${backend}: the main thread removes a group a worker records on`, async (t) => {
    const surface = surfaceOn(t, backend)
    const worker = await scriptedWorker(surface)
    t.teardown(() => worker.close())
    surface.topic('t').produced(0, 10, 100, 10)
    t.equal(await worker.call('t', 'g', 'dispatch', 6), true)
    await worker.call('t', 'g', 'delivered', 4)
    t.equal(surface.topic('t').removeGroup('g'), true)
    await t.rejects(worker.call('t', 'g', 'delivered', 1), { code: 'GROUP_REMOVED' }, 'the worker\'s handle throws')
    // The worker resolves the name again: a new group, from zero.
    t.equal(await worker.call('t', 'g', 'dispatch', 2), true)
    const groups = surface.stats('groups').groups
    t.same(groups.map((g) => [g.group, g.delivered, g.in_flight]), [['g', 0, 2]])
    t.match(surface.render(), 'mq_topic_messages_delivered_total{topic="t"} 4\n', 'the removed group\'s deliveries stay')
  })

  t.test(`${backend}: a worker removes a group; the main thread's handle throws`, async (t) => {
    const surface = surfaceOn(t, backend)
    const worker = await scriptedWorker(surface)
    t.teardown(() => worker.close())
    const group = surface.topic('t').group('g')
    group.dispatch(1)
    t.equal(await worker.call('t', undefined, 'removeGroup', 'g'), true)
    t.throws(() => group.delivered(), { code: 'GROUP_REMOVED' })
    t.same(surface.stats('groups').groups, [])
  })

  t.test(`${backend}: thousands of groups on one topic come and go: every thread lists the live ones in order and resolves each name`, async (t) => {
    // A topic's groups are kept sorted, built when read after groups came or went (entities.ts
    // TopicEntity.groups): registrations in bursts, removals between them, labels shared by
    // names that differ only where the label replaces characters.
    const surface = surfaceOn(t, backend, { max_groups_per_topic: 10_000 })
    const faults = faultsOf(surface)
    const topic = surface.topic('fanout')
    topic.append(0, 10)
    const worker = await scriptedWorker(surface)
    t.teardown(() => worker.close())
    const random = prng(7)
    const names = Array.from({ length: 3000 }, (_, i) => `c${Math.floor(random() * 1e6)}${i % 3 === 0 ? '.x' : i % 3 === 1 ? '_x' : ''}-${i}`)
    const live = new Set()
    const byLabelThenName = (a, b) => (a.label !== b.label ? (a.label < b.label ? -1 : 1) : a.group < b.group ? -1 : a.group > b.group ? 1 : 0)
    const check = async (what) => {
      const listed = surface.stats('groups', { topic: 'fanout' }).groups.map(({ group, label }) => ({ group, label }))
      t.same(listed.map((g) => g.group).sort(), [...live].sort(), `${what}: the live groups`)
      t.same(listed, [...listed].sort(byLabelThenName), `${what}: in order of label, then name`)
      const lines = surface.render().split('\n').filter((line) => line.startsWith('mq_group_in_flight{topic="fanout"')).map((line) => line.match(/group="([^"]*)"/)[1])
      t.same(lines, [...new Set(listed.map((g) => g.label))], `${what}: /metrics shows one line per label, in order`)
      for (const name of [...live].slice(0, 50)) t.equal(await worker.call('fanout', name, 'floor', 0), 0, `${what}: the worker resolves ${name}`)
    }
    for (const name of names.slice(0, 2000)) (topic.group(name), live.add(name))
    await check('2,000 registered')
    for (const name of names.slice(0, 2000)) if (random() < 0.4) (topic.removeGroup(name), live.delete(name))
    await check('some removed')
    for (const name of names.slice(0, 2500)) if (!live.has(name) && random() < 0.5) (topic.group(name), live.add(name))
    for (const name of names.slice(2500)) (t.equal(await worker.call('fanout', name, 'floor', 0), 0), live.add(name)) // registered by the worker
    await check('registered again, by both threads')
    t.equal(topic.group(names[2999]).floor(0), 0, 'the main thread resolves a name the worker registered')
    t.same(faults, [])
})
}
