'use strict'
// Soak (docs/reliability.md): N operations over M topics with churn — create, record, removeTopic, create
// again under the same name — against an independent model of every number. At the end of each
// quarter the heap and RSS are measured after a full GC, and the arena's bookkeeping is read.
// It fails when a surviving counter differs from the model, when memory is not flat (the bounds
// below), or when slots leak (in use beyond what the live topics can hold, or ever-reserved slots
// still growing once churn is steady).
//
//   node test/soak.js               short: 1,000,000 operations over 1,000 topics, both backends
//   node test/soak.js --long        10,000,000 operations over 10,000 topics (npm run soak)
//   node test/soak.js --ops N --topics M [--churn C] [--backend js|native] [--seed S]
//   node test/soak.js --ops 1000000 --topics 5000 --churn 0.5     the 50%-churn figure of docs/reliability.md
//
// Each backend runs in a child process started with --expose-gc (runSoakInChild), so the
// measurement sees one surface and nothing else; test/soak.stress.js runs the short form.
const path = require('node:path')
const { prng, jsonFromChild } = require('./helpers')

/** Bounds, between the end of the first quarter and the end of the last (after GC). */
const BOUNDS = { rssGrowthBytes: 64 * 2 ** 20, heapGrowthBytes: 16 * 2 ** 20, heapPlusExternalGrowthBytes: 8 * 2 ** 20 }
const PARTITIONS = 4
const GROUPS = ['g0', 'g1']
const MAX_IN_FLIGHT = 50
// Per-topic slot blocks at most (lib/core/entities.ts): the topic, its partitions, each group and its floors.
const { TOPIC_SLOTS, PARTITION_SLOTS, GROUP_SLOTS, FLOOR_SLOTS } = require('../dist/core/entities')
const SLOTS_PER_TOPIC = TOPIC_SLOTS + PARTITIONS * PARTITION_SLOTS + GROUPS.length * (GROUP_SLOTS + PARTITIONS * FLOOR_SLOTS)
const LATENCY_SLOTS = 4096
/** Share of operations that remove a live topic (each is created again when next touched), by default. */
const CHURN = 0.002
/** Registration log bytes one live topic of this shape may take in a checkpoint (measured: ~400). */
const LOG_BYTES_PER_TOPIC = 512
/** The log is compacted past max(this, twice its checkpoint) (lib/core/log-capacity.ts). */
const LOG_COMPACT_MIN_BYTES = 256 * 1024
/** A scrape (render + snapshot) every this many operations. */
const SCRAPE_EVERY = 50_000


function newModel() {
  return {
    produced: 0,
    bytes: 0,
    lastSeq: new Array(PARTITIONS).fill(0),
    seen: new Array(PARTITIONS).fill(false),
    groups: GROUPS.map(() => ({ delivered: 0, dropped: 0, dlq: 0, retries: 0, inFlight: 0, floors: new Array(PARTITIONS).fill(0) })),
  }
}

/**
 * Runs the soak in this process on a fresh surface. Needs `global.gc` (node --expose-gc) for the
 * memory figures. Returns a plain JSON-able result; `result.failures` lists what went wrong.
 */
