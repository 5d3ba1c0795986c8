'use strict'
// mq-metrics against prom-client 15 on the same workload, in the same process.
//
// Reproduce:  npm run bench            (builds, then: node bench/run.js)
//             node bench/run.js --quick   (fewer rounds and scrapes, ~1 minute)
//             node bench/run.js --only hot,render   (sections: hot latency workers render memory load)
//             node bench/run.js --only load --nice 5 --json /tmp/nice5.json   (an experiment: the
//               main thread, which serves and renders the scrapes, at a lower scheduler weight)
//
// Method. Every candidate runs once per round, rounds interleaved (ours, prom-client, ours, …) so
// that drift in CPU frequency, GC pressure or the neighbours' load hits both alike; the first round
// is a discarded warm-up; each sample loops until at least SAMPLE_MS have passed (the batch doubles
// until one batch takes a tenth of that); the table shows the median over the rounds. Every loop
// returns a value that is summed into `sink` and checked at the end, so the JIT cannot drop the work.
// Each library gets its own loop functions (separate closures), so no call site sees both.
//
// The rows, and what is compared:
// - delivered: `group.delivered()` on a resolved handle, with in_flight available (a large
//   dispatch first) vs a prom-client child counter `inc()` (the child resolved once).
// - produced: `topic.produced(p, seq, bytes)` (produced, bytes, last_seq + its checks) over 16
//   partitions vs prom-client `inc()` + `inc(bytes)` + a 2-label gauge `set(seq)`, every child
//   resolved once (the cheapest way to use prom-client).
// - latency: bench/latency.js (record and read-out vs prom-client's Summary and hdr-histogram-js).
// - render: the issue's workload shape, topics × 16 partitions × 2 groups (43 samples per topic:
//   5 topic counters, 2 × 16 partition gauges, 3 × 2 group series). The issue names 4,348 topics
//   and 200,000 samples; with this metric set 4,348 topics give 186,971 samples, so the big size
//   is 4,651 topics: 200,000 samples, the count the targets are stated for. Built
//   with the same values in a surface and in a prom-client Registry holding the equivalent 15
//   families. Ours is the Buffer the HTTP server sends (`surface.handler()` on GET /metrics,
//   without gzip: snapshot + conservation check + render, in slices when large; scrape pacing off,
//   `scrapeShare: 1`, so the rows time the work, not the pacing's pauses); prom-client is `await registry.metrics()`.
//   The scaling table repeats this at 24, 233, 2,326 and 4,651 topics (~1k … 200k samples).
// - event-loop blocking: the longest gap between two setImmediate ticks around one 200k render.
// - memory per sample: a child process per library and size (node --expose-gc): heap + external
//   growth after the series exist and were scraped (ours: twice, gzip, as Prometheus scrapes, so
//   that the gzip chunk cache is in its steady state), divided by the sample count. Ours runs
//   the JS backend there so that the arena is counted exactly (its SharedArrayBuffer's length: the
//   native backend maps the same chunks, but V8 counts each external view of them again).
// - 2 workers: `produced()` + `delivered()` on 8 shared topics (each worker on its own partition),
//   one worker alone vs two at once, exact totals asserted afterwards. In the same rounds, two
//   more threads run the same recording loop each into a surface of its own (what the loop
//   scales to with nothing shared between the threads), and, as a control, the same two threads
//   run a loop with no mq-metrics in it: what 2 threads get over 1 on this machine at that
//   moment, whatever they run.
// - /metrics under load: a 200k-sample surface with the default options (scrape pacing on: back to
//   back, scrapes take at most scrapeShare of the main thread) served on 127.0.0.1 (port 0), 2
//   workers recording flat out; blocks of sequential gzip scrapes (one in flight, 10 s timeout each: "bounded")
//   alternate with quiet windows of the same length; p99 latency over all scrapes, and the
//   workers' throughput inside scrape windows vs inside quiet windows. Then, as information: the
//   same back-to-back loop against a 404 path that does no work (the control: what any busy third
//   thread costs two saturated cores), scrapes paced every 250 ms, and the gzip scrape with every
//   topic changed since the previous one (the chunk cache's worst case; workers paused).
//   Every window also reads CPU times (/proc/self/task/TID/schedstat, Linux): how much of a core the
//   main thread (which serves and renders the scrapes) took from the workers, and how much the
//   process's other threads did (process CPU less the main thread's and the workers').
//   `--nice N` (Linux) lowers the main thread's scheduler weight once the workers run (setpriority
//   on a thread changes that thread only): the experiment that shows how the throughput drop and
//   the scrape latency trade against each other. Not for the README table.
const { isMainThread, Worker, parentPort, workerData } = require('node:worker_threads')
const { performance } = require('node:perf_hooks')
const { SAMPLE_MS, checkSink, consume, median, percentile, rounds } = require('./sampling')
const path = require('node:path')
const fs = require('node:fs')
const os = require('node:os')
const http = require('node:http')
const zlib = require('node:zlib')
const { execFileSync } = require('node:child_process')

const DIST = path.join(__dirname, '..', 'dist')
const MAX_IN_FLIGHT = 0x7fffffff
const PARTITIONS = 16
const GROUPS = ['billing', 'audit']
const SAMPLES_PER_TOPIC = 5 + 2 * PARTITIONS + 3 * GROUPS.length
/** Topic counts of the scaling table; the last is the issue's "200k" workload. */
const SIZES = [24, 233, 2326, 4651]
const BIG = 4651
const TEN_K = 233

// ------------------------------------------------------------------------------------------------
// The same numbers for both libraries: topic t, partition p, group g.

function seqOf(t, p) {
  return 1000 + (((t * PARTITIONS + p) * 7919) % 90000)
}
function floorOf(t, p, g) {
  return seqOf(t, p) - ((p * 13 + g * 5) % 50)
}
function retriesOf(t, g) {
  return (t % 17) + g
}

function buildOurs(lib, topics, extra = {}, options = undefined) {
  const surface = lib.createSurface({ max_in_flight: MAX_IN_FLIGHT, max_topics: 100000, e2e_latency: true, ...extra }, options)
  for (let t = 0; t < topics; t++) {
    const topic = surface.topic(`topic-${t}`)
    const groups = GROUPS.map((name) => topic.group(name))
    const delivered = GROUPS.map(() => 0)
    for (let p = 0; p < PARTITIONS; p++) {
      const seq = seqOf(t, p)
      topic.produced(p, seq, seq * 180, seq)
      for (let g = 0; g < groups.length; g++) {
        groups[g].ackFloor(p, floorOf(t, p, g))
        delivered[g] += floorOf(t, p, g)
      }
    }
    // Conservation holds (design §4): every message up to the floor was delivered, none in flight.
    for (let g = 0; g < groups.length; g++) {
      if (!groups[g].dispatch(delivered[g])) throw new Error('bench: dispatch refused')
      groups[g].delivered(delivered[g])
      groups[g].redelivered(retriesOf(t, g))
    }
  }
  for (let i = 0; i < 1000; i++) surface.latency.record(1 + (i % 50) * 0.7)
  return surface
}

