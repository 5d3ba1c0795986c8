'use strict'
// /metrics under load: a 187k-sample surface (the realistic workload) with the default options,
// served on 127.0.0.1 (port 0), 2 workers recording flat out on 8 of its topics; blocks of
// sequential gzip scrapes (one in flight, 10 s timeout each) alternate with quiet windows of the
// same length. Reported: the scrapes' p50/p99 latency; the main thread's event-loop delay
// (monitorEventLoopDelay) in scrape windows, what a broker's own connections wait; and the
// workers' throughput inside scrape windows against inside quiet windows. Then, as information:
// the same back-to-back loop against a 404 path that does no work (the control: what any busy
// third thread costs two saturated cores), scrapes paced every 250 ms, and the gzip scrape with
// every topic changed since the previous one (the chunk cache's worst case; workers paused).
// Every window also reads CPU times (/proc/self/task/TID/schedstat, Linux): how much of a core the
// main thread took from the workers, and how much the process's other threads did.
// `--nice N` (Linux) lowers the main thread's scheduler weight once the workers run (setpriority
// on a thread changes that thread only): an experiment, not for the docs' table.
// `--scrape-share S` and `--main-thread` set createSurface()'s scrapeShare and scrapeThread: false.
// Reproduce: node bench/load.js [--quick] [--nice N] [--scrape-share S] [--main-thread]
const os = require('node:os')
const http = require('node:http')
const zlib = require('node:zlib')
const { performance, monitorEventLoopDelay } = require('node:perf_hooks')
const { median, percentile } = require('./sampling')
const { formatChange, formatCores, formatCount, formatMs, formatRate, log, pass, row, sleep, standalone } = require('./harness')
const { BIG, GROUPS, PARTITIONS, buildOurs, countSamples, scrapeGzip, threadCpuSeconds, topicName } = require('./workload')
const { startWorkers, request, stopWorkers, checkTotals } = require('./threads')

async function run({ lib, options }) {
  // --scrape-share S and --main-thread: the pacing trade (docs/scrape-thread.md), not for the table.
  const surface = buildOurs(lib, BIG, {}, options.surface)
  await scrapeGzip(surface) // the gzip chunk cache's first fill
  try {
    const results = await measureLoad(surface, options)
    return { results, rows: rowsOf(results) }
  } finally {
    await surface.close()
  }
}

/** The windows' event-loop delays: the median window's p50, the worst window's p99, the max. */
function delayOf(windows) {
  return {
    p50Ms: median(windows.map((w) => w.p50Ms)),
    p99Ms: Math.max(...windows.map((w) => w.p99Ms)),
    maxMs: Math.max(...windows.map((w) => w.maxMs)),
    windows,
  }
}

function rowsOf(load) {
  return [
    row(`\`/metrics\` at ${formatCount(load.samples)} samples, gzip (${(load.gzipBytes / 1e6).toFixed(1)} MB), 2 workers recording flat out, ${load.surfaceOptions.scrapeThread ? 'rendered in the scrape thread' : 'rendered on the main thread'} (scrapeShare ${load.surfaceOptions.scrapeShare}, scrapeBurstMs ${load.surfaceOptions.scrapeBurstMs}): p99 of ${load.scrapes} back-to-back scrapes (p50 ${formatMs(load.p50Ms)}; workers paused: p50 ${formatMs(load.unloadedP50Ms)}, max ${formatMs(load.unloadedMaxMs)})`, '—', formatMs(load.p99Ms), '—', '≤ 50 ms', pass(load.p99Ms <= 50)),
    row(`the broker's main-thread event-loop delay during those scrapes (monitorEventLoopDelay, worst window's p99 and max; quiet windows: p99 ${formatMs(load.quietLoopDelay.p99Ms)}, max ${formatMs(load.quietLoopDelay.maxMs)})`, '—', `p99 ${formatMs(load.loopDelay.p99Ms)}, max ${formatMs(load.loopDelay.maxMs)}`, '—', 'p99 ≤ 2 ms, max ≤ 5 ms', pass(load.loopDelay.p99Ms <= 2 && load.loopDelay.maxMs <= 5)),
    row(`recording throughput during those scrapes vs quiet windows (${formatRate(load.scrapingMessagesPerSecond)} vs ${formatRate(load.quietMessagesPerSecond)}${formatCores(load.coresBesideWorkers, load.mainThreadNice)})`, '—', formatChange(-load.throughputDrop), '—', '≤ 10% drop', pass(load.throughputDrop <= 0.1)),
    row(`control: the same back-to-back loop against a 404 path that does no work (${formatCount(load.control.requests)} requests; ${formatRate(load.control.busyMessagesPerSecond)} vs ${formatRate(load.control.quietMessagesPerSecond)}${formatCores(load.control.coresBesideWorkers)})`, '—', formatChange(-load.control.throughputDrop), '—', '—', 'info'),
    row(`scrapes every ${load.spaced.intervalMs} ms instead (${load.spaced.scrapes}; p50 ${formatMs(load.spaced.p50Ms)}, p99 ${formatMs(load.spaced.p99Ms)}): throughput vs quiet windows (${formatRate(load.spaced.scrapingMessagesPerSecond)} vs ${formatRate(load.spaced.quietMessagesPerSecond)}${formatCores(load.spaced.coresBesideWorkers)})`, '—', formatChange(-load.spaced.throughputDrop), '—', '—', 'info'),
    row(`gzip scrape at ${formatCount(load.samples)} samples with every topic changed since the last one (no chunk reusable), workers paused: p50`, '—', formatMs(load.allTopicsChangedP50Ms), '—', '—', 'info'),
  ]
}

async function measureLoad(surface, options) {
  const scrapes = options.quick ? 40 : 200
  const blocks = options.quick ? 4 : 10
  const perBlock = scrapes / blocks
  // Workers record on 8 of the big surface's topics, each on a partition of its own.
  const topicNames = Array.from({ length: 8 }, (_, k) => topicName(k))
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
    // The main thread's event-loop delay (monitorEventLoopDelay, 1 ms resolution) in scrape
    // windows and in quiet ones: a fresh monitor per window (one disabled and enabled again
    // records the whole pause between two windows as one delay); per window its p50, p99, max.
    const busyDelay = []
    const quietDelay = []
    const measure = async (into, body, delay) => {
      const m0 = recorded()
      const c0 = cpu()
      const t0 = performance.now()
      const monitor = delay && monitorEventLoopDelay({ resolution: 1 })
      monitor?.enable()
      await body()
      monitor?.disable()
      if (monitor) delay.push({ p50Ms: monitor.percentile(50) / 1e6, p99Ms: monitor.percentile(99) / 1e6, maxMs: monitor.max / 1e6 })
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
          await measure(quiet, () => sleep(windowMs), quietDelay)
        } else {
          windowMs = await measure(busy, async () => {
            for (let i = 0; i < perBlock; i++) latencies.push((await scrape(listening.port, agent, false)).ms)
          }, busyDelay)
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
      for (const topic of bigTopics) topic.produced(PARTITIONS - 1, topic.lastSeqKnown(PARTITIONS - 1) + 1, 1)
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
      loopDelay: delayOf(busyDelay),
      quietLoopDelay: delayOf(quietDelay),
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

module.exports = { run }
standalone(module, 'load', run)
