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
// new topic `t<cycle>` is created with groups 'g' and 'h', and one message appended on a partition
// of the main thread's that 'h' sends and settles. Workers pick a ring slot at random, resolve its
// topic (handles kept until they throw) and publish, send and settle on it, each on a partition of
// its own, in batches between which they return to their event loop: even workers per message
// (append, send, settle), odd ones with ack floors (produced, dispatch, ackFloor, delivered). Every
// call is honest, so no fault of any kind may be raised: a removal that left a stale write in a
// reused block would show as CONSERVATION_BROKEN. A worker that resolves a name the main thread
// removed a moment before registers it again, as any thread may: the main thread removes such
// strays at every measurement.
//
// Memory is measured MEASURES_PER_QUARTER times per quarter (after a full GC in every thread); a
// quarter's figure is the median of its measurements, and the end-of-quarter measurement is
// reported beside it (RSS moves by several MB from one instant to the next).
const path = require('node:path')
const v8 = require('node:v8')
const { Worker, isMainThread, parentPort, workerData } = require('node:worker_threads')

const DIST = path.join(__dirname, '..', 'dist')
const MEASURES_PER_QUARTER = 8
const { CHUNK_BYTES } = require(path.join(DIST, 'core', 'backend.js')) // an arena chunk (a row's, or the shared row's)

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
  const every = Math.max(1, Math.ceil(cycles / (4 * MEASURES_PER_QUARTER)))
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
    const seq = topic.append(workerCount, 16) // the main thread's own partition
    h.send(workerCount, seq)
    h.settle(workerCount, seq, 'delivered')
    topics[slot] = topic
    ring[slot] = cycle
    if ((cycle + 1) % every === 0 || cycle + 1 === cycles) await measure(cycle + 1)
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
    // Each topic's group 'h' delivered the main thread's message and was removed: it stays in the
    // topic's counts.
    const produced = e.produced + 1
    const delivered = e.delivered + 1
    if (topic.produced !== produced || topic.delivered !== delivered) {
      if (failures.length < 10) failures.push(`${topic.name}: produced ${topic.produced} delivered ${topic.delivered}, recorded ${produced} and ${delivered}`)
    }
    checked++
  }
  // A quarter's figure: the median of its measurements (the last quarter's include the final one).
  const median = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1]
  const quarterOf = (q) => Math.min(3, Math.floor(((q.cycles - 1) * 4) / cycles))
  const byQuarter = [0, 1, 2, 3].map((n) => quarters.filter((q) => quarterOf(q) === n)).filter((qs) => qs.length > 0)
  const summary = byQuarter.map((qs) => ({
    cycles: qs[qs.length - 1].cycles,
    measures: qs.length,
    heapPlusExternal: median(qs.map((q) => q.heapPlusExternal)),
    rss: median(qs.map((q) => q.rss)),
    arenaChunks: median(qs.map((q) => q.arena.chunks)),
    rssAtEnd: qs[qs.length - 1].rss,
    used: median(qs.map((q) => q.heaps.used)),
    physical: median(qs.map((q) => q.heaps.physical)),
    seconds: qs[qs.length - 1].seconds,
  }))
  const first = summary[0]
  const last = summary[summary.length - 1]
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
    arenaGrowthMB: mb((last.arenaChunks - first.arenaChunks) * CHUNK_BYTES),
    rssAtEndGrowthMB: mb(last.rssAtEnd - first.rssAtEnd),
    everyHeapUsedGrowthMB: mb(last.used - first.used),
    everyHeapPhysicalGrowthMB: mb(last.physical - first.physical),
    rssRangeMB: [mb(Math.min(...quarters.map((q) => q.rss))), mb(Math.max(...quarters.map((q) => q.rss)))],
    logBytes: quarters.map((q) => q.arena.logBytes),
    slotsReserved: quarters.map((q) => q.arena.slotsReserved),
    freeBlocks: quarters.map((q) => q.arena.freeBlocks),
    quarters: summary.map((q) => ({ cycles: q.cycles, measures: q.measures, heapPlusExternalMB: mb(q.heapPlusExternal), rssMB: mb(q.rss), rssAtEndMB: mb(q.rssAtEnd), everyHeapUsedMB: mb(q.used), everyHeapPhysicalMB: mb(q.physical), seconds: q.seconds })),
    faults,
    failures,
  }
  if (checked !== live) failures.push(`${checked} topics survive, ${live} expected`)
  // Memory bounded by what is alive: flat from the first quarter to the last.
  if (result.heapPlusExternalGrowthMB > 8) failures.push(`heap + external grew ${result.heapPlusExternalGrowthMB} MB (bound 8)`)
  if (result.everyHeapUsedGrowthMB > 8) failures.push(`the heaps of every thread grew ${result.everyHeapUsedGrowthMB} MB (bound 8)`)
  // RSS holds the arena too, which grows (bounded below) while reclamation lags on a loaded machine:
  // what RSS gained beyond the arena's chunks is what no other check sees.
  const rssBeyondArena = mb(last.rss - first.rss - (last.arenaChunks - first.arenaChunks) * CHUNK_BYTES)
  if (rssBeyondArena > 8) failures.push(`RSS grew ${result.rssGrowthMB} MB from the first quarter's median to the last's, ${rssBeyondArena} MB beyond the arena's ${result.arenaGrowthMB} MB (bound 8)`)
  // The log is compacted into a checkpoint of what is alive and of the freed blocks waiting for
  // reuse (an entry of 20 bytes each), and grows to at most twice that before the next compaction.
  // The freed blocks plateau with the slowest thread's lag (a loaded machine: more; bounded by the
  // slots check below), so each measurement's bound counts the most seen up to it.
  let freeBlocksSeen = 0
  for (const q of quarters) {
    freeBlocksSeen = Math.max(freeBlocksSeen, q.arena.freeBlocks)
    const logBound = Math.max(256 * 1024, 3 * (live * 512 + freeBlocksSeen * 20)) + 65536
    if (q.arena.logBytes > logBound) {
      failures.push(`registration log ${q.arena.logBytes} B after ${q.cycles} cycles (bound ${logBound}: ${live} live topics, ${freeBlocksSeen} freed blocks)`)
      break
    }
  }
  // Slots reserved plateau at what churn needs while the slowest thread has not yet announced (more
  // when the machine is loaded); without reuse they would grow by ~20 per cycle.
  const firstSlots = quarters[0].arena.slotsReserved
  const lastSlots = quarters[quarters.length - 1].arena.slotsReserved
  if (lastSlots > 2 * firstSlots + live * 32) failures.push(`slots reserved grew from ${firstSlots} to ${lastSlots}: removed blocks are not reused`)
  // Every call was honest: any fault (a conservation episode included) is a defect.
  if (Object.keys(faults).length > 0) failures.push(`faults: ${JSON.stringify(faults)}`)
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
  const perMessage = partition % 2 === 0 // even workers settle per message, odd ones keep ack floors
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
        if (perMessage) {
          const seq = handle.topic.append(partition, 10)
          handle.counts[0]++
          handle.group.send(partition, seq)
          handle.group.settle(partition, seq, 'delivered')
        } else {
          handle.topic.produced(partition, ++handle.seq, 10)
          handle.counts[0]++
          if (!handle.group.dispatch(1)) throw new Error('dispatch() refused below max_in_flight')
          handle.group.ackFloor(partition, handle.seq)
          handle.group.delivered(1)
        }
        handle.counts[1]++
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
