'use strict'
// Topology churn for months, compressed: the main thread creates and removes topics
// (and a group on each) cycle after cycle while worker threads record on whichever topics are live.
// At the end of each quarter heap + external memory, RSS, every isolate's heap (the main thread's
// and each worker's: used, and the pages V8 keeps), the registration log and the slots reserved are
// measured after a full GC in every thread; at the end every surviving counter is compared with what
// the threads recorded into it.
//
//   node --expose-gc test/topology-soak.js [--cycles N] [--live L] [--workers W] [--backend js|native]
//
// Defaults: 200,000 cycles, 1,000 live topics, 3 workers (the CI stress step); the figure in
// docs/reliability.md is --cycles 10000000. Prints one JSON line; `failures` lists what went wrong.
//
// Each cycle replaces one topic of a ring of `live` slots: the old topic loses its group 'h' (it
// delivered one message, which must stay in the topic's counter), then the topic is removed, and a
// new topic `t<cycle>` is created with groups 'g' and 'h'. Workers pick a ring slot at random,
// resolve its topic (handles kept until they throw) and publish, dispatch and deliver on it, each on
// a partition of its own, in batches between which they return to their event loop. A worker that
// resolves a name the main thread removed a moment before registers it again, as any thread may:
// the main thread removes such strays at each quarter.
const path = require('node:path')
const v8 = require('node:v8')
const { Worker, isMainThread, parentPort, workerData } = require('node:worker_threads')

const DIST = path.join(__dirname, '..', 'dist')

function options(argv) {
  const value = (flag, fallback) => {
    const at = argv.indexOf(flag)
    return at < 0 ? fallback : argv[at + 1]
  }
  return {
    cycles: Number(value('--cycles', 200_000)),
    live: Number(value('--live', 1_000)),
    workers: Number(value('--workers', 3)),
    backend: value('--backend', undefined),
  }
}