function buildPromClient(promClient, METRICS, topics) {
  const registry = new promClient.Registry()
  const make = {}
  for (const m of METRICS) {
    const Kind = m.type === 'counter' ? promClient.Counter : promClient.Gauge
    make[m.name] = new Kind({ name: m.name, help: m.help, labelNames: [...m.labels], registers: [registry] })
  }
  make.mq_broker_uptime_seconds.set(process.uptime())
  make.mq_connections.set(0)
  make.mq_leader_epoch.set(0)
  make.mq_quorum_state.set(0)
  for (let t = 0; t < topics; t++) {
    const topic = `topic-${t}`
    let produced = 0
    let bytes = 0
    let delivered = 0
    for (let p = 0; p < PARTITIONS; p++) {
      const seq = seqOf(t, p)
      produced += seq
      bytes += seq * 180
      let slowest = Infinity
      for (let g = 0; g < GROUPS.length; g++) {
        slowest = Math.min(slowest, floorOf(t, p, g))
        delivered += floorOf(t, p, g)
      }
      make.mq_partition_depth.labels(topic, String(p)).set(seq - slowest)
      make.mq_partition_last_seq.labels(topic, String(p)).set(seq)
    }
    make.mq_topic_messages_produced_total.labels(topic).inc(produced)
    make.mq_topic_messages_delivered_total.labels(topic).inc(delivered)
    make.mq_topic_messages_dropped_total.labels(topic).inc(0)
    make.mq_topic_messages_dlq_total.labels(topic).inc(0)
    make.mq_topic_bytes_total.labels(topic).inc(bytes)
    for (let g = 0; g < GROUPS.length; g++) {
      let lag = 0
      for (let p = 0; p < PARTITIONS; p++) lag = Math.max(lag, seqOf(t, p) - floorOf(t, p, g))
      make.mq_group_lag.labels(topic, GROUPS[g]).set(lag)
      make.mq_group_in_flight.labels(topic, GROUPS[g]).set(0)
      make.mq_group_retries_total.labels(topic, GROUPS[g]).inc(retriesOf(t, g))
    }
  }
  for (const quantile of ['p50', 'p90', 'p99']) make.mq_e2e_latency_ms.labels(quantile).set(12.5)
  return registry
}

/**
 * GET `path` through the surface's own handler: the Buffer the HTTP server sends (no gzip). A
 * large /metrics body is rendered in slices, so the answer may come a few event-loop turns later.
 * The response behaves as node:http's does where the handler looks: it emits 'finish' once the
 * body is handed over (on the next turn, as a socket would), and the scrape is complete then. The
 * handler gives the body's buffer back to the renderer on 'finish', so the next scrape renders
 * into it, as a server's scrapes do; without 'finish' every render took a fresh 12 MB buffer (a
 * server does that only for a response that never finishes).
 */
function handled(surface, path, headers = {}) {
  return new Promise((resolve, reject) => {
    const req = { url: path, method: 'GET', headers }
    const finished = []
    const res = {
      statusCode: 0, headersSent: false, destroyed: false,
      setHeader() {},
      once(event, listener) {
        if (event === 'finish') finished.push(listener)
        return res
      },
      end(chunk) {
        if (!Buffer.isBuffer(chunk)) return reject(new Error(`bench: ${path} was not answered with a Buffer`))
        // What the caller reads of the body (its length, or its text right away) is read before
        // its next scrape, the only thing that could write into a recycled buffer.
        setImmediate(() => {
          for (const listener of finished) listener()
          resolve(chunk)
        })
      },
    }
    if (!surface.handler(req, res)) reject(new Error(`bench: ${path} was not handled`))
  })
}

function scrapeBuffer(surface) {
  return handled(surface, '/metrics')
}

/** GET /metrics as Prometheus asks for it (Accept-Encoding: gzip): the gzip body. */
function scrapeGzip(surface) {
  return handled(surface, '/metrics', { 'accept-encoding': 'gzip' })
}

function countSamples(text) {
  let samples = 0
  for (const line of text.split('\n')) if (line !== '' && line[0] !== '#') samples++
  return samples
}

// ------------------------------------------------------------------------------------------------
// Worker threads: this file, started with workerData.

function workerMain() {
  const lib = require(path.join(DIST, 'index.js'))
  const { shared, index, topicNames, group, partition } = workerData
  const recorder = lib.attachSurface(shared)
  const topics = topicNames.map((name) => recorder.topic(name))
  const groups = topics.map((topic) => topic.group(group))
  const seqs = topics.map((topic) => topic.lastSeqKnown(partition))
  const dispatched = topics.map(() => 0)
  const delivered = topics.map(() => 0)
  const CHUNK = 1 << 16
  const mask = topics.length - 1 // a power of two

  // Keeps this thread's in_flight share ahead of what it is about to deliver (dispatch is rare).
  function refill(n) {
    for (let k = 0; k < topics.length; k++) {
      const need = delivered[k] + Math.ceil(n / topics.length) + CHUNK - dispatched[k]
      if (need > 0) {
        const amount = need + 10_000_000
        if (!groups[k].dispatch(amount)) throw new Error('bench worker: dispatch refused')
        dispatched[k] += amount
      }
    }
  }

  function record(n) {
    for (let i = 0; i < n; i++) {
      const k = i & mask
      topics[k].produced(partition, ++seqs[k], 100)
      groups[k].delivered()
    }
    for (let k = 0; k < topics.length; k++) delivered[k] += n / topics.length
    return seqs[0]
  }

  // The control: a loop of the same shape with no mq-metrics in it — four adds per message into
  // this thread's own array, nothing shared. How it scales from 1 to 2 threads is what this
  // machine gives two threads at that moment, whatever they run.
  const own = new Float64Array(topics.length * 8)
  function control(n) {
    for (let i = 0; i < n; i++) {
      const k = (i & mask) << 3
      own[k] += 1
      own[k + 1] += 100
      own[k + 2] = i
      own[k + 3] += 1
    }
    return own[0]
  }

  parentPort.on('message', (message) => {
    if (message.cmd === 'run' || message.cmd === 'control') {
      if (message.cmd === 'run') refill(message.n)
      const start = performance.timeOrigin + performance.now()
      const check = message.cmd === 'run' ? record(message.n) : control(message.n)
      const end = performance.timeOrigin + performance.now()
      parentPort.postMessage({ index, start, end, n: message.n, check })
    } else if (message.cmd === 'flat') {
      // Flat out until progress[0] is 1 (2: paused); progress[1 + index] counts CHUNKs done.
      const progress = new Int32Array(message.progress)
      let chunks = 0
      for (let state = 0; state !== 1; state = Atomics.load(progress, 0)) {
        if (state === 2) {
          Atomics.wait(progress, 0, 2, 10) // paused: the main thread measures without us
          continue
        }
        refill(CHUNK)
        record(CHUNK)
        Atomics.store(progress, 1 + index, ++chunks)
      }
      parentPort.postMessage({ index, chunks, chunk: CHUNK })
    } else if (message.cmd === 'state') {
      parentPort.postMessage({ index, seqs: [...seqs], dispatched: [...dispatched], delivered: [...delivered] })
    } else if (message.cmd === 'exit') {
      process.exit(0)
    }
  })
  let tid
  try {
    tid = Number(fs.readlinkSync('/proc/thread-self').split('/').pop()) // "PID/task/TID" (Linux)
  } catch {}
  parentPort.postMessage({ index, ready: true, tid })
}

// ------------------------------------------------------------------------------------------------
// Memory: one child process per library and size.

