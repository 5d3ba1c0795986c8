'use strict'
// What surface.snapshot() hands out: each topic's fields in the documented order, copies the
// caller may change. (That every topic, group and partition shares one hidden class, and that the
// hot-path calls fit V8's inlining budget, are V8 internals: bench/v8-guards.js checks them, in CI
// step 20-v8-guards.)
const t = require('tap')
const { backends, surfaceOn } = require('./helpers')

for (const backend of backends()) {
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
    t.same(snap.partitions, [{ partition: 2, lastSeq: 3, depth: 1 }]) // its log starts at seq 3: one message
    t.equal(snap.producing, false)
    snap.partitionNumbers.push(99)
    t.same(surface.snapshot().topics[0].partitionNumbers, [2], 'the partition numbers are a copy the caller may change')
  })

  t.test(`${backend}: JSON.stringify(snapshot()) works, leaving out each topic's and group's key`, async (t) => {
    const surface = surfaceOn(t, backend)
    const topic = surface.topic('a')
    topic.append(0, 10, 2)
    topic.group('g').settle(0, 1, 'delivered')
    const snapshot = surface.snapshot()
    t.ok(snapshot.topics[0].key && snapshot.topics[0].groups[0].key, 'the keys are there')
    const json = JSON.parse(JSON.stringify(snapshot)) // before: "Converting circular structure to JSON"
    t.notOk('key' in json.topics[0] || 'key' in json.topics[0].groups[0], 'and not in the JSON')
    t.same([json.topics[0].produced, json.topics[0].groups[0].delivered, json.topics[0].partitions], [2, 1, [{ partition: 0, lastSeq: 2, depth: 1 }]])
  })
}

