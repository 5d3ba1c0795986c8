'use strict'
// Invariants that must hold whichever threads make the calls: every
// interleaving here is scripted call by call across a real worker and the main thread.
const t = require('tap')
const { backends, surfaceOn, faultsOf, scriptedWorker, waitFor } = require('./helpers')

const MAX = Number.MAX_SAFE_INTEGER

/**
 * 8 messages settled of 6 dispatched, by two threads whose own-share fast paths cannot see it:
 * in_flight sums to −2 and no fault has been raised yet.
 */
async function overSettled(t, backend) {
  const surface = surfaceOn(t, backend, { max_in_flight: 10 })
  const faults = faultsOf(surface, { ignore: ['CONSERVATION_BROKEN'] })
  const a = await scriptedWorker(surface)
  t.teardown(() => a.close())
  const topic = surface.topic('t')
  const group = topic.group('g')
  topic.append(0, 10, 20) // what is dispatched is produced first (more in flight than produced is IN_FLIGHT_EXCEEDS_DEPTH)
  group.dispatch(4)
  await a.call('t', 'g', 'dispatch', 2) // A's own share: 2
  await a.call('t', 'g', 'dropped', 4) // beyond its share: checked across threads (6 in flight), A's share −2, Σ = 2
  group.delivered(4) // main's own share 4 covers it: 8 settled of 6 dispatched, Σ = −2
  return { surface, faults, a, group }
}

