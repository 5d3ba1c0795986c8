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
    t.same(snap.partitions, [{ partition: 2, lastSeq: 3, depth: 1 }]) // its log starts at seq 3: one message
    t.equal(snap.producing, false)
    snap.partitionNumbers.push(99)
    t.same(surface.snapshot().topics[0].partitionNumbers, [2], 'the partition numbers are a copy the caller may change')
  })
}

// The hot path's speed rests on V8 inlining produced() and the settlement calls into the
// broker's loop, which it does only for functions of at most --max-inlined-bytecode-size bytes
// of bytecode (460 in Node 20). produced() is close to it: one local more measured 16 ns instead
// of 10 (not inlined). This checks the size, which unlike a timing does not depend on the machine.
t.test('the hot-path calls fit V8\'s inlining budget (bytecode size, not a timing)', async (t) => {
  const options = execFileSync(process.execPath, ['--v8-options'], { encoding: 'utf8' })
  const budget = Number(/--max-inlined-bytecode-size \(.*?\)\s+type: int\s+default: --max-inlined-bytecode-size=(\d+)/s.exec(options)?.[1] ?? 460)
  const script = `
    const lib = require(${JSON.stringify(path.join(__dirname, '..', 'dist'))})
    const surface = lib.createSurface({ max_in_flight: 1e6 })
    const topic = surface.topic('a')
    const group = topic.group('g')
    group.dispatch(1e5)
    for (let i = 1; i <= 5000; i++) { topic.produced(i & 3, (i + 3) >> 2, 10); group.delivered(); group.dropped(); group.redelivered() }
    surface.close()
  `
  for (const name of ['produced', 'delivered', 'dropped', 'redelivered']) {
    const out = execFileSync(process.execPath, ['--print-bytecode', `--print-bytecode-filter=${name}`, '-e', script], {
      encoding: 'utf8', env: { ...process.env, MQ_METRICS_BACKEND: 'js' }, maxBuffer: 64 << 20,
    })
    const lengths = [...out.matchAll(/Bytecode length: (\d+)/g)].map((m) => Number(m[1]))
    t.ok(lengths.length >= 1, `${name}: its bytecode was printed`)
    t.ok(Math.max(...lengths) <= budget, `${name}: ${Math.max(...lengths)} bytes of bytecode ≤ ${budget}`)
  }
})