async function main() {
  const { cycles, live, workers: workerCount, backend } = options(process.argv)
  if (typeof global.gc !== 'function') throw new Error('run with node --expose-gc')
  if (backend !== undefined) process.env.MQ_METRICS_BACKEND = backend
  const { createSurface } = require(DIST)
  const surface = createSurface({ max_topics: live * 4 })
  const ring = new Float64Array(new SharedArrayBuffer(8 * live)).fill(-1)
  const stop = new Int32Array(new SharedArrayBuffer(4))
  const topics = new Array(live)
  const faults = {}
  surface.on('fault', (f) => (faults[f.code] = (faults[f.code] ?? 0) + 1))
  const workers = []
  const threads = []
  /** Every worker collects its garbage too (RSS counts every thread's heap) and says what its heap holds. */
  const collectEverywhere = () => Promise.all(threads.map((worker) => new Promise((resolve) => {
    const onMessage = (message) => {
      if (message.collected) {
        worker.off('message', onMessage)
        resolve(message.heap)
      }
    }
    worker.on('message', onMessage)
    worker.postMessage('collect')
  })))
  for (let w = 0; w < workerCount; w++) {
    const worker = new Worker(__filename, { workerData: { shared: surface.share(), ring: ring.buffer, stop: stop.buffer, partition: w }, execArgv: [] }) // --expose-gc is process-wide: workers have gc() too
    threads.push(worker)
    workers.push(new Promise((resolve, reject) => {
      worker.on('message', (message) => message.done && resolve(message))
      worker.on('error', reject)
    }))
  }
  const quarters = []
  let strays = 0
  const sweep = () => {
    const wanted = new Set(topics.filter(Boolean).map((topic) => topic.name))
    for (const topic of surface.snapshot().topics) {
      if (!wanted.has(topic.name)) {
        surface.removeTopic(topic.name)
        strays++
      }
    }
  }
  const measure = async (done) => {
    sweep()
    const workerHeaps = await collectEverywhere()
    global.gc()
    global.gc()
    const memory = process.memoryUsage()
    const own = v8.getHeapStatistics()
    // Every isolate's heap: used (what its objects hold) and physical (the pages V8 keeps for it).
    const isolates = [own, ...workerHeaps]
    const heaps = { used: isolates.reduce((n, h) => n + h.used_heap_size, 0), physical: isolates.reduce((n, h) => n + h.total_physical_size, 0) }
    quarters.push({ cycles: done, heapPlusExternal: memory.heapUsed + memory.external, rss: memory.rss, heaps, arena: surface.arenaUsage(), seconds: (Date.now() - started) / 1000 })
  }
  const started = Date.now()
  let groupsRemoved = 0
  for (let cycle = 0; cycle < cycles; cycle++) {
    const slot = cycle % live
    const old = topics[slot]
    if (old !== undefined) {
      ring[slot] = -1
      if (old.removeGroup('h')) groupsRemoved++
      surface.removeTopic(old.name)
    }
    const topic = surface.topic(`t${cycle}`)
    topic.group('g')
    const h = topic.group('h')
    h.dispatch(1)
    h.delivered(1)
    topics[slot] = topic
    ring[slot] = cycle
    if ((cycle + 1) % Math.ceil(cycles / 4) === 0 || cycle + 1 === cycles) await measure(cycle + 1)
    if (cycle % 256 === 255) await new Promise((resolve) => setImmediate(resolve)) // the workers' messages, timers
  }
  Atomics.store(stop, 0, 1)
  const recorded = await Promise.all(workers)
  sweep()
  // What the workers recorded into each surviving topic (by its id: a name may have had strays).
  const expected = new Map()
  for (const counts of recorded) {
    for (const [id, produced, delivered] of counts.byTopic) {
      const e = expected.get(id) ?? { produced: 0, delivered: 0 }
      e.produced += produced
      e.delivered += delivered
      expected.set(id, e)
    }
  }
  const failures = []
  let checked = 0
  for (const topic of surface.snapshot().topics) {
    const e = expected.get(topic.key.id) ?? { produced: 0, delivered: 0 }
    // Each topic's group 'h' delivered one message and was removed: it stays in the topic's count.
    const delivered = e.delivered + 1
    if (topic.produced !== e.produced || topic.delivered !== delivered) {
      if (failures.length < 10) failures.push(`${topic.name}: produced ${topic.produced} delivered ${topic.delivered}, recorded ${e.produced} and ${delivered}`)
    }
    checked++
  }
  const first = quarters[0]
  const last = quarters[quarters.length - 1]
  const mb = (bytes) => Math.round((bytes / 2 ** 20) * 10) / 10
  const result = {
    backend: surface.backend,
    cycles,
    live,
    workers: workerCount,
    seconds: (Date.now() - started) / 1000,
    groupsRemoved,
    strays,
    checked,
    recorded: recorded.reduce((sum, r) => sum + r.operations, 0),
    heapPlusExternalGrowthMB: mb(last.heapPlusExternal - first.heapPlusExternal),
    rssGrowthMB: mb(last.rss - first.rss),
    everyHeapUsedGrowthMB: mb(last.heaps.used - first.heaps.used),
    everyHeapPhysicalGrowthMB: mb(last.heaps.physical - first.heaps.physical),
    logBytes: quarters.map((q) => q.arena.logBytes),
    slotsReserved: quarters.map((q) => q.arena.slotsReserved),
    quarters: quarters.map((q) => ({ cycles: q.cycles, heapPlusExternalMB: mb(q.heapPlusExternal), rssMB: mb(q.rss), everyHeapUsedMB: mb(q.heaps.used), everyHeapPhysicalMB: mb(q.heaps.physical), seconds: q.seconds })),
    faults,
    failures,
  }
  if (checked !== live) failures.push(`${checked} topics survive, ${live} expected`)
  // Memory bounded by what is alive: flat from the first quarter to the last.
  if (result.heapPlusExternalGrowthMB > 8) failures.push(`heap + external grew ${result.heapPlusExternalGrowthMB} MB (bound 8)`)
  if (result.everyHeapUsedGrowthMB > 8) failures.push(`the heaps of every thread grew ${result.everyHeapUsedGrowthMB} MB (bound 8)`)
  const logBound = Math.max(256 * 1024, 3 * live * 512) + 65536
  if (Math.max(...result.logBytes) > logBound) failures.push(`registration log ${Math.max(...result.logBytes)} B (bound ${logBound})`)
  // Slots reserved plateau at what churn needs while the slowest thread has not yet announced (more
  // when the machine is loaded); without reuse they would grow by ~20 per cycle.
  if (last.arena.slotsReserved > 2 * first.arena.slotsReserved + live * 32) failures.push(`slots reserved grew from ${first.arena.slotsReserved} to ${last.arena.slotsReserved}: removed blocks are not reused`)
  const otherFaults = Object.keys(faults).filter((code) => code !== 'CONSERVATION_BROKEN')
  if (otherFaults.length > 0) failures.push(`faults: ${otherFaults.join(', ')}`)
  await surface.close()
  console.log(JSON.stringify(result))
  if (failures.length > 0) process.exitCode = 1
}