for (const backend of backends()) {
  t.test(`${backend}: settling more than was dispatched across threads is IN_FLIGHT_UNDERFLOW, and dispatch() keeps its bound`, async (t) => {
    // Before: A dispatch(5), main delivered(3), A delivered(5) settled 8 of 5 unseen; in_flight
    // summed to −3 and a later dispatch(13) passed max_in_flight 10.
    const surface = surfaceOn(t, backend, { max_in_flight: 10 })
    const faults = faultsOf(surface, { ignore: ['CONSERVATION_BROKEN'] })
    const a = await scriptedWorker(surface)
    t.teardown(() => a.close())
    const group = surface.topic('t').group('g')
    t.equal(await a.call('t', 'g', 'dispatch', 5), true)
    group.delivered(3) // settles 3 of A's 5: allowed across threads
    await a.call('t', 'g', 'delivered', 5) // 5 more: 8 settled of 5 dispatched
    const stats = surface.stats('groups', { topic: 't', group: 'g' }).groups[0]
    t.equal(stats.delivered, 8, 'every delivery is counted (it happened)')
    t.equal(stats.in_flight, 0, 'in_flight shows 0, not −3')
    t.same(faults.map((f) => [f.code, f.previous, f.attempted]), [['IN_FLIGHT_UNDERFLOW', 0, -3]], 'the over-settlement is reported once')
    t.equal(group.dispatch(13), false, 'dispatch(13) is refused: in_flight is 0, the bound 10')
    t.equal(group.dispatch(10), true, 'dispatch(10) fits exactly')
    t.equal(await a.call('t', 'g', 'dispatch', 1), false, 'and the worker cannot pass the bound either')
    t.equal(group.inFlight(), 10)
  })

  t.test(`${backend}: an over-settlement nobody dispatches after is found by the next dispatch, in either thread`, async (t) => {
    const { surface, faults, a, group } = await overSettled(t, backend)
    t.equal(await a.call('t', 'g', 'dispatch', 10), true, 'the worker\'s dispatch repairs in_flight to 0 first, then 10 fit')
    // A worker's faults reach the main thread through the fault channel, drained by a timer (≤ 1 s).
    t.ok(await waitFor(() => { surface.render(); return faults.length > 0 }, 5000), 'the worker\'s fault arrives')
    t.same(faults.map((f) => [f.code, f.attempted]), [['IN_FLIGHT_UNDERFLOW', -2]])
    t.equal(group.inFlight(), 10)
  })

  t.test(`${backend}: an over-settlement is found by the next scrape when nobody dispatches`, async (t) => {
    const { surface, faults, group } = await overSettled(t, backend)
    t.same(faults, [], 'not seen yet')
    t.match(surface.render(), 'mq_group_in_flight{topic="t",group="g"} 0\n', 'the scrape shows 0…')
    t.same(faults.map((f) => [f.code, f.attempted]), [['IN_FLIGHT_UNDERFLOW', -2]], '…and reports the over-settlement once')
    surface.render()
    t.equal(faults.length, 1, 'repaired: the next scrape finds nothing')
    t.equal(group.dispatch(10), true, 'the whole bound is available again')
    t.equal(group.dispatch(1), false)
  })

  t.test(`${backend}: dlq ≤ dropped is exact past 2^53 (folded amounts count) and never capped on display`, (t) => {
    const surface = surfaceOn(t, backend)
    const faults = faultsOf(surface, { ignore: ['CONSERVATION_BROKEN', 'IN_FLIGHT_UNDERFLOW'] })
    const group = surface.topic('t').group('g')
    group.dropped(MAX)
    t.equal(group.deadLettered(MAX), true)
    group.dropped(10) // the dropped cell passes 2^53: its amount is folded out of the row
    t.equal(group.deadLettered(5), true, 'credit 10: accepted (before: DLQ_WITHOUT_DROP, the fold was not counted)')
    t.equal(group.deadLettered(5), true, 'credit 5')
    t.equal(group.deadLettered(1), false, 'credit 0: refused')
    t.same(faults.map((f) => [f.code, f.previous, f.attempted]), [['DLQ_WITHOUT_DROP', 0, 1]])
    const conservation = surface.stats('conservation').topics[0]
    t.equal(String(conservation.dropped), String(BigInt(MAX) + 10n))
    t.equal(String(conservation.dlq), String(BigInt(MAX) + 10n))
    t.equal(conservation.dlq_within_dropped, true)
    t.match(surface.render(), `mq_topic_messages_dlq_total{topic="t"} ${BigInt(MAX) + 10n}\n`)
    t.end()
  })

  t.test(`${backend}: a thread's own drops are no DLQ credit once another thread dead-lettered them`, async (t) => {
    // Before: each thread's fast path checked only its own drops, so two threads could each use
    // the same drops (dlq reached 1.5× dropped across two threads, hidden by a cap on display).
    const surface = surfaceOn(t, backend)
    const faults = faultsOf(surface, { ignore: ['CONSERVATION_BROKEN', 'IN_FLIGHT_UNDERFLOW'] })
    const a = await scriptedWorker(surface)
    t.teardown(() => a.close())
    const group = surface.topic('t').group('g')
    await a.call('t', 'g', 'dropped', 5) // A dropped 5
    t.equal(group.deadLettered(5), true, 'the main thread dead-letters A\'s 5 drops')
    t.equal(await a.call('t', 'g', 'deadLettered', 5), false, 'A cannot dead-letter them again from its own row')
    await a.call('t', 'g', 'dropped', MAX - 5)
    t.equal(group.deadLettered(MAX - 5), true)
    await a.call('t', 'g', 'dropped', 7) // A's dropped cell passes 2^53 in A's row: folded by A
    t.equal(group.deadLettered(7), true, 'the main thread sees A\'s folded drops as credit')
    t.equal(await a.call('t', 'g', 'deadLettered', 1), false)
    const stats = surface.stats('conservation').topics[0]
    t.equal(stats.dlq_within_dropped, true)
    t.equal(String(stats.dlq), String(stats.dropped))
    t.ok(await waitFor(() => { surface.render(); return faults.length >= 2 }, 5000), 'the worker\'s faults arrive')
    t.same(faults.map((f) => f.code), ['DLQ_WITHOUT_DROP', 'DLQ_WITHOUT_DROP'])
  })
}
