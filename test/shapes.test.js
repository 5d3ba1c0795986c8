'use strict'
// What surface.snapshot() hands out is fast to read: every topic of a snapshot has one hidden
// class (V8's map), and so does every group and every partition object. A caller's loop over
// 4,651 topics read its fields megamorphically when each topic had a map of its own (a spread
// copy did that): 2.1 ms for four fields per topic, 0.1 ms with one map. Checked in a child
// process, since V8 tells the maps apart only with --allow-natives-syntax.
const t = require('tap')
const path = require('node:path')
const { execFileSync } = require('node:child_process')
const { backends, surfaceOn } = require('./helpers')

const CHILD = `
  const lib = require(${JSON.stringify(path.join(__dirname, '..', 'dist'))})
  const surface = lib.createSurface({ max_in_flight: 1000 })
  for (let t = 0; t < 300; t++) {
    const topic = surface.topic('topic-' + t)
    const groups = ['billing', 'audit'].slice(0, 1 + (t % 2)).map((name) => topic.group(name))
    for (let p = 0; p < 1 + (t % 5); p++) {
      topic.produced(p, 10 + t + p, 100)
      groups[0].ackFloor(p, 5)
    }
    if (t % 7 === 0) { groups[0].dispatch(3); groups[0].delivered(2) }
  }
  const maps = (objects) => {
    const kinds = []
    for (const o of objects) if (!kinds.some((k) => %HaveSameMap(k, o))) kinds.push(o)
    return kinds.length
  }
  const snapshot = surface.snapshot()
  process.stdout.write(JSON.stringify({
    topics: snapshot.topics.length,
    topicMaps: maps(snapshot.topics),
    groupMaps: maps(snapshot.topics.flatMap((t) => t.groups)),
    partitionMaps: maps(snapshot.topics.flatMap((t) => t.partitions)),
  }))
  surface.close()
`

for (const backend of backends()) {
  t.test(`${backend}: every topic, group and partition of snapshot() shares its kind's hidden class`, async (t) => {
    const out = execFileSync(process.execPath, ['--allow-natives-syntax', '-e', CHILD], {
      encoding: 'utf8', env: { ...process.env, MQ_METRICS_BACKEND: backend },
    })
    t.same(JSON.parse(out), { topics: 300, topicMaps: 1, groupMaps: 1, partitionMaps: 1 })
  })

  t.test(`${backend}: a snapshot() topic lists its fields in the documented order`, async (t) => {
    const surface = surfaceOn(t, backend, { max_in_flight: 10 })
    const topic = surface.topic('a')
    topic.produced(2, 3, 30)
    topic.group('g').ackFloor(2, 1)
    const [snap] = surface.snapshot().topics
    t.same(Object.keys(snap), [
      'name', 'label', 'produced', 'bytes', 'producing', 'delivered', 'dropped', 'dlq',
      'partitionNumbers', 'lastSeq', 'depth', 'groups', 'key', 'partitions',
    ])
    t.same(snap.partitions, [{ partition: 2, lastSeq: 3, depth: 2 }])
    t.equal(snap.producing, false)
    snap.partitionNumbers.push(99)
    t.same(surface.snapshot().topics[0].partitionNumbers, [2], 'the partition numbers are a copy the caller may change')
  })
}