async function memoryChild(library, topics) {
  if (typeof global.gc !== 'function') throw new Error('memory child needs --expose-gc')
  const settle = async () => {
    for (let i = 0; i < 3; i++) {
      global.gc()
      await new Promise((resolve) => setImmediate(resolve))
    }
    return process.memoryUsage()
  }
  let arenaBytes = () => 0
  let scrape
  let warm
  if (library === 'ours') {
    const lib = require(path.join(DIST, 'index.js'))
    // Load and compile the code and allocate the fixed parts before the baseline: a small surface
    // (a few chunks) through every scrape path — compiled code is per process, not per sample.
    warm = buildOurs(lib, 100)
    for (let i = 0; i < 3; i++) await scrapeGzip(warm) // bulk, then compressed chunks, then reused
    await scrapeBuffer(warm)
  } else {
    const promClient = require('prom-client')
    const { METRICS } = require(path.join(DIST, 'exposition', 'allowlist.js'))
    warm = buildPromClient(promClient, METRICS, 100)
    for (let i = 0; i < 3; i++) await warm.metrics()
  }
  const before = await settle()
  let body
  if (library === 'ours') {
    const lib = require(path.join(DIST, 'index.js'))
    const surface = buildOurs(lib, topics)
    const shared = surface.share()
    if (shared.arena.backend !== 'js') throw new Error('memory child must run the JS backend (exact arena size)')
    arenaBytes = () => shared.arena.buffer.byteLength
    // A scrape as Prometheus makes it: gzip, so the gzip chunk cache is counted too.
    scrape = async () => zlib.gunzipSync(await scrapeGzip(surface)).toString('latin1')
    global.keep = surface
  } else {
    const promClient = require('prom-client')
    const { METRICS } = require(path.join(DIST, 'exposition', 'allowlist.js'))
    const registry = buildPromClient(promClient, METRICS, topics)
    scrape = () => registry.metrics()
    global.keep = registry
  }
  const built = await settle()
  // Ours: the first gzip scrape of new series is one plain body compressed whole; from the second
  // on, the chunk cache holds compressed fragments: that steady state is what is counted.
  if (library === 'ours') await scrape()
  body = await scrape()
  const samples = countSamples(body)
  body = undefined
  const scraped = await settle()
  const delta = (after) => after.heapUsed - before.heapUsed + (after.external - before.external)
  process.stdout.write(JSON.stringify({
    library, topics, samples,
    builtBytes: delta(built) + arenaBytes(),
    scrapedBytes: delta(scraped) + arenaBytes(),
    heapBytes: scraped.heapUsed - before.heapUsed,
    externalBytes: scraped.external - before.external,
    arenaBytes: arenaBytes(),
    rssBytes: scraped.rss - before.rss,
  }) + '\n')
}

function runMemoryChild(library, topics) {
  const env = { ...process.env }
  if (library === 'ours') env.MQ_METRICS_BACKEND = 'js'
  const out = execFileSync(process.execPath, ['--expose-gc', __filename, '--memory-child', library, String(topics)], {
    env, encoding: 'utf8', maxBuffer: 1 << 20,
  })
  return JSON.parse(out.trim().split('\n').pop())
}

// ------------------------------------------------------------------------------------------------
// Sampling.

const options = parseOptions(process.argv.slice(2))
const ROUNDS = options.quick ? 5 : 7

function parseOptions(argv) {
  const known = new Set(['hot', 'latency', 'workers', 'render', 'memory', 'load'])
  const out = { quick: false, only: known, json: path.join(__dirname, 'results', 'latest.json'), nice: 0 }
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--quick') out.quick = true
    else if (argv[i] === '--only') out.only = new Set(argv[++i].split(','))
    else if (argv[i] === '--json') out.json = argv[++i]
    else if (argv[i] === '--nice') {
      out.nice = Number(argv[++i])
      if (!Number.isInteger(out.nice) || out.nice < 1 || out.nice > 19) throw new Error(`--nice takes 1 to 19, not ${argv[i]}`)
    }
    else if (argv[i] === '--memory-child') break
    else throw new Error(`unknown option ${argv[i]} (known: --quick, --only SECTIONS, --json FILE, --nice N)`)
  }
  for (const section of out.only) if (!known.has(section)) throw new Error(`unknown section ${section} (known: ${[...known].join(', ')})`)
  return out
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

function log(text) {
  process.stderr.write(`[bench ${(performance.now() / 1000).toFixed(1)} s] ${text}\n`)
}

// ------------------------------------------------------------------------------------------------
// Sections.

async function hotPath(lib, promClient) {
  const surface = lib.createSurface({ max_in_flight: MAX_IN_FLIGHT })
  const topic = surface.topic('orders')
  const group = topic.group('billing')
  let available = 0
  const ensureInFlight = (n) => {
    if (available >= n) return
    const amount = Math.min(MAX_IN_FLIGHT - available, 1_500_000_000)
    if (!group.dispatch(amount)) throw new Error('bench: dispatch refused')
    available += amount
  }
  let seq = 0

  const registry = new promClient.Registry()
  const delivered = new promClient.Counter({ name: 'mq_topic_messages_delivered_total', help: 'h', labelNames: ['topic'], registers: [registry] })
  const produced = new promClient.Counter({ name: 'mq_topic_messages_produced_total', help: 'h', labelNames: ['topic'], registers: [registry] })
  const bytes = new promClient.Counter({ name: 'mq_topic_bytes_total', help: 'h', labelNames: ['topic'], registers: [registry] })
  const lastSeq = new promClient.Gauge({ name: 'mq_partition_last_seq', help: 'h', labelNames: ['topic', 'partition'], registers: [registry] })
  const inFlight = new promClient.Gauge({ name: 'mq_group_in_flight', help: 'h', labelNames: ['topic', 'group'], registers: [registry] })
  const deliveredChild = delivered.labels('orders')
  const producedChild = produced.labels('orders')
  const bytesChild = bytes.labels('orders')
  const lastSeqChildren = Array.from({ length: PARTITIONS }, (_, p) => lastSeq.labels('orders', String(p)))
  const inFlightChild = inFlight.labels('orders', 'billing')
  let promSeq = 0

  const candidates = [
    {
      operation: 'delivered', library: 'ours', firstBatch: 1024,
      run(n) {
        ensureInFlight(n)
        for (let i = 0; i < n; i++) group.delivered()
        available -= n
        return available
      },
    },
    {
      operation: 'delivered', library: 'promClient', firstBatch: 1024,
      run(n) {
        for (let i = 0; i < n; i++) deliveredChild.inc()
        return n
      },
    },
    {
      operation: 'produced', library: 'ours', firstBatch: 1024,
      run(n) {
        for (let i = 0; i < n; i++) topic.produced(i & (PARTITIONS - 1), ++seq, 100)
        return seq
      },
    },
    {
      operation: 'produced', library: 'promClient', firstBatch: 1024,
      run(n) {
        for (let i = 0; i < n; i++) {
          producedChild.inc()
          bytesChild.inc(100)
          lastSeqChildren[i & (PARTITIONS - 1)].set(++promSeq)
        }
        return promSeq
      },
    },
    {
      operation: 'dispatch', library: 'ours', firstBatch: 1024,
      run(n) {
        let accepted = 0
        for (let i = 0; i < n; i++) if (group.dispatch()) accepted++
        available += accepted
        return accepted
      },
    },
    {
      operation: 'dispatch', library: 'promClient', firstBatch: 1024,
      run(n) {
        for (let i = 0; i < n; i++) inFlightChild.inc()
        return n
      },
    },
  ]
  const timings = await rounds(candidates, ROUNDS)
  await surface.close()
  return summarise(candidates, timings)
}

function summarise(candidates, timings) {
  const byOperation = new Map()
  candidates.forEach((c, i) => {
    const row = byOperation.get(c.operation) ?? { operation: c.operation }
    row[`${c.library}Ns`] = median(timings[i])
    row[`${c.library}Samples`] = timings[i]
    byOperation.set(c.operation, row)
  })
  for (const row of byOperation.values()) row.ratio = row.promClientNs / row.oursNs
  return Object.fromEntries(byOperation)
}