function runSoak({ operations, topics, backend, seed = 1, churn = CHURN }) {
  if (typeof global.gc !== 'function') throw new Error('runSoak needs node --expose-gc')
  process.env.MQ_METRICS_BACKEND = backend
  const { createSurface } = require(path.join(__dirname, '..', 'dist'))
  const surface = createSurface({ max_in_flight: MAX_IN_FLIGHT, max_topics: topics })
  const random = prng(seed)
  const handles = new Array(topics)
  const groupHandles = new Array(topics)
  const models = new Array(topics)
  const failures = []
  const fail = (message) => { if (failures.length < 20) failures.push(message) }
  const counts = { created: 0, removed: 0, produce: 0, dispatch: 0, refused: 0, delivered: 0, dropped: 0, dlq: 0, redelivered: 0, ackFloor: 0, scrapes: 0 }
  const quarters = []
  // The floors here move independently of deliveries, and groups dispatch whether or not anything
  // was produced, so the books are not conservation-honest: CONSERVATION_BROKEN, and
  // IN_FLIGHT_EXCEEDS_DEPTH for a group that dispatched more than its topic holds before its first
  // ackFloor(), are expected and counted apart; any other fault is a failure.
  const faults = {}
  surface.on('fault', (f) => (faults[f.code] = (faults[f.code] ?? 0) + 1))
  const started = Date.now()

  const measure = (done) => {
    global.gc()
    global.gc()
    const memory = process.memoryUsage()
    quarters.push({ operations: done, heapUsed: memory.heapUsed, rss: memory.rss, external: memory.external, arrayBuffers: memory.arrayBuffers, arena: surface.arenaUsage(), seconds: (Date.now() - started) / 1000 })
  }

  for (let op = 1; op <= operations; op++) {
    const k = Math.floor(random() * topics)
    const r = random()
    if (random() < churn) {
      if (handles[k] !== undefined) {
        if (surface.removeTopic(`topic-${k}`) !== true) fail(`removeTopic(topic-${k}) did not remove a live topic`)
        handles[k] = groupHandles[k] = models[k] = undefined
        counts.removed++
      }
      if (op % Math.ceil(operations / 4) === 0 || op === operations) {
        if (quarters.length < 4) measure(op)
      }
      continue
    }
    let topic = handles[k]
    if (topic === undefined) {
      topic = handles[k] = surface.topic(`topic-${k}`)
      groupHandles[k] = GROUPS.map((g) => topic.group(g))
      models[k] = newModel()
      counts.created++
    }
    const model = models[k]
    const p = Math.floor(random() * PARTITIONS)
    const g = random() < 0.5 ? 0 : 1
    const group = groupHandles[k][g]
    const gm = model.groups[g]
    const n = 1 + Math.floor(random() * 3)
    if (r < 0.4) {
      const seq = model.lastSeq[p] + n
      topic.produced(p, seq, 100 * n, n)
      model.produced += n
      model.bytes += 100 * n
      model.lastSeq[p] = seq
      model.seen[p] = true
      counts.produce++
    } else if (r < 0.55) {
      const accepted = group.dispatch(n)
      const expected = gm.inFlight + n <= MAX_IN_FLIGHT
      if (accepted !== expected) fail(`dispatch(${n}) on topic-${k}/${GROUPS[g]} returned ${accepted} at in_flight ${gm.inFlight}`)
      if (accepted) gm.inFlight += n
      else counts.refused++
      counts.dispatch++
    } else if (r < 0.7) {
      if (gm.inFlight >= n) { group.delivered(n); gm.inFlight -= n; gm.delivered += n; counts.delivered++ }
    } else if (r < 0.75) {
      if (gm.inFlight >= n) { group.dropped(n); gm.inFlight -= n; gm.dropped += n; counts.dropped++ }
    } else if (r < 0.78) {
      if (gm.dropped - gm.dlq >= 1) { group.deadLettered(1); gm.dlq++; counts.dlq++ }
    } else if (r < 0.83) {
      group.redelivered(n)
      gm.retries += n
      counts.redelivered++
    } else {
      const room = model.lastSeq[p] - gm.floors[p]
      if (room > 0) {
        const floor = gm.floors[p] + 1 + Math.floor(random() * room)
        if (group.ackFloor(p, floor) !== true) fail(`ackFloor(${p}, ${floor}) on topic-${k}/${GROUPS[g]} refused`)
        gm.floors[p] = floor
        model.seen[p] = true
        counts.ackFloor++
      }
    }
    if (op % SCRAPE_EVERY === 0) {
      surface.render()
      counts.scrapes++
    }
    if (op % Math.ceil(operations / 4) === 0 || op === operations) {
      if (quarters.length < 4) measure(op)
    }
  }

  // Every surviving topic against the model; every removed one absent.
  const snapshot = new Map(surface.snapshot().topics.map((x) => [x.name, x]))
  let live = 0
  for (let k = 0; k < topics; k++) {
    const name = `topic-${k}`
    const got = snapshot.get(name)
    const model = models[k]
    if (model === undefined) {
      if (got !== undefined) fail(`${name} was removed but is still in the snapshot`)
      continue
    }
    live++
    if (got === undefined) { fail(`${name} is missing`); continue }
    const partitions = []
    for (let p = 0; p < PARTITIONS; p++) if (model.seen[p]) partitions.push([p, model.lastSeq[p]])
    const want = {
      produced: model.produced,
      bytes: model.bytes,
      delivered: model.groups.reduce((s, x) => s + x.delivered, 0),
      dropped: model.groups.reduce((s, x) => s + x.dropped, 0),
      dlq: model.groups.reduce((s, x) => s + x.dlq, 0),
      partitions,
      groups: GROUPS.map((groupName, g) => [groupName, model.groups[g].delivered, model.groups[g].dropped, model.groups[g].dlq, model.groups[g].retries, model.groups[g].inFlight]),
    }
    const have = {
      produced: got.produced,
      bytes: got.bytes,
      delivered: got.delivered,
      dropped: got.dropped,
      dlq: got.dlq,
      partitions: got.partitions.map((x) => [x.partition, x.lastSeq]),
      groups: got.groups.map((x) => [x.name, x.delivered, x.dropped, x.dlq, x.retries, x.inFlight]),
    }
    if (JSON.stringify(have) !== JSON.stringify(want)) fail(`${name}: ${JSON.stringify(have)} ≠ model ${JSON.stringify(want)}`)
  }
  if (snapshot.size !== live) fail(`${snapshot.size} topics in the snapshot, ${live} in the model`)
  const unexpected = Object.keys(faults).filter((code) => code !== 'CONSERVATION_BROKEN' && code !== 'IN_FLIGHT_EXCEEDS_DEPTH')
  if (unexpected.length > 0) fail(`unexpected faults: ${JSON.stringify(faults)}`)

  // Memory: flat between the first and last quarter; slots bounded by what the live topics hold.
  const [first, , , last] = quarters
  const rssGrowth = last.rss - first.rss
  const heapGrowth = last.heapUsed - first.heapUsed
  const heapPlusExternalGrowth = last.heapUsed + last.external - first.heapUsed - first.external
  if (heapPlusExternalGrowth > BOUNDS.heapPlusExternalGrowthBytes) fail(`heap + external grew ${mb(heapPlusExternalGrowth)} MB from the first to the last quarter (bound ${mb(BOUNDS.heapPlusExternalGrowthBytes)} MB)`)
  if (rssGrowth > BOUNDS.rssGrowthBytes) fail(`RSS grew ${mb(rssGrowth)} MB from the first to the last quarter (bound ${mb(BOUNDS.rssGrowthBytes)} MB)`)
  if (heapGrowth > BOUNDS.heapGrowthBytes) fail(`heap grew ${mb(heapGrowth)} MB from the first to the last quarter (bound ${mb(BOUNDS.heapGrowthBytes)} MB)`)
  // A block never straddles two 8,192-slot chunks, so each chunk may waste up to one block's worth.
  const slotBound = LATENCY_SLOTS + topics * SLOTS_PER_TOPIC + Math.ceil((topics * SLOTS_PER_TOPIC) / 8192 + 1) * 16
  for (const q of quarters) {
    if (q.arena.slotsInUse > slotBound) fail(`${q.arena.slotsInUse} slots in use after ${q.operations} operations (bound ${slotBound} for ${topics} topics)`)
    if (q.arena.slotsReserved > slotBound) fail(`${q.arena.slotsReserved} slots ever reserved after ${q.operations} operations: freed slots are not reused (bound ${slotBound})`)
  }
  const usage = surface.arenaUsage()
  // The registration log is compacted: bounded by the live topics, never by how many were created.
  const logBound = Math.max(LOG_COMPACT_MIN_BYTES, 3 * topics * LOG_BYTES_PER_TOPIC) + 65536
  for (const q of quarters) {
    if (q.arena.logBytes > logBound) fail(`registration log ${q.arena.logBytes} B after ${q.operations} operations (bound ${logBound} B for ${topics} topics)`)
  }
  surface.close()
  return {
    backend: surface.backend,
    operations,
    topics,
    seed,
    seconds: (Date.now() - started) / 1000,
    counts,
    faults,
    live,
    quarters,
    rssGrowthMB: mb(rssGrowth),
    heapGrowthMB: mb(heapGrowth),
    heapPlusExternalGrowthMB: mb(heapPlusExternalGrowth),
    churn,
    slotBound,
    arena: usage,
    logBound,
    bounds: { rssGrowthMB: mb(BOUNDS.rssGrowthBytes), heapGrowthMB: mb(BOUNDS.heapGrowthBytes), heapPlusExternalGrowthMB: mb(BOUNDS.heapPlusExternalGrowthBytes) },
    failures,
  }
}

