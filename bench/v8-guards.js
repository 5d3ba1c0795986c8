'use strict'
// Guards on V8 internals that the hot path's speed rests on (CI step 20-v8-guards; not in
// `npm test`, whose tests check behaviour, not an engine's internals):
//  1. produced(), delivered(), dropped() and redelivered() fit V8's inlining budget
//     (--max-inlined-bytecode-size, 460 bytes of bytecode in Node 20): V8 inlines them into the
//     broker's loop only then (one local more in produced() measured 16 ns instead of 10). A
//     size, not a timing: it does not depend on the machine.
//  2. Every topic, group and partition object of surface.snapshot() shares its kind's hidden
//     class: a caller's loop over 4,651 topics read four fields in 2.1 ms when each topic had a
//     map of its own, 0.1 ms with one.
// Prints one line per check and exits 1 if any fails.
//   node bench/v8-guards.js
const path = require('node:path')
const { execFileSync } = require('node:child_process')

const DIST = JSON.stringify(path.join(__dirname, '..', 'dist'))
let failed = 0
const check = (ok, what) => {
  console.log(`${ok ? 'ok' : 'FAILED'}  ${what}`)
  if (!ok) failed++
}

// 1. Bytecode sizes.
const options = execFileSync(process.execPath, ['--v8-options'], { encoding: 'utf8' })
const budget = Number(/--max-inlined-bytecode-size \(.*?\)\s+type: int\s+default: --max-inlined-bytecode-size=(\d+)/s.exec(options)?.[1] ?? 460)
const hot = `
  const lib = require(${DIST})
  const surface = lib.createSurface({ max_in_flight: 1e6 })
  const topic = surface.topic('a')
  const group = topic.group('g')
  group.dispatch(1e5)
  for (let i = 1; i <= 5000; i++) { topic.produced(i & 3, (i + 3) >> 2, 10); group.delivered(); group.dropped(); group.redelivered() }
  surface.close()
`
for (const name of ['produced', 'delivered', 'dropped', 'redelivered']) {
  const out = execFileSync(process.execPath, ['--print-bytecode', `--print-bytecode-filter=${name}`, '-e', hot], {
    encoding: 'utf8', env: { ...process.env, MQ_METRICS_BACKEND: 'js' }, maxBuffer: 64 << 20,
  })
  const lengths = [...out.matchAll(/Bytecode length: (\d+)/g)].map((m) => Number(m[1]))
  check(lengths.length >= 1 && Math.max(...lengths) <= budget, `${name}(): ${lengths.length ? Math.max(...lengths) : 'no'} bytes of bytecode (budget ${budget})`)
}

// 2. Hidden classes of snapshot objects, on each backend this machine has.
const shapes = `
  const lib = require(${DIST})
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
    backend: surface.backend,
    topicMaps: maps(snapshot.topics),
    groupMaps: maps(snapshot.topics.flatMap((t) => t.groups)),
    partitionMaps: maps(snapshot.topics.flatMap((t) => t.partitions)),
  }))
  surface.close()
`
for (const backend of ['js', 'native']) {
  let seen
  try {
    seen = JSON.parse(execFileSync(process.execPath, ['--allow-natives-syntax', '-e', shapes], { encoding: 'utf8', env: { ...process.env, MQ_METRICS_BACKEND: backend } }))
  } catch (error) {
    if (backend === 'native' && /native core is unavailable/.test(String(error.stderr))) { console.log('skip  native: no native core here'); continue }
    throw error
  }
  check(seen.topicMaps === 1 && seen.groupMaps === 1 && seen.partitionMaps === 1, `${backend}: snapshot topics, groups and partitions have one hidden class each (${seen.topicMaps}, ${seen.groupMaps}, ${seen.partitionMaps})`)
}
process.exitCode = failed === 0 ? 0 : 1