async function workersSection(lib) {
  const surface = lib.createSurface({ max_in_flight: MAX_IN_FLIGHT })
  const topicNames = Array.from({ length: 8 }, (_, k) => `shared-${k}`)
  for (const name of topicNames) surface.topic(name).group('g')
  const shared = surface.share()
  const workers = await startWorkers(shared, topicNames, 'g', [0, 1])
  // The second control: the same recording loop in two more threads, each recording into a
  // surface of its own (nothing shared between them), in the same rounds. Threads of their own,
  // so that each thread's JIT sees one surface, as the measured workers' does.
  const privates = [0, 1].map(() => {
    const own = lib.createSurface({ max_in_flight: MAX_IN_FLIGHT })
    for (const name of topicNames) own.topic(name).group('g')
    return own
  })
  const loners = await Promise.all(privates.map((own, k) => startWorkers(own.share(), topicNames, 'g', [k]).then(([w]) => w)))
  /** Runs `cmd` for `n` messages on the threads `indices` of `pool` at once; their answers. */
  const runOn = (pool) => (indices, n, cmd = 'run') => Promise.all(indices.map((i) => request(pool[i], { cmd, n }, (m) => m.n !== undefined)))
  const run = runOn(workers)
  const runOwn = runOn(loners)

  // Calibrate: one worker, ~250 ms per run, a multiple of the topic count.
  const calibrate = async (cmd) => {
    let n = 1 << 20
    for (;;) {
      const [r] = await run([0], n, cmd)
      if (r.end - r.start >= 150 || n >= 1 << 28) return Math.max(8, Math.round((n * 250) / (r.end - r.start) / 8) * 8)
      n *= 2
    }
  }
  const n = await calibrate('run')
  const controlN = await calibrate('control')
  // Warm each worker up alone until its runs settle: V8 reaches its steady code for the loop only
  // after a few calls (measured here: 25–45 ns per message on the first call, 17–24 on the next
  // one or two, then 14.5), and a worker measured before that made the 2-vs-1 ratio swing from
  // 1.2× to 2.0× between runs.
  const warmUp = []
  for (const worker of [0, 1]) warmUp.push(await settle(() => run([worker], n).then(([r]) => r.end - r.start)))
  for (const worker of [0, 1]) await settle(() => run([worker], controlN, 'control').then(([r]) => r.end - r.start))
  for (const worker of [0, 1]) await settle(() => runOwn([worker], n).then(([r]) => r.end - r.start))
  const samples = { single: [], pair: [], controlSingle: [], controlPair: [], ownSingle: [], ownPair: [] }
  for (let round = 0; round <= ROUNDS; round++) {
    const order = round % 2
      ? ['pair', 'single', 'controlPair', 'controlSingle', 'ownPair', 'ownSingle']
      : ['single', 'pair', 'controlSingle', 'controlPair', 'ownSingle', 'ownPair']
    for (const which of order) {
      const isControl = which.startsWith('control')
      const count = isControl ? controlN : n
      const indices = which.endsWith('ingle') ? [0] : [0, 1]
      const results = which.startsWith('own') ? await runOwn(indices, count) : await run(indices, count, isControl ? 'control' : 'run')
      const start = Math.min(...results.map((r) => r.start))
      const end = Math.max(...results.map((r) => r.end))
      if (round > 0) samples[which].push((results.length * count) / ((end - start) / 1000))
    }
  }
  const { single, pair } = samples
  const totals = await checkTotals(surface, workers, topicNames, 'g', [0, 1])
  await stopWorkers(workers)
  await stopWorkers(loners)
  await surface.close()
  for (const own of privates) await own.close()
  return {
    messagesPerRun: n,
    warmUpRunsMs: warmUp,
    oneThreadMessagesPerSecond: median(single),
    twoThreadsMessagesPerSecond: median(pair),
    scaling: median(pair) / median(single),
    control: {
      loopsPerRun: controlN,
      oneThreadLoopsPerSecond: median(samples.controlSingle),
      twoThreadsLoopsPerSecond: median(samples.controlPair),
      scaling: median(samples.controlPair) / median(samples.controlSingle),
    },
    ownSurfaces: {
      oneThreadMessagesPerSecond: median(samples.ownSingle),
      twoThreadsMessagesPerSecond: median(samples.ownPair),
      scaling: median(samples.ownPair) / median(samples.ownSingle),
      oneThreadSamples: samples.ownSingle,
      twoThreadsSamples: samples.ownPair,
    },
    oneThreadSamples: single,
    twoThreadsSamples: pair,
    exactTotals: totals,
  }
}

/** Calls `once()` (→ ms) until three calls in a row are within 5% of each other (at most 15); returns the times. */
async function settle(once) {
  const times = []
  while (times.length < 15) {
    times.push(await once())
    const last = times.slice(-3)
    if (last.length === 3 && Math.max(...last) <= 1.05 * Math.min(...last)) break
  }
  return times
}

async function startWorkers(shared, topicNames, group, partitions) {
  const workers = partitions.map((partition, index) => new Worker(__filename, { workerData: { shared, index, topicNames, group, partition } }))
  await Promise.all(workers.map((worker) => new Promise((resolve, reject) => {
    worker.once('error', reject)
    worker.once('message', (m) => {
      worker.tid = m.tid
      m.ready ? resolve() : reject(new Error('bench worker did not start'))
    })
  })))
  for (const worker of workers) worker.on('error', (error) => { console.error('bench worker failed:', error); process.exit(1) })
  return workers
}

function request(worker, message, accept) {
  return new Promise((resolve) => {
    const onMessage = (m) => {
      if (!accept(m)) return
      worker.off('message', onMessage)
      resolve(m)
    }
    worker.on('message', onMessage)
    worker.postMessage(message)
  })
}

async function stopWorkers(workers) {
  await Promise.all(workers.map((worker) => new Promise((resolve) => {
    worker.once('exit', resolve)
    worker.postMessage({ cmd: 'exit' })
  })))
}

/** Every message a worker recorded is in the main thread's snapshot, exactly. */
async function checkTotals(surface, workers, topicNames, group, partitions, base = new Map()) {
  const states = await Promise.all(workers.map((w) => request(w, { cmd: 'state' }, (m) => m.seqs !== undefined)))
  const snapshot = surface.snapshot()
  const problems = []
  topicNames.forEach((name, k) => {
    const topic = snapshot.topics.find((t) => t.name === name)
    const g = topic.groups.find((x) => x.name === group)
    const start = base.get(name) ?? { produced: 0, bytes: 0, delivered: 0, inFlight: 0, seqs: partitions.map(() => 0) }
    let produced = start.produced
    let deliveredTotal = start.delivered
    let inFlight = start.inFlight
    states.forEach((state, w) => {
      produced += state.seqs[k] - start.seqs[w]
      deliveredTotal += state.delivered[k]
      inFlight += state.dispatched[k] - state.delivered[k]
      const partition = topic.partitions.find((p) => p.partition === partitions[w])
      if (partition.lastSeq !== state.seqs[k]) problems.push(`${name} partition ${partitions[w]}: last_seq ${partition.lastSeq} ≠ ${state.seqs[k]}`)
    })
    const bytes = start.bytes + (produced - start.produced) * 100
    if (topic.produced !== produced) problems.push(`${name}: produced ${topic.produced} ≠ ${produced}`)
    if (topic.bytes !== bytes) problems.push(`${name}: bytes ${topic.bytes} ≠ ${bytes}`)
    if (g.delivered !== deliveredTotal) problems.push(`${name}: delivered ${g.delivered} ≠ ${deliveredTotal}`)
    if (g.inFlight !== inFlight) problems.push(`${name}: in_flight ${g.inFlight} ≠ ${inFlight}`)
  })
  if (problems.length) throw new Error(`bench: totals differ after the worker run:\n  ${problems.join('\n  ')}`)
  const produced = topicNames.reduce((sum, name) => sum + snapshot.topics.find((t) => t.name === name).produced, 0)
  return { ok: true, messagesChecked: produced }
}