function mb(bytes) {
  return Math.round((bytes / 2 ** 20) * 10) / 10
}

/** Runs runSoak in a child `node --expose-gc` (the measurement's own process); resolves its result. */
function runSoakInChild(options, { timeoutMs = 600_000 } = {}) {
  const args = ['--expose-gc', __filename, '--child', '--ops', String(options.operations), '--topics', String(options.topics), '--backend', options.backend, '--seed', String(options.seed ?? 1), '--churn', String(options.churn ?? CHURN)]
  return jsonFromChild(`soak child (${options.backend})`, args, { timeoutMs })
}

function availableBackends() {
  try {
    require(path.join(__dirname, '..', 'build', 'Release', 'mq_metrics.node'))
    return ['js', 'native']
  } catch {
    return ['js']
  }
}

module.exports = { runSoak, runSoakInChild, availableBackends, BOUNDS, SHORT: { operations: 1_000_000, topics: 1000 }, LONG: { operations: 10_000_000, topics: 10_000 } }

if (require.main === module) {
  const argv = process.argv.slice(2)
  const flag = (name, fallback) => { const i = argv.indexOf(name); return i < 0 ? fallback : argv[i + 1] }
  const preset = argv.includes('--long') ? module.exports.LONG : module.exports.SHORT
  const operations = Number(flag('--ops', preset.operations))
  const topics = Number(flag('--topics', preset.topics))
  const seed = Number(flag('--seed', 1))
  const churn = Number(flag('--churn', CHURN))
  if (argv.includes('--child')) {
    process.stdout.write(JSON.stringify(runSoak({ operations, topics, backend: flag('--backend'), seed, churn })))
  } else {
    const chosen = flag('--backend') ? [flag('--backend')] : availableBackends()
    ;(async () => {
      let failed = false
      for (const backend of chosen) {
        process.stdout.write(`soak ${backend}: ${operations.toLocaleString('en')} operations over ${topics.toLocaleString('en')} topics … `)
        const r = await runSoakInChild({ operations, topics, backend, seed, churn }, { timeoutMs: 3_600_000 })
        console.log(`${r.seconds.toFixed(1)} s`)
        console.log(`  churn: ${r.counts.created} topics created, ${r.counts.removed} removed; ${r.live} live at the end; ${r.counts.scrapes} scrapes`)
        console.log(`  after GC, end of each quarter: heap ${r.quarters.map((q) => mb(q.heapUsed)).join(' / ')} MB; RSS ${r.quarters.map((q) => mb(q.rss)).join(' / ')} MB`)
        console.log(`  growth first→last quarter: heap ${r.heapGrowthMB} MB (bound ${r.bounds.heapGrowthMB}), heap + external ${r.heapPlusExternalGrowthMB} MB (bound ${r.bounds.heapPlusExternalGrowthMB}), RSS ${r.rssGrowthMB} MB (bound ${r.bounds.rssGrowthMB})`)
        console.log(`  slots in use ${r.arena.slotsInUse}, ever reserved ${r.arena.slotsReserved} (bound ${r.slotBound}); arena chunks ${r.arena.chunks}; registration log ${mb(r.arena.logBytes)} MB (bound ${mb(r.logBound)} MB)`)
        if (r.failures.length > 0) {
          failed = true
          console.log(`  FAILED:\n    ${r.failures.join('\n    ')}`)
        } else {
          console.log('  ok: every surviving counter matches the model; memory flat; no slot leak')
        }
      }
      process.exitCode = failed ? 1 : 0
    })().catch((error) => {
      console.error(error)
      process.exitCode = 1
    })
  }
}