/** A worker: records on live topics of the ring until told to stop; reports per topic id. */
function worker() {
  const { attachSurface } = require(DIST)
  const recorder = attachSurface(workerData.shared)
  const ring = new Float64Array(workerData.ring)
  const stop = new Int32Array(workerData.stop)
  const partition = workerData.partition
  const handles = new Map() // cycle → { topic, group, seq, counts }
  const byTopic = new Map() // topic id → [produced, delivered]
  let operations = 0
  let state = 0x9e3779b9
  const random = () => ((state = (Math.imul(state, 1664525) + 1013904223) >>> 0) / 2 ** 32)
  parentPort.on('message', (message) => {
    if (message !== 'collect') return
    global.gc()
    global.gc()
    parentPort.postMessage({ collected: true, heap: v8.getHeapStatistics() })
  })
  const batch = () => {
    if (Atomics.load(stop, 0) !== 0) {
      parentPort.postMessage({ done: true, operations, byTopic: [...byTopic].map(([id, [p, d]]) => [id, p, d]) })
      return
    }
    for (let i = 0; i < 200; i++) {
      const cycle = ring[Math.floor(random() * ring.length)]
      if (cycle < 0) continue
      let handle = handles.get(cycle)
      try {
        if (handle === undefined) {
          const topic = recorder.topic(`t${cycle}`)
          const group = topic.group('g')
          handle = { topic, group, seq: topic.lastSeqKnown(partition), counts: [0, 0] }
          byTopic.set(topic.entity.id, handle.counts)
          handles.set(cycle, handle)
        }
        handle.topic.produced(partition, ++handle.seq, 10)
        handle.counts[0]++
        if (handle.group.dispatch(1)) {
          handle.group.delivered(1)
          handle.counts[1]++
        }
        operations++
      } catch (error) {
        if (error.code !== 'TOPIC_REMOVED' && error.code !== 'GROUP_REMOVED') throw error
        if (handle !== undefined) byTopic.delete(handle.topic.entity.id) // gone: its counts no longer matter
        handles.delete(cycle)
      }
    }
    if (handles.size > ring.length) {
      // Let go of handles whose ring slot moved on (a broker lets go of what it no longer serves).
      const current = new Set(ring)
      for (const [cycle, handle] of handles) {
        if (!current.has(cycle)) {
          handles.delete(cycle)
          byTopic.delete(handle.topic.entity.id)
        }
      }
    }
    setImmediate(batch)
  }
  batch()
  parentPort.unref() // the message listener must not keep the worker alive after its report
}

if (isMainThread) {
  main().catch((error) => {
    console.error(error)
    process.exit(1)
  })
} else {
  worker()
}