async function renderSection(lib, promClient, METRICS) {
  const sizes = options.quick ? [SIZES[0], TEN_K, BIG] : SIZES
  const states = []
  for (const topics of sizes) {
    log(`render: building ${topics} topics in both libraries`)
    // Unpaced (scrapeShare 1): these rows time the work of a scrape, back to back; the load
    // section below runs the default pacing.
    const surface = buildOurs(lib, topics, {}, { scrapeShare: 1 })
    const registry = buildPromClient(promClient, METRICS, topics)
    const ours = (await scrapeBuffer(surface)).toString('latin1')
    const theirs = await registry.metrics()
    states.push({ topics, surface, registry, oursSamples: countSamples(ours), promClientSamples: countSamples(theirs), oursBytes: Buffer.byteLength(ours), promClientBytes: Buffer.byteLength(theirs) })
  }
  const candidates = []
  for (const state of states) {
    candidates.push({
      operation: `render ${state.topics}`, library: 'ours',
      async run(n) {
        let bytes = 0
        for (let i = 0; i < n; i++) bytes += (await scrapeBuffer(state.surface)).length
        return bytes
      },
    })
    candidates.push({
      operation: `render ${state.topics}`, library: 'promClient',
      async run(n) {
        let bytes = 0
        for (let i = 0; i < n; i++) bytes += (await state.registry.metrics()).length
        return bytes
      },
    })
  }
  const big = states.find((s) => s.topics === BIG)
  // Where the time of the big render goes (ours): the read side alone — GET /healthz takes the
  // same snapshot and conservation check as /metrics, and renders only a small JSON — and the
  // string API.
  candidates.push({
    operation: `snapshot ${BIG}`, library: 'ours',
    async run(n) {
      let bytes = 0
      for (let i = 0; i < n; i++) bytes += (await handled(big.surface, '/healthz')).length
      return bytes
    },
  })
  candidates.push({
    operation: `render() string ${BIG}`, library: 'ours',
    run(n) {
      let length = 0
      for (let i = 0; i < n; i++) length += big.surface.render().length
      return length
    },
  })
  log('render: interleaved rounds')
  const timings = await rounds(candidates, ROUNDS)
  const summary = summarise(candidates, timings)

  log('render: event-loop blocking of one big render')
  const blockingOurs = []
  const blockingProm = []
  for (let i = 0; i < 5; i++) {
    blockingOurs.push(await blockingOf(() => scrapeBuffer(big.surface)))
    blockingProm.push(await blockingOf(() => big.registry.metrics()))
  }
  const scaling = states.map((state) => {
    const row = summary[`render ${state.topics}`]
    return {
      topics: state.topics,
      oursSamples: state.oursSamples,
      promClientSamples: state.promClientSamples,
      oursBytes: state.oursBytes,
      promClientBytes: state.promClientBytes,
      oursMs: row.oursNs / 1e6,
      promClientMs: row.promClientNs / 1e6,
      oursNsPerSample: row.oursNs / state.oursSamples,
      promClientNsPerSample: row.promClientNs / state.promClientSamples,
      oursSamplesMs: row.oursSamples.map((ns) => ns / 1e6),
      promClientSamplesMs: row.promClientSamples.map((ns) => ns / 1e6),
    }
  })
  return {
    states,
    scaling,
    snapshotMs: summary[`snapshot ${BIG}`].oursNs / 1e6,
    renderStringMs: summary[`render() string ${BIG}`].oursNs / 1e6,
    blocking: {
      oursMs: median(blockingOurs), oursMaxMs: Math.max(...blockingOurs), oursSamplesMs: blockingOurs,
      promClientMs: median(blockingProm), promClientMaxMs: Math.max(...blockingProm), promClientSamplesMs: blockingProm,
    },
  }
}

/** Longest gap between two setImmediate ticks while `fn` runs: how long it blocks the event loop. */
async function blockingOf(fn) {
  let last = performance.now()
  let worst = 0
  let running = true
  const tick = () => {
    const now = performance.now()
    if (now - last > worst) worst = now - last
    last = now
    if (running) setImmediate(tick)
  }
  setImmediate(tick)
  await sleep(2)
  worst = 0
  consume(await fn())
  await new Promise((resolve) => setImmediate(resolve))
  await new Promise((resolve) => setImmediate(resolve))
  running = false
  return worst
}

function memorySection() {
  const sizes = options.quick ? [BIG] : SIZES
  const rows = []
  for (const topics of sizes) {
    log(`memory: ${topics} topics, one child process per library`)
    rows.push({ topics, ours: runMemoryChild('ours', topics), promClient: runMemoryChild('prom-client', topics) })
  }
  return rows.map((row) => ({
    topics: row.topics,
    oursSamples: row.ours.samples,
    promClientSamples: row.promClient.samples,
    oursBytesPerSample: row.ours.scrapedBytes / row.ours.samples,
    promClientBytesPerSample: row.promClient.scrapedBytes / row.promClient.samples,
    oursBuiltBytesPerSample: row.ours.builtBytes / row.ours.samples,
    promClientBuiltBytesPerSample: row.promClient.builtBytes / row.promClient.samples,
    ours: row.ours,
    promClient: row.promClient,
  }))
}

/** CPU seconds this process's thread `tid` has run (the library's /proc reader), or undefined. */
function threadCpuSeconds(tid) {
  const progress = tid === undefined ? undefined : require(path.join(DIST, 'core', 'memory.js')).threadProgress(tid)
  return progress === undefined ? undefined : progress.cpuNs / 1e9
}

