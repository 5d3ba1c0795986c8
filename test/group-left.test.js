'use strict'
// A group that leaves (removeGroup) marks its topic (lib/core/left.ts): for LEFT_MS every scrape
// shows the topic's groups without their mq_group_retries_total lines, so that the conservation
// alert tells a window a departed group's deliveries may fall in — a group that lived between two
// scrapes included (docs/metrics.md, "A group that left"). The mark is in the topic's block of
// shared memory: every thread sees it, whichever removed the group, whenever it started, whatever
// the registration log was compacted to meanwhile.
const t = require('tap')
const zlib = require('node:zlib')
const { backends, surfaceOn, request, scriptedWorker, played } = require('./helpers')
const { leftClock, LEFT_MS } = require('../dist/core/left.js')
const { Renderer } = require('../dist/exposition/render.js')
const { C_LOG_GENERATION } = require('../dist/core/layout.js')
const { announce } = require('../dist/core/reclamation.js')

const groupLines = (body) => body.split('\n').filter((line) => line.startsWith('mq_group_'))
const strip = (text) => text.replace(/^mq_broker_uptime_seconds .*$/m, '')

/** leftClock.now set to a number the test moves. */
function fakeClock(t) {
  const clock = { now: 1e12 }
  const before = leftClock.now
  leftClock.now = () => clock.now
  t.teardown(() => (leftClock.now = before))
  return clock
}

