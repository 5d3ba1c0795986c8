'use strict'
// The counter memory's real bound (lib/core/blocks.ts MAX_SLOT_CHUNKS: 16,384 chunks of 64 KiB),
// reached as a broker with many subscriptions reaches it: settlement windows of the largest size
// (32 KiB each) fill it after some 32,700 groups. Past it a registration is a LimitError
// `counter_memory` that registers nothing, from any thread; what is registered goes on; a removal
// gives its room back. Filling it takes ~10 s per backend, so it lives with the stress tests; the
// played-thread test in test/recording.test.js (a lowered bound) is the guard in `npm test`.
const t = require('tap')
const { backends, surfaceOn, scriptedWorker, sleep } = require('./helpers')

for (const backend of backends()) {
  t.test(`${backend}: the counter memory full: every registration refused whole, from any thread; removals give room back`, async (t) => {
    const surface = surfaceOn(t, backend, { max_groups_per_topic: 100_000 })
    const faults = []
    surface.on('fault', (fault) => faults.push(fault.code))
    const topic = surface.topic('t')
    topic.append(0, 100, 2)
    let made = 0
    let refused
    let refusedGroup
    for (let i = 0; i < 40_000 && refused === undefined; i++) {
      const group = topic.group(`g${i}`, { settle_window: 131_072 })
      try {
        group.send(0, 1)
        made++
      } catch (error) {
        refused = error
        refusedGroup = group
      }
    }
    t.match(refused, { name: 'LimitError', code: 'LIMIT_REACHED', limit: 'counter_memory', message: /^the settlement window of group "g\d+" on partition 0: the counter memory is full \(16384 chunks of 64 KiB, 1 GiB, .*nothing was registered/ })
    t.ok(made > 32_000 && made < 32_768, `${made} windows of 32 KiB filled 1 GiB`)
    const usage = surface.arenaUsage()

    // The refused group has no window: it still keeps floors, and each call refuses the same way.
    t.equal(refusedGroup.isInFlight(0, 1), false)
    t.throws(() => refusedGroup.settle(0, 1, 'delivered'), { limit: 'counter_memory' })
    t.equal(refusedGroup.dispatch(1), true, 'no window was registered (a window would refuse dispatch())')
    // New topics fill what is left of the chunk open, then are refused whole.
    let topics = 0
    let topicRefused
    for (; topics < 10_000 && topicRefused === undefined; topics++) {
      try { surface.topic(`new-${topics}`).append(0, 1) } catch (error) { topicRefused = error }
    }
    t.match(topicRefused, { limit: 'counter_memory', message: /^topic "new-\d+": the counter memory is full/ })
    t.same(surface.stats('topics', { topic: `new-${topics - 1}` }).topics, [], 'the refused topic is not registered')
    t.equal(surface.arenaUsage().slotsReserved, usage.slotsReserved + (topics - 1) * 6, 'only the topics taken hold slots (a topic and its partition: 6)')

    // A worker: what is registered records; a registration is refused as on the main thread.
    const worker = await scriptedWorker(surface)
    t.teardown(() => worker.close())
    t.equal(await worker.call('t', 'g0', 'settle', 0, 1, 'delivered'), true, 'a worker settles on a window registered before')
    await t.rejects(worker.call('t', refusedGroup.name, 'send', 0, 2), { code: 'LIMIT_REACHED' }, 'a worker\'s first send() of a group with no window')
    await t.rejects(worker.call('worker-topic', undefined, 'append', 0, 1), { code: 'LIMIT_REACHED' }, 'a worker\'s new topic')
    t.equal(topic.group('g1').settle(0, 1, 'dropped'), true, 'the main thread too')
    const text = surface.render()
    t.match(text, /^mq_group_in_flight\{topic="t",group="g0"\} 0$/m)
    t.match(text, /^mq_topic_messages_delivered_total\{topic="t"\} 1$/m, 'g0\'s, by the worker')
    t.match(text, new RegExp(`^mq_group_in_flight\\{topic="t",group="${refusedGroup.name}"\\} 1$`, 'm'), 'what the refused group dispatched')
    t.same(faults, [], 'no fault: nothing was counted wrong')

    // Removed groups' windows are reused once they have retired (every thread between tasks).
    for (let i = 2; i < 12; i++) topic.removeGroup(`g${i}`)
    let sent = false
    for (const until = Date.now() + 10_000; !sent && Date.now() < until;) {
      await sleep(20)
      try { sent = topic.group(`late`, { settle_window: 131_072 }).send(0, 1) } catch (error) { if (error.limit !== 'counter_memory') throw error }
    }
    t.equal(sent, true, 'a window registers in a removed group\'s room')
    t.equal(surface.arenaUsage().slotsReserved, usage.slotsReserved + (topics - 1) * 6, 'reused: no slot reserved anew')
  })
}