async function loadSection(surface) {
  const scrapes = options.quick ? 40 : 200
  const blocks = options.quick ? 4 : 10
  const perBlock = scrapes / blocks
  // Workers record on 8 of the big surface's topics, each on a partition of its own.
  const topicNames = Array.from({ length: 8 }, (_, k) => `topic-${k}`)
  const partitions = [PARTITIONS, PARTITIONS + 1]
  const shared = surface.share()
  const workers = await startWorkers(shared, topicNames, GROUPS[0], partitions)
  if (options.nice) os.setPriority(0, options.nice) // this thread only (Linux); the workers keep theirs
  // The workers' topics are left out (their totals are checked at the end).
  const bigTopics = surface.snapshot().topics.filter((t) => !topicNames.includes(t.name)).map((t) => surface.topic(t.name))
  const before = surface.snapshot()
  const base = new Map(topicNames.map((name) => {
    const t = before.topics.find((x) => x.name === name)
    const g = t.groups.find((x) => x.name === GROUPS[0])
    return [name, { produced: t.produced, bytes: t.bytes, delivered: g.delivered, inFlight: g.inFlight, seqs: partitions.map(() => 0) }]
  }))
  const progressBuffer = new SharedArrayBuffer(4 * (1 + workers.length))
  const progress = new Int32Array(progressBuffer)
  const finished = workers.map((w) => request(w, { cmd: 'flat', progress: progressBuffer }, (m) => m.chunks !== undefined))
  const listening = await surface.listen({ port: 0, host: '127.0.0.1' })
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
  const chunkSize = 1 << 16
  const recorded = () => {
    let chunks = 0
    for (let w = 0; w < workers.length; w++) chunks += Atomics.load(progress, 1 + w)
    return chunks * chunkSize
  }
  try {
    await sleep(500) // let the workers reach full speed
    // One checked scrape: gzip on the wire, the whole exposition inside.
    const check = await scrape(listening.port, agent, true)
    if (check.encoding !== 'gzip') throw new Error(`bench: /metrics answered without gzip (${check.encoding})`)
    const samples = countSamples(zlib.gunzipSync(check.body).toString('latin1'))
    // Reference: the same scrapes with the workers paused (what the CPU contention adds).
    Atomics.store(progress, 0, 2)
    await sleep(50)
    const unloaded = []
    for (let i = 0; i < 20; i++) unloaded.push((await scrape(listening.port, agent, false)).ms)
    Atomics.store(progress, 0, 0)
    await sleep(200)

    const latencies = []
    const quiet = { messages: 0, ms: 0, rates: [] }
    const busy = { messages: 0, ms: 0, rates: [] }
    let windowMs = 1000
    // CPU seconds so far: the main thread's, and the other threads' but the two workers' (V8's
    // helpers — the parallel scavenger, concurrent marking — and libuv's pool, where zlib runs).
    const cpu = () => {
      const main = threadCpuSeconds(process.pid)
      const ours = workers.map((w) => threadCpuSeconds(w.tid))
      if (main === undefined || ours.includes(undefined)) return undefined
      const usage = process.cpuUsage()
      return { main, other: (usage.user + usage.system) / 1e6 - main - ours[0] - ours[1] }
    }
    const measure = async (into, body) => {
      const m0 = recorded()
      const c0 = cpu()
      const t0 = performance.now()
      await body()
      const ms = performance.now() - t0
      const messages = recorded() - m0
      const c1 = cpu()
      into.messages += messages
      into.ms += ms
      if (c0 && c1) {
        into.mainCpuSeconds = (into.mainCpuSeconds ?? 0) + (c1.main - c0.main)
        into.otherCpuSeconds = (into.otherCpuSeconds ?? 0) + (c1.other - c0.other)
      }
      into.rates.push(messages / (ms / 1000))
      return ms
    }
    for (let b = 0; b < blocks; b++) {
      const order = b % 2 ? ['scrapes', 'quiet'] : ['quiet', 'scrapes']
      for (const which of order) {
        if (which === 'quiet') {
          await measure(quiet, () => sleep(windowMs))
        } else {
          windowMs = await measure(busy, async () => {
            for (let i = 0; i < perBlock; i++) latencies.push((await scrape(listening.port, agent, false)).ms)
          })
        }
      }
      log(`load: block ${b + 1}/${blocks}, p50 so far ${median(latencies).toFixed(1)} ms`)
    }
    // Control: the same back-to-back loop of requests, against a path that does no work at all
    // (the standalone server's 404). What this loses is the cost of a busy third thread on two
    // cores, whatever the requests do.
    const control = { messages: 0, ms: 0, rates: [] }
    const controlQuiet = { messages: 0, ms: 0, rates: [] }
    let controlRequests = 0
    for (let b = 0; b < (options.quick ? 2 : 4); b++) {
      await measure(controlQuiet, () => sleep(windowMs))
      await measure(control, async () => {
        for (const end = performance.now() + windowMs; performance.now() < end; controlRequests++) {
          await scrape(listening.port, agent, false, '/no-such-path', 404)
        }
      })
    }
    // Scrapes at an interval: every 250 ms (Prometheus's default interval is 15 s), 4 s windows.
    const spaced = { messages: 0, ms: 0, rates: [] }
    const spacedQuiet = { messages: 0, ms: 0, rates: [] }
    const spacedLatencies = []
    for (let b = 0; b < (options.quick ? 1 : 3); b++) {
      await measure(spacedQuiet, () => sleep(4000))
      await measure(spaced, async () => {
        const start = performance.now()
        for (let k = 0; k < 16; k++) {
          const due = start + k * 250
          if (performance.now() < due) await sleep(due - performance.now())
          spacedLatencies.push((await scrape(listening.port, agent, false)).ms)
        }
        await sleep(Math.max(0, start + 4000 - performance.now()))
      })
    }
    // Every topic changed since the previous scrape (no chunk reusable), workers paused.
    Atomics.store(progress, 0, 2)
    await sleep(50)
    const allChanged = []
    for (let i = 0; i < (options.quick ? 3 : 10); i++) {
      for (const topic of bigTopics) topic.produced(PARTITIONS - 1, 1_000_000 + i, 1) // above every seqOf()
      allChanged.push((await scrape(listening.port, agent, false)).ms)
    }
    Atomics.store(progress, 0, 1)
    await Promise.all(finished)
    const totals = await checkTotals(surface, workers, topicNames, GROUPS[0], partitions, base)
    const rate = (window) => window.messages / (window.ms / 1000)
    /** Cores the main thread and the other threads used during those windows (0.5: half of one). */
    const cores = (window) => (window.mainCpuSeconds === undefined ? undefined : { main: window.mainCpuSeconds / (window.ms / 1000), other: window.otherCpuSeconds / (window.ms / 1000) })
    const quietRate = rate(quiet)
    const busyRate = rate(busy)
    return {
      scrapes: latencies.length,
      samples,
      gzipBytes: check.body.length,
      unloadedP50Ms: percentile(unloaded, 50),
      unloadedMaxMs: Math.max(...unloaded),
      unloadedLatenciesMs: unloaded,
      p50Ms: percentile(latencies, 50),
      p99Ms: percentile(latencies, 99),
      maxMs: Math.max(...latencies),
      quietMessagesPerSecond: quietRate,
      scrapingMessagesPerSecond: busyRate,
      throughputDrop: 1 - busyRate / quietRate,
      mainThreadNice: options.nice,
      surfaceOptions: { ...surface.options },
      coresBesideWorkers: cores(busy),
      quietCoresBesideWorkers: cores(quiet),
      control: {
        requests: controlRequests,
        quietMessagesPerSecond: rate(controlQuiet),
        busyMessagesPerSecond: rate(control),
        throughputDrop: 1 - rate(control) / rate(controlQuiet),
        coresBesideWorkers: cores(control),
      },
      spaced: {
        intervalMs: 250,
        scrapes: spacedLatencies.length,
        p50Ms: percentile(spacedLatencies, 50),
        p99Ms: percentile(spacedLatencies, 99),
        quietMessagesPerSecond: rate(spacedQuiet),
        scrapingMessagesPerSecond: rate(spaced),
        throughputDrop: 1 - rate(spaced) / rate(spacedQuiet),
        coresBesideWorkers: cores(spaced),
      },
      allTopicsChangedP50Ms: percentile(allChanged, 50),
      allTopicsChangedLatenciesMs: allChanged,
      quietRates: quiet.rates,
      scrapingRates: busy.rates,
      latenciesMs: latencies,
      exactTotals: totals,
    }
  } finally {
    Atomics.store(progress, 0, 1)
    agent.destroy()
    await listening.close()
    await stopWorkers(workers)
  }
}

