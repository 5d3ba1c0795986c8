'use strict'
// A group that left (removeGroup) stays in /metrics for DEPARTED_MS at lag 0 and in_flight 0, with
// no retries series (lib/core/departures.ts, docs/metrics.md "A group that left"), so that a group
// that lived between two scrapes is seen by one; never as a second series of a label a live group
// has; not in snapshot() nor /stats; on the scrape thread as on the main thread; gzip and plain
// bodies alike.
const t = require('tap')
const zlib = require('node:zlib')
const { backends, surfaceOn, request, scriptedWorker } = require('./helpers')
const { Departures, DEPARTED_MS, MAX_DEPARTED } = require('../dist/core/departures.js')
const { Renderer } = require('../dist/exposition/render.js')

const groupLines = (body) => body.split('\n').filter((line) => line.startsWith('mq_group_'))
const strip = (text) => text.replace(/^mq_broker_uptime_seconds .*$/m, '')

/** Departures.clock set to a number the test moves. */
function fakeClock(t) {
  const clock = { now: 1_000 }
  const before = Departures.clock
  Departures.clock = () => clock.now
  t.teardown(() => (Departures.clock = before))
  return clock
}

for (const backend of backends()) {
  t.test(`${backend}: a group registered and removed between two scrapes is in the next ones for ${DEPARTED_MS} ms, lag 0, in_flight 0, no retries`, (t) => {
    const clock = fakeClock(t)
    const surface = surfaceOn(t, backend)
    const topic = surface.topic('devices/7')
    const stays = topic.group('stays')
    surface.render()
    const session = topic.group('session.1', { from: 'latest' })
    const seq = topic.append(0, 10)
    session.send(0, seq)
    session.redeliver(0, seq)
    session.settle(0, seq, 'delivered')
    stays.send(0, seq)
    stays.settle(0, seq, 'delivered')
    t.equal(topic.removeGroup('session.1'), true)
    const expected = [
      'mq_group_lag{topic="devices_7",group="session_1"} 0',
      'mq_group_lag{topic="devices_7",group="stays"} 0',
      'mq_group_in_flight{topic="devices_7",group="session_1"} 0',
      'mq_group_in_flight{topic="devices_7",group="stays"} 0',
      'mq_group_retries_total{topic="devices_7",group="stays"} 0',
    ]
    t.same(groupLines(surface.render()), expected, 'shown, in label order, without a retries line')
    clock.now += DEPARTED_MS
    t.same(groupLines(surface.render()), expected, `still at ${DEPARTED_MS} ms`)
    t.same(surface.snapshot().topics[0].groups.map((g) => g.name), ['stays'], 'snapshot() shows the live groups only')
    t.notOk('departed' in surface.snapshot(), 'and says nothing of departed ones')
    t.same(surface.stats('groups').groups.map((g) => g.group), ['stays'], '/stats shows the live groups only')
    clock.now += 1
    t.same(groupLines(surface.render()), expected.filter((line) => !line.includes('session')), 'gone after')
    t.end()
  })

  t.test(`${backend}: never a second series: a label registered again shows the live group, without retries until ${DEPARTED_MS} ms have passed; one live under another raw name goes on whole`, (t) => {
    const clock = fakeClock(t)
    const surface = surfaceOn(t, backend)
    const topic = surface.topic('t')
    const g = topic.group('g')
    const seq = topic.append(0, 1)
    g.send(0, seq)
    topic.removeGroup('g')
    t.match(surface.render(), /^mq_group_in_flight\{topic="t",group="g"\} 0$/m, 'departed')
    const again = topic.group('g')
    again.send(0, seq)
    again.redeliver(0, seq)
    t.same(groupLines(surface.render()), ['mq_group_lag{topic="t",group="g"} 1', 'mq_group_in_flight{topic="t",group="g"} 1'], 'the live group\'s numbers, once, and no retries series: a group of the label left lately')
    clock.now += DEPARTED_MS + 1
    t.same(groupLines(surface.render()), ['mq_group_lag{topic="t",group="g"} 1', 'mq_group_in_flight{topic="t",group="g"} 1', 'mq_group_retries_total{topic="t",group="g"} 1'], 'its retries once the one that left is forgotten')
    // Two raw names of one label: one leaves while the other lives. Its retries stay in the label's
    // series (docs/metrics.md, label rule 4): the series goes on, nothing departed.
    const a = topic.group('x.y')
    topic.group('x_y')
    a.send(0, seq)
    a.redeliver(0, seq)
    topic.removeGroup('x.y')
    const body = surface.render()
    t.equal(body.match(/^mq_group_lag\{topic="t",group="x_y"\}/gm).length, 1, 'one lag series for the label')
    t.equal(body.match(/^mq_group_in_flight\{topic="t",group="x_y"\}/gm).length, 1, 'one in_flight series')
    t.match(body, /^mq_group_retries_total\{topic="t",group="x_y"\} 1$/m, 'and its retries, the removed name\'s kept')
    t.end()
  })

  t.test(`${backend}: a departed group goes with its topic; one of a topic registered again is not the new topic's`, (t) => {
    fakeClock(t)
    const surface = surfaceOn(t, backend)
    const topic = surface.topic('t')
    topic.group('g')
    topic.removeGroup('g')
    t.equal(groupLines(surface.render()).length, 2)
    surface.removeTopic('t')
    t.same(groupLines(surface.render()), [], 'the topic removed: no series of it')
    surface.topic('t')
    t.same(groupLines(surface.render()), [], 'a new topic under the name has no departed group')
    t.end()
  })

  t.test(`${backend}: a group a worker removes is shown by the main thread's /metrics`, async (t) => {
    fakeClock(t)
    const surface = surfaceOn(t, backend)
    surface.topic('t').group('w')
    surface.render()
    const worker = await scriptedWorker(surface)
    t.teardown(() => worker.close())
    t.equal(await worker.call('t', undefined, 'removeGroup', 'w'), true)
    t.same(groupLines(surface.render()), ['mq_group_lag{topic="t",group="w"} 0', 'mq_group_in_flight{topic="t",group="w"} 0'])
  })

  t.test(`${backend}: the scrape thread shows what the main thread removed since its last scrape, gzip and plain alike, and not what was removed before it started`, async (t) => {
    const surface = surfaceOn(t, backend)
    const topic = surface.topic('t')
    topic.group('before')
    topic.removeGroup('before') // before the scrape thread starts (with the first scrape)
    topic.group('stays')
    const server = await surface.listen({ port: 0 })
    let body = (await request(server.port, { path: '/metrics' })).text
    t.equal(surface.scrapeThread.mode, 'thread')
    t.same(groupLines(body).filter((line) => line.includes('before')), [], 'a removal published before the thread began to record is not its to show')
    topic.group('short')
    topic.removeGroup('short')
    body = (await request(server.port, { path: '/metrics' })).text
    t.same(groupLines(body), [
      'mq_group_lag{topic="t",group="short"} 0',
      'mq_group_lag{topic="t",group="stays"} 0',
      'mq_group_in_flight{topic="t",group="short"} 0',
      'mq_group_in_flight{topic="t",group="stays"} 0',
      'mq_group_retries_total{topic="t",group="stays"} 0',
    ], 'the thread shows the group that lived between its scrapes')
    const packed = await request(server.port, { path: '/metrics', headers: { 'accept-encoding': 'gzip' } })
    t.equal(strip(zlib.gunzipSync(packed.body).toString('utf8')), strip(body), 'the gzip body unpacks to the same')
    t.equal(surface.scrapeThread.scrapes, 3, 'all three from the thread')
  })
}