for (const backend of backends()) {
  t.test(`${backend}: a group that lived between two scrapes leaves its topic without retries lines for ${LEFT_MS} ms; other topics keep theirs`, (t) => {
    const clock = fakeClock(t)
    const surface = surfaceOn(t, backend)
    const topic = surface.topic('devices/7')
    const stays = topic.group('stays')
    surface.topic('other').group('g')
    surface.render()
    const session = topic.group('session.1', { from: 'latest' })
    const seq = topic.append(0, 10)
    session.send(0, seq)
    session.settle(0, seq, 'delivered')
    stays.send(0, seq)
    stays.redeliver(0, seq)
    stays.settle(0, seq, 'delivered')
    t.equal(topic.removeGroup('session.1'), true)
    const marked = [
      'mq_group_lag{topic="devices_7",group="stays"} 0',
      'mq_group_lag{topic="other",group="g"} 0',
      'mq_group_in_flight{topic="devices_7",group="stays"} 0',
      'mq_group_in_flight{topic="other",group="g"} 0',
      'mq_group_retries_total{topic="other",group="g"} 0',
    ]
    t.same(groupLines(surface.render()), marked, 'the removed group leaves; its topic\'s groups show lag and in_flight, not retries')
    clock.now += LEFT_MS - 1
    t.same(groupLines(surface.render()), marked, `still so ${LEFT_MS - 1} ms after`)
    t.same(surface.snapshot().topics.map((x) => Object.keys(x).includes('groupLeft')), [false, false], 'snapshot() says nothing of it')
    t.equal(surface.stats('groups').groups.find((g) => g.group === 'stays').retries, 1, '/stats shows the retries all along')
    clock.now += 1
    t.match(surface.render(), /^mq_group_retries_total\{topic="devices_7",group="stays"\} 1$/m, `back ${LEFT_MS} ms after`)
    t.end()
  })

  t.test(`${backend}: a group registered again, a removal whose label stays, a removed topic`, (t) => {
    const clock = fakeClock(t)
    const surface = surfaceOn(t, backend)
    const topic = surface.topic('t')
    topic.group('g')
    topic.removeGroup('g')
    const again = topic.group('g')
    again.redelivered(2)
    t.same(groupLines(surface.render()), ['mq_group_lag{topic="t",group="g"} 0', 'mq_group_in_flight{topic="t",group="g"} 0'], 'registered again between two scrapes: no retries line')
    clock.now += LEFT_MS
    // One of two raw names of a label leaves (a session between two scrapes beside a group of its
    // label): what it delivered stays in the topic's counters, so it marks the topic too; the
    // label's series goes on, its retries kept (metrics.md, label rule 4).
    const a = topic.group('x.y')
    topic.group('x_y')
    a.redelivered(3)
    t.equal(topic.removeGroup('x.y'), true)
    t.notMatch(surface.render(), /retries_total\{topic="t"/, 'a removal whose label stays marks the topic')
    clock.now += LEFT_MS
    t.match(surface.render(), /^mq_group_retries_total\{topic="t",group="x_y"\} 3$/m, 'and the label\'s retries come back with the removed name\'s')
    // A topic removed and registered again under its name: a new block, no mark.
    topic.removeGroup('g')
    surface.removeTopic('t')
    surface.topic('t').group('h')
    t.match(surface.render(), /^mq_group_retries_total\{topic="t",group="h"\} 0$/m, 'the new topic of the name is not marked')
    t.end()
  })

  t.test(`${backend}: a group a worker removes marks its topic for the main thread's scrape`, async (t) => {
    const surface = surfaceOn(t, backend)
    surface.topic('t').group('w')
    surface.topic('t').group('stays')
    surface.render()
    const worker = await scriptedWorker(surface)
    t.teardown(() => worker.close())
    t.equal(await worker.call('t', undefined, 'removeGroup', 'w'), true)
    t.same(groupLines(surface.render()), ['mq_group_lag{topic="t",group="stays"} 0', 'mq_group_in_flight{topic="t",group="stays"} 0'])
  })

  t.test(`${backend}: the scrape thread shows the mark, also one made before it started, and after thousands of removals between two scrapes; gzip and plain alike`, async (t) => {
    const surface = surfaceOn(t, backend)
    const topic = surface.topic('t')
    topic.group('stays')
    topic.group('before')
    topic.removeGroup('before') // before the scrape thread starts (with the first scrape): a restarted thread is in the same place
    surface.topic('quiet').group('g')
    const server = await surface.listen({ port: 0 })
    let body = (await request(server.port, { path: '/metrics' })).text
    t.equal(surface.scrapeThread.mode, 'thread')
    t.notMatch(body, /retries_total\{topic="t"/, 'marked by a removal made before the thread started')
    t.match(body, /^mq_group_retries_total\{topic="quiet",group="g"\} 0$/m, 'another topic is not')
    // Sessions on another topic, then one on `quiet`, all between two scrapes: the registration
    // log is compacted meanwhile (its removals are gone from it by the next scrape).
    const busy = surface.topic('busy')
    for (let i = 0; i < 3000; i++) {
      busy.group(`s${i}`)
      busy.removeGroup(`s${i}`)
    }
    surface.topic('quiet').group('session')
    surface.topic('quiet').removeGroup('session')
    for (let i = 3000; i < 4500; i++) {
      busy.group(`s${i}`)
      busy.removeGroup(`s${i}`)
    }
    body = (await request(server.port, { path: '/metrics' })).text
    t.notMatch(body, /retries_total\{topic="quiet"/, 'the thread shows the mark of a session thousands of removals back')
    const packed = await request(server.port, { path: '/metrics', headers: { 'accept-encoding': 'gzip' } })
    t.equal(strip(zlib.gunzipSync(packed.body).toString('utf8')), strip(body), 'the gzip body unpacks to the same')
    t.equal(strip(body), strip(surface.render()), 'and the main thread renders the same')
    t.equal(surface.scrapeThread.scrapes, 3, 'all three from the thread')
  })

  t.test(`${backend}: the mark outlives a compaction of the registration log that a thread did not replay`, (t) => {
    const { main, worker, read } = played(backend)
    const topic = main.handles.topic('t')
    topic.group('stays')
    read(worker) // the worker's picture knows the topic
    const generation = main.memory.control[C_LOG_GENERATION]
    topic.group('session')
    topic.removeGroup('session')
    announce(worker.memory) // the worker is between its calls: the group retires, and the checkpoint drops it
    main.memory.lock()
    try {
      main.registry.sync()
      main.registry.reclaim()
      t.equal(main.registry.compact(), true, 'compacted')
    } finally {
      main.memory.unlock()
    }
    t.ok(main.memory.control[C_LOG_GENERATION] > generation, `the log was compacted (generation ${generation} → ${main.memory.control[C_LOG_GENERATION]})`)
    const t1 = read(worker).find((x) => x.name === 't')
    t.same(t1.groups.map((g) => g.name), ['stays'], 'the worker caught up from the checkpoint')
    t.equal(t1.groupLeft, true, 'and sees the mark, though it never replayed the removal')
    t.end()
  })
}

t.test('gzip renders from cached chunks stay exact as marks come and go, the layout fast path included', (t) => {
  const topics = (marked) => {
    const out = []
    for (let i = 0; i < 400; i++) {
      const name = `t${String(i).padStart(3, '0')}`
      out.push({
        name, label: name, key: keys[i], produced: i, bytes: 0, delivered: i, dropped: 0, dlq: 0, partitionNumbers: [0], lastSeq: [i], depth: [0],
        groups: [{ name: 'b', label: 'b', key: groupKeys[i], delivered: i, dropped: 0, dlq: 0, retries: 2, inFlight: 0, maxInFlight: 10, lag: 0, depth: 0 }],
        groupLeft: marked.includes(i),
      })
    }
    return out
  }
  const keys = Array.from({ length: 400 }, () => ({}))
  const groupKeys = Array.from({ length: 400 }, () => ({}))
  const layout = { collisionFree: true } // one layout object throughout: the renderer's fast path reuses texts
  const snapshot = (marked) => ({ uptimeSeconds: 1, connections: 0, leaderEpoch: 0, quorumState: 0, replicas: 0, inSync: 0, latency: null, topics: topics(marked), layout })
  const gz = new Renderer()
  const plain = new Renderer()
  for (const [i, marked] of [[], [5, 70], [5], [], [200], []].entries()) {
    const s = snapshot(marked)
    const body = plain.render(s).toString('utf8')
    t.equal(zlib.gunzipSync(gz.renderGzip(s)).toString('utf8'), body, `step ${i}: gunzipped, byte for byte the plain body`)
    for (const m of marked) t.notMatch(body, new RegExp(`retries_total\\{topic="t${String(m).padStart(3, '0')}"`), `step ${i}: t${m} has no retries line`)
    t.equal((body.match(/^mq_group_retries_total/gm) ?? []).length, 400 - marked.length, `step ${i}: every other topic has its own`)
  }
  t.ok(gz.gzipChunks.reused > 0, 'unchanged chunks were reused meanwhile')
  t.end()
})

t.test('a collision merge marks the label when any of its raw topics is marked', (t) => {
  const { mergeCollisions } = require('../dist/exposition/merge.js')
  const topic = (name, groupLeft) => ({
    name, label: 'a_b', key: {}, produced: 1, bytes: 0, delivered: 0, dropped: 0, dlq: 0, partitionNumbers: [0], lastSeq: [1], depth: [1],
    groups: [{ name: 'g', label: 'g', key: {}, delivered: 0, dropped: 0, dlq: 0, retries: 1, inFlight: 0, maxInFlight: 10, lag: 1, depth: 1 }],
    groupLeft,
  })
  t.equal(mergeCollisions([topic('a.b', false), topic('a_b', true)])[0].groupLeft, true)
  t.equal(mergeCollisions([topic('a.b', false), topic('a_b', false)])[0].groupLeft, false)
  t.end()
})

t.test('leftLately: within LEFT_MS either way of now, never for 0', (t) => {
  const { leftLately } = require('../dist/core/left.js')
  t.equal(leftLately(0, 5), false, '0: no group left')
  t.equal(leftLately(1e12, 1e12 + LEFT_MS - 1), true)
  t.equal(leftLately(1e12, 1e12 + LEFT_MS), false)
  t.equal(leftLately(1e12, 1e12 - 10), true, 'a mark another thread\'s clock put a little ahead')
  t.equal(leftLately(1e12, 1e12 - LEFT_MS), false, 'but not one a clock set back leaves for ever')
  t.end()
})