function scrape(port, agent, keepBody, path = '/metrics', status = 200) {
  return new Promise((resolve, reject) => {
    const t0 = performance.now()
    const req = http.get({ host: '127.0.0.1', port, path, agent, headers: { 'Accept-Encoding': 'gzip' }, timeout: 10_000 }, (res) => {
      const chunks = []
      let bytes = 0
      res.on('data', (chunk) => {
        bytes += chunk.length
        if (keepBody) chunks.push(chunk)
      })
      res.on('end', () => {
        if (res.statusCode !== status) reject(new Error(`bench: ${path} answered ${res.statusCode}`))
        else resolve({ ms: performance.now() - t0, bytes, encoding: res.headers['content-encoding'], body: keepBody ? Buffer.concat(chunks) : undefined })
      })
      res.on('error', reject)
    })
    req.on('timeout', () => req.destroy(new Error('bench: a scrape took longer than 10 s')))
    req.on('error', reject)
  })
}

// ------------------------------------------------------------------------------------------------
// Report.

function machine() {
  const cpus = os.cpus()
  let commit = null
  try {
    commit = execFileSync('git', ['rev-parse', 'HEAD'], { cwd: path.join(__dirname, '..'), encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim()
  } catch {
    // not a git checkout
  }
  return {
    cpu: cpus[0]?.model ?? 'unknown',
    cores: cpus.length,
    memoryGiB: Math.round((os.totalmem() / 2 ** 30) * 10) / 10,
    platform: `${os.platform()} ${os.release()} ${os.arch()}`,
    node: process.version,
    v8: process.versions.v8,
    promClient: require('prom-client/package.json').version,
    hdrHistogramJs: require('hdr-histogram-js/package.json').version,
    loadAverageAtStart: os.loadavg().map((x) => Math.round(x * 100) / 100),
    date: new Date().toISOString(),
    commit,
  }
}

const formatNs = (ns) => (ns === undefined ? '—' : ns >= 1e6 ? `${(ns / 1e6).toFixed(1)} ms` : ns >= 1000 ? `${(ns / 1000).toFixed(2)} µs` : `${ns.toFixed(1)} ns`)
/** "; cores used beside the workers: main thread 0.62, V8's and libuv's threads 0.04", or nothing without /proc. */
const formatCores = (cores, nice = 0) => (cores === undefined ? '' : `; cores used beside the workers: main thread ${cores.main.toFixed(2)}${nice ? ` at nice ${nice}` : ''}, V8's and libuv's threads ${cores.other.toFixed(2)}`)

/** A relative change in whole percent with its sign: −36%, +1%, 0%. */
const formatChange = (change) => {
  const percent = Math.round(change * 100)
  return percent === 0 ? '0%' : `${percent < 0 ? '−' : '+'}${Math.abs(percent)}%`
}
const formatMs = (ms) => (ms === undefined ? '—' : `${ms >= 100 ? ms.toFixed(0) : ms.toFixed(1)} ms`)
const formatRatio = (r) => (r === undefined || !Number.isFinite(r) ? '—' : r >= 10 ? `${r.toFixed(0)}×` : `${r.toFixed(1)}×`)
const formatRate = (r) => `${(r / 1e6).toFixed(1)} M msg/s`
const pass = (ok) => (ok ? 'pass' : '**MISS**')

async function main() {
  const started = performance.now()
  const lib = require(path.join(DIST, 'index.js'))
  const promClient = require('prom-client')
  const { METRICS } = require(path.join(DIST, 'exposition', 'allowlist.js'))
  const probe = lib.createSurface()
  const results = { machine: machine(), command: `node bench/run.js${options.quick ? ' --quick' : ''}${options.nice ? ` --nice ${options.nice}` : ''}`, rounds: ROUNDS, sampleMs: SAMPLE_MS, backend: probe.backend }
  await probe.close()
  const table = []
  const only = options.only

  if (only.has('hot')) {
    log('hot path: delivered, produced, dispatch')
    const hot = await hotPath(lib, promClient)
    results.hotPath = hot
    const d = hot.delivered
    const p = hot.produced
    const x = hot.dispatch
    table.push(['one counter increment on a resolved handle: `group.delivered()` vs child `inc()`', formatNs(d.promClientNs), formatNs(d.oursNs), formatRatio(d.ratio), '≤ 5 ns, ≥ 20×', pass(d.oursNs <= 5 && d.ratio >= 20)])
    table.push(['a publish: `topic.produced(p, seq, bytes)` vs `inc()` + `inc(bytes)` + 2-label gauge `set()`', formatNs(p.promClientNs), formatNs(p.oursNs), formatRatio(p.ratio), '≤ 15 ns, ≥ 30×', pass(p.oursNs <= 15 && p.ratio >= 30)])
    table.push(['`group.dispatch()` (in_flight bound checked across threads) vs gauge child `inc()`', formatNs(x.promClientNs), formatNs(x.oursNs), formatRatio(x.ratio), '—', 'info'])
  }

  if (only.has('latency')) {
    log('latency estimator (bench/latency.js)')
    const latencyRows = await require('./latency.js').run()
    results.latency = latencyRows
    for (const row of latencyRows) {
      const isRecord = row.operation === 'record'
      const target = isRecord ? '≤ 5 ns, ≥ 200×' : '≤ 5 µs'
      const ok = isRecord ? row.oursNs <= 5 && row.ratio >= 200 : row.oursNs <= 5000
      const name = isRecord ? 'latency `record(ms)` vs Summary `observe()`' : `latency ${row.operation} vs Summary read-out`
      table.push([`${name} (hdr-histogram-js: ${formatNs(row.otherNs)})`, formatNs(row.promClientNs), formatNs(row.oursNs), formatRatio(row.ratio), target, pass(ok)])
    }
  }

  if (only.has('workers')) {
    log('2 worker threads vs 1')
    const workers = await workersSection(lib)
    results.workers = workers
    table.push([`2 worker threads recording on 8 shared topics (\`produced\` + \`delivered\` per message; 1 thread: ${formatRate(workers.oneThreadMessagesPerSecond)}; exact totals ✓)`, '—', formatRate(workers.twoThreadsMessagesPerSecond), `${workers.scaling.toFixed(2)}× one thread`, '≥ 1.7× one thread, exact totals', pass(workers.scaling >= 1.7 && workers.exactTotals.ok)])
    table.push([`control: the same 2 threads, same rounds, running a loop with no mq-metrics in it (4 adds per message into a private array; 1 thread: ${formatRate(workers.control.oneThreadLoopsPerSecond)})`, '—', formatRate(workers.control.twoThreadsLoopsPerSecond), `${workers.control.scaling.toFixed(2)}× one thread`, '—', 'info'])
    table.push([`control: the same recording loop, same rounds, in 2 threads that each record into a surface of their own (nothing shared; 1 thread: ${formatRate(workers.ownSurfaces.oneThreadMessagesPerSecond)})`, '—', formatRate(workers.ownSurfaces.twoThreadsMessagesPerSecond), `${workers.ownSurfaces.scaling.toFixed(2)}× one thread`, '—', 'info'])
  }

  let render
  if (only.has('render') || only.has('load')) {
    render = await renderSection(lib, promClient, METRICS)
    results.render = { scaling: render.scaling, snapshotMs: render.snapshotMs, renderStringMs: render.renderStringMs, blocking: render.blocking }
    const big = render.scaling.find((s) => s.topics === BIG)
    const ten = render.scaling.find((s) => s.topics === TEN_K)
    table.push([`render ${big.oursSamples.toLocaleString('en-US')} samples (${BIG.toLocaleString('en-US')} topics × 16 partitions × 2 groups), the /metrics Buffer`, formatMs(big.promClientMs), formatMs(big.oursMs), formatRatio(big.promClientMs / big.oursMs), '≤ 25 ms, ≥ 15×', pass(big.oursMs <= 25 && big.promClientMs / big.oursMs >= 15)])
    table.push([`render ${ten.oursSamples.toLocaleString('en-US')} samples (${TEN_K} topics)`, formatMs(ten.promClientMs), formatMs(ten.oursMs), formatRatio(ten.promClientMs / ten.oursMs), '≤ 2 ms', pass(ten.oursMs <= 2)])
    table.push([`event-loop blocking of one ${big.oursSamples.toLocaleString('en-US')}-sample render (max of 5: ours ${formatMs(render.blocking.oursMaxMs)})`, formatMs(render.blocking.promClientMs), formatMs(render.blocking.oursMs), formatRatio(render.blocking.promClientMs / render.blocking.oursMs), '≤ ~25 ms', pass(render.blocking.oursMs <= 25)])
  }

  if (only.has('memory')) {
    const memory = memorySection()
    results.memory = memory
    const big = memory.find((m) => m.topics === BIG)
    table.push([`memory per sample at ${big.oursSamples.toLocaleString('en-US')} samples (heap + external + arena, after two gzip scrapes)`, `${big.promClientBytesPerSample.toFixed(0)} B`, `${big.oursBytesPerSample.toFixed(0)} B`, formatRatio(big.promClientBytesPerSample / big.oursBytesPerSample), '≤ 120 B', pass(big.oursBytesPerSample <= 120)])
  }

  if (only.has('load')) {
    log(`/metrics under load: ${options.quick ? 40 : 200} gzip scrapes while 2 workers record`)
    // The render section's surfaces go (they are unpaced, and would only make this process's GC
    // slower); the load section scrapes a surface of the same size with the default options.
    for (const state of render?.states ?? []) {
      state.registry = null
      await state.surface.close()
    }
    const surface = buildOurs(lib, BIG)
    await scrapeGzip(surface) // the gzip chunk cache's first fill, as after the render section's scrapes
    const load = await loadSection(surface)
    await surface.close()
    results.load = load
    table.push([`\`/metrics\` at ${load.samples.toLocaleString('en-US')} samples, gzip (${(load.gzipBytes / 1e6).toFixed(1)} MB), 2 workers recording flat out, default pacing (scrapeShare ${load.surfaceOptions.scrapeShare}, scrapeBurstMs ${load.surfaceOptions.scrapeBurstMs}): p99 of ${load.scrapes} scrapes (p50 ${formatMs(load.p50Ms)}; workers paused: p50 ${formatMs(load.unloadedP50Ms)}, max ${formatMs(load.unloadedMaxMs)})`, '—', formatMs(load.p99Ms), '—', '≤ 100 ms', pass(load.p99Ms <= 100)])
    table.push([`recording throughput during those scrapes vs quiet windows (${formatRate(load.scrapingMessagesPerSecond)} vs ${formatRate(load.quietMessagesPerSecond)}${formatCores(load.coresBesideWorkers, load.mainThreadNice)})`, '—', formatChange(-load.throughputDrop), '—', '< 20% drop', pass(load.throughputDrop < 0.2)])
    table.push([`control: the same back-to-back loop against a 404 path that does no work (${load.control.requests.toLocaleString('en-US')} requests; ${formatRate(load.control.busyMessagesPerSecond)} vs ${formatRate(load.control.quietMessagesPerSecond)}${formatCores(load.control.coresBesideWorkers)})`, '—', formatChange(-load.control.throughputDrop), '—', '—', 'info'])
    table.push([`scrapes every ${load.spaced.intervalMs} ms instead (${load.spaced.scrapes}; p50 ${formatMs(load.spaced.p50Ms)}, p99 ${formatMs(load.spaced.p99Ms)}): throughput vs quiet windows (${formatRate(load.spaced.scrapingMessagesPerSecond)} vs ${formatRate(load.spaced.quietMessagesPerSecond)}${formatCores(load.spaced.coresBesideWorkers)})`, '—', formatChange(-load.spaced.throughputDrop), '—', '—', 'info'])
    table.push([`gzip scrape at ${load.samples.toLocaleString('en-US')} samples with every topic changed since the last one (no chunk reusable), workers paused: p50`, '—', formatMs(load.allTopicsChangedP50Ms), '—', '—', 'info'])
  }

  if (render) for (const state of render.states) await state.surface.close() // idempotent
  checkSink()
  results.machine.loadAverageAtEnd = os.loadavg().map((x) => Math.round(x * 100) / 100)
  results.durationSeconds = Math.round((performance.now() - started) / 100) / 10
  results.table = table.map(([operation, promClientMedian, ours, ratio, target, verdict]) => ({ operation, promClientMedian, ours, ratio, target, verdict }))

  const m = results.machine
  const lines = []
  lines.push(`mq-metrics ${require('../package.json').version} (${results.backend} backend) vs prom-client ${m.promClient}: ${m.cpu}, ${m.cores} cores, ${m.platform}, Node ${m.node}; ${m.date.slice(0, 10)}; load average ${m.loadAverageAtStart.join(' ')} → ${m.loadAverageAtEnd.join(' ')}`)
  lines.push(`median of ${ROUNDS} interleaved rounds of ≥ ${SAMPLE_MS} ms each; reproduce: npm run bench${options.quick ? ' -- --quick' : ''}`)
  if (options.nice) lines.push(`EXPERIMENT: the main thread ran the load section at nice ${options.nice} (--nice); not the library's default`)
  lines.push('')
  lines.push('| operation | prom-client (median) | ours (median) | ratio | target | |')
  lines.push('|---|---:|---:|---:|---|---|')
  for (const row of table) lines.push(`| ${row.join(' | ')} |`)
  if (render) {
    lines.push('')
    lines.push('Scaling with the number of series (render = the /metrics Buffer; memory = heap + external + arena per sample):')
    lines.push('')
    lines.push('| topics | samples | ours render | ns/sample | prom-client render | ns/sample | ratio | ours B/sample | prom-client B/sample |')
    lines.push('|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
    for (const s of render.scaling) {
      const mem = results.memory?.find((x) => x.topics === s.topics)
      lines.push(`| ${s.topics.toLocaleString('en-US')} | ${s.oursSamples.toLocaleString('en-US')} | ${formatMs(s.oursMs)} | ${s.oursNsPerSample.toFixed(0)} | ${formatMs(s.promClientMs)} | ${s.promClientNsPerSample.toFixed(0)} | ${formatRatio(s.promClientMs / s.oursMs)} | ${mem ? mem.oursBytesPerSample.toFixed(0) : '—'} | ${mem ? mem.promClientBytesPerSample.toFixed(0) : '—'} |`)
    }
    lines.push('')
    lines.push(`Of the ${formatMs(render.scaling.find((s) => s.topics === BIG).oursMs)} big render: the snapshot alone (read side + conservation check, as GET /healthz) ${formatMs(render.snapshotMs)}; surface.render() as a string ${formatMs(render.renderStringMs)}.`)
  }
  console.log(lines.join('\n'))

  fs.mkdirSync(path.dirname(options.json), { recursive: true })
  fs.writeFileSync(options.json, JSON.stringify(results, null, 2) + '\n')
  log(`done in ${results.durationSeconds} s; full numbers in ${path.relative(process.cwd(), options.json)}`)
  // Timers of the surfaces and the workers are gone; exit explicitly in case a socket lingers.
  process.exit(process.exitCode ?? 0)
}

// ------------------------------------------------------------------------------------------------

if (!isMainThread) {
  workerMain()
} else if (process.argv[2] === '--memory-child') {
  memoryChild(process.argv[3], Number(process.argv[4])).catch((error) => {
    console.error(error)
    process.exit(1)
  })
} else {
  main().catch((error) => {
    console.error(error)
    process.exitCode = 1
  })
}