t.test('gzip renders from cached chunks stay exact as departed groups come and go', (t) => {
  const topics = []
  for (let i = 0; i < 400; i++) {
    topics.push({
      name: `t${String(i).padStart(3, '0')}`, label: `t${String(i).padStart(3, '0')}`, key: {}, produced: i, bytes: 0, delivered: i, dropped: 0, dlq: 0,
      partitionNumbers: [0], lastSeq: [i], depth: [0],
      groups: [{ name: 'b', label: 'b', key: {}, delivered: i, dropped: 0, dlq: 0, retries: 2, inFlight: 0, maxInFlight: 10, lag: 0, depth: 0 }],
    })
  }
  const snapshot = (departed) => ({
    uptimeSeconds: 1, connections: 0, leaderEpoch: 0, quorumState: 0, replicas: 0, inSync: 0, latency: null, topics,
    layout: { collisionFree: true }, ...(departed === undefined ? {} : { departed }),
  })
  const renderer = new Renderer()
  const plain = new Renderer()
  const steps = [
    undefined,
    [{ topic: 't005', group: 'a' }, { topic: 't070', group: 'c' }, { topic: 't070', group: 'b' }, { topic: 'gone', group: 'x' }],
    [{ topic: 't005', group: 'a' }, { topic: 't005', group: 'a' }],
    undefined,
    [{ topic: 't200', group: 'b' }],
    undefined,
  ]
  for (const [i, departed] of steps.entries()) {
    const s = snapshot(departed)
    const body = plain.render(s).toString('utf8')
    t.equal(zlib.gunzipSync(renderer.renderGzip(s)).toString('utf8'), body, `step ${i}: gunzipped, byte for byte the plain body`)
    if (i === 1) {
      t.match(body, /mq_group_lag\{topic="t070",group="b"\} 0\nmq_group_lag\{topic="t070",group="c"\} 0\n/, 'a departed label a live group has is not added; the other is, in order')
      t.notMatch(body, /retries_total\{topic="t070"/, 'no retries line for either')
      t.notMatch(body, /gone/, 'a topic not in the snapshot gets nothing')
    }
    if (i === 2) t.equal(body.match(/group="a"/g).length, 2, 'one lag and one in_flight line, however often it is listed')
    if (i === 3) t.notMatch(body, /group="[ac]"/, 'gone again')
    if (i === 4) t.notMatch(body, /retries_total\{topic="t200"/, 'a live label a group left: no retries line')
    if (i === 5) t.match(body, /^mq_group_retries_total\{topic="t200",group="b"\} 2$/m, 'and back once forgotten, though its numbers and labels never changed')
  }
  t.ok(renderer.gzipChunks.reused > 0, 'unchanged chunks were reused meanwhile')
  t.end()
})

t.test('Departures: removals before it began are not kept; the oldest go past MAX_DEPARTED; one per label; dead topics left out', (t) => {
  const clock = fakeClock(t)
  const departures = new Departures(5)
  const live = { label: 'live' }
  const dead = { label: 'dead' }
  departures.add(live, 'old', 5)
  t.equal(departures.size, 0, 'a removal published at or before the epoch it began at is not kept')
  for (let i = 0; i < MAX_DEPARTED + 3; i++) departures.add(live, `g${i}`, 6)
  t.equal(departures.size, MAX_DEPARTED, `at most ${MAX_DEPARTED}`)
  const shown = departures.current((topic) => topic === live)
  t.equal(shown[0].group, 'g3', 'the oldest went first')
  t.equal(shown.length, MAX_DEPARTED)
  clock.now += DEPARTED_MS
  t.equal(departures.current(() => true).length, MAX_DEPARTED, `kept ${DEPARTED_MS} ms`)
  clock.now += 1
  t.equal(departures.current(() => true), undefined, 'then all old enough to go')
  t.equal(departures.size, 0)
  for (let i = 0; i < 100; i++) departures.add(live, `h${i}`, 8)
  clock.now += DEPARTED_MS + 1
  departures.add(live, 'late', 8)
  t.equal(departures.size, 1, 'a removal lets go of those old enough to go, with no read between')
  const few = new Departures(0)
  few.add(live, 'a', 1)
  few.add(dead, 'a', 1)
  few.add(live, 'b', 2)
  few.add(live, 'a', 3)
  t.same(few.current((topic) => topic === live), [{ topic: 'live', group: 'a' }, { topic: 'live', group: 'b' }], 'one per (topic label, group label); a dead topic\'s left out')
  t.end()
})
