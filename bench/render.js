'use strict'
// Render: GET /metrics on the realistic workload (bench/workload.js: dotted ~20-character topic
// names, counters from thousands to millions, one topic changed before every scrape), at ~1k, ~10k,
// ~100k, 187k and 1M samples, against prom-client's `await registry.metrics()` holding the same
// values and given the same change. Ours is timed twice: the Buffer the HTTP server sends
// (`surface.handler()` on GET /metrics, without gzip: snapshot + conservation check + render, in
// slices when large) and the string API `surface.render()`. Scrape pacing is off (`scrapeShare: 1`)
// so the rows time the work, not the pacing's pauses; the load section runs the default options.
// Also: the snapshot alone (GET /healthz takes the same snapshot and conservation check and renders
// a small JSON), and the longest event-loop gap around one 187k-sample scrape.
// Reproduce: node bench/render.js [--quick]
const { rounds, consume, median } = require('./sampling')
const { formatCount, formatMs, formatRatio, log, pass, row, sleep, standalone, summarise } = require('./harness')
const { SIZES, BIG, TEN_K, MILLION, buildOurs, buildPromClient, changer, countSamples, handled, scrapeBuffer } = require('./workload')
const { performance } = require('node:perf_hooks')

async function run({ lib, promClient, METRICS, options, rounds: count }) {
  const sizes = options.quick ? [SIZES[0], TEN_K, BIG] : SIZES
  const states = []
  for (const topics of sizes) {
    log(`render: building ${formatCount(topics)} topics in both libraries`)
    // maxScrapeBytes raised: the 1M-sample body is ~70 MB, over the default bound of 64 MiB on the
    // bodies in flight (a plain scrape at that size needs it raised too; docs/http.md).
    const surface = buildOurs(lib, topics, {}, { scrapeShare: 1, maxScrapeBytes: 512 * 2 ** 20 })
    const registry = buildPromClient(promClient, METRICS, topics)
    const change = changer(surface, registry, topics)
    const ours = (await scrapeBuffer(surface)).toString('latin1')
    const theirs = await registry.metrics()
    states.push({ topics, surface, registry, change, oursSamples: countSamples(ours), promClientSamples: countSamples(theirs), oursBytes: Buffer.byteLength(ours), promClientBytes: Buffer.byteLength(theirs) })
  }
  const candidates = []
  for (const state of states) {
    candidates.push({
      operation: `render ${state.topics}`, library: 'ours',
      async run(n) {
        let bytes = 0
        for (let i = 0; i < n; i++) {
          state.change.ours()
          const body = await scrapeBuffer(state.surface)
          if (body.length < 0.95 * state.oursBytes) throw new Error(`bench: a ${state.topics}-topic scrape answered ${body.length} bytes, not the whole exposition: ${body.toString('latin1', 0, 200)}`)
          bytes += body.length
        }
        return bytes
      },
    })
    candidates.push({
      operation: `render ${state.topics}`, library: 'promClient',
      async run(n) {
        let bytes = 0
        for (let i = 0; i < n; i++) {
          state.change.promClient()
          bytes += (await state.registry.metrics()).length
        }
        return bytes
      },
    })
  }
  const big = states.find((s) => s.topics === BIG)
  candidates.push({
    operation: `render() string ${BIG}`, library: 'ours',
    run(n) {
      let length = 0
      for (let i = 0; i < n; i++) {
        big.change.ours()
        length += big.surface.render().length
      }
      return length
    },
  })
  candidates.push({
    operation: `snapshot ${BIG}`, library: 'ours',
    async run(n) {
      let bytes = 0
      for (let i = 0; i < n; i++) {
        big.change.ours()
        bytes += (await handled(big.surface, '/healthz')).length
      }
      return bytes
    },
  })
  log('render: interleaved rounds')
  const timings = await rounds(candidates, count)
  const summary = summarise(candidates, timings)

  log('render: event-loop blocking of one big scrape')
  const blockingOurs = []
  const blockingProm = []
  for (let i = 0; i < 5; i++) {
    blockingOurs.push(await blockingOf(() => scrapeBuffer(big.surface)))
    blockingProm.push(await blockingOf(() => big.registry.metrics()))
  }
  for (const state of states) await state.surface.close()

  const scaling = states.map((state) => {
    const r = summary[`render ${state.topics}`]
    return {
      topics: state.topics,
      oursSamples: state.oursSamples,
      promClientSamples: state.promClientSamples,
      oursBytes: state.oursBytes,
      promClientBytes: state.promClientBytes,
      oursMs: r.oursNs / 1e6,
      promClientMs: r.promClientNs / 1e6,
      oursNsPerSample: r.oursNs / state.oursSamples,
      promClientNsPerSample: r.promClientNs / state.promClientSamples,
      oursSamplesMs: r.oursSamples.map((ns) => ns / 1e6),
      promClientSamplesMs: r.promClientSamples.map((ns) => ns / 1e6),
    }
  })
  const results = {
    scaling,
    renderStringMs: summary[`render() string ${BIG}`].oursNs / 1e6,
    snapshotMs: summary[`snapshot ${BIG}`].oursNs / 1e6,
    blocking: {
      oursMs: median(blockingOurs), oursMaxMs: Math.max(...blockingOurs), oursSamplesMs: blockingOurs,
      promClientMs: median(blockingProm), promClientMaxMs: Math.max(...blockingProm), promClientSamplesMs: blockingProm,
    },
  }
  const b = scaling.find((s) => s.topics === BIG)
  const ten = scaling.find((s) => s.topics === TEN_K)
  const million = scaling.find((s) => s.topics === MILLION)
  const rows = [
    row(`render ${formatCount(b.oursSamples)} samples (${formatCount(BIG)} topics × 16 partitions × 2 groups, realistic names and values, one topic changed before each), the /metrics Buffer`, formatMs(b.promClientMs), formatMs(b.oursMs), formatRatio(b.promClientMs / b.oursMs), '≥ 15×', pass(b.promClientMs / b.oursMs >= 15)),
    row(`the same, \`surface.render()\` as a string`, formatMs(b.promClientMs), formatMs(results.renderStringMs), formatRatio(b.promClientMs / results.renderStringMs), '≥ 15×', pass(b.promClientMs / results.renderStringMs >= 15)),
    row(`render ${formatCount(ten.oursSamples)} samples (${TEN_K} topics)`, formatMs(ten.promClientMs), formatMs(ten.oursMs), formatRatio(ten.promClientMs / ten.oursMs), '≤ 2 ms', pass(ten.oursMs <= 2)),
    row(`event-loop blocking of one ${formatCount(b.oursSamples)}-sample scrape rendered on the main thread (max of 5: ours ${formatMs(results.blocking.oursMaxMs)})`, formatMs(results.blocking.promClientMs), formatMs(results.blocking.oursMs), formatRatio(results.blocking.promClientMs / results.blocking.oursMs), '—', 'info'),
  ]
  if (million) {
    const flat = scaling.filter((s) => s.oursSamples >= 10_000).map((s) => s.oursNsPerSample)
    const spread = Math.max(...flat) / Math.min(...flat)
    rows.push(row(`ns per sample from ${formatCount(ten.oursSamples)} to ${formatCount(million.oursSamples)} samples (${flat.map((x) => x.toFixed(0)).join(', ')}): largest / smallest`, '—', `${spread.toFixed(2)}`, '—', '≤ 1.5 (flat)', pass(spread <= 1.5)))
  }
  return { results, rows, notes: scalingLines(scaling), scaling }
}

/** The scaling table (and, when the memory section ran, its bytes per sample). */
function scalingLines(scaling, memory = []) {
  const lines = ['Scaling with the number of series (render = the /metrics Buffer, one topic changed before each; memory = heap + external + arena per sample):', '']
  lines.push('| topics | samples | ours render | ns/sample | prom-client render | ns/sample | ratio | ours B/sample | prom-client B/sample |')
  lines.push('|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
  for (const s of scaling) {
    const mem = memory.find((x) => x.topics === s.topics)
    lines.push(`| ${formatCount(s.topics)} | ${formatCount(s.oursSamples)} | ${formatMs(s.oursMs)} | ${s.oursNsPerSample.toFixed(0)} | ${formatMs(s.promClientMs)} | ${s.promClientNsPerSample.toFixed(0)} | ${formatRatio(s.promClientMs / s.oursMs)} | ${mem ? mem.oursBytesPerSample.toFixed(0) : '—'} | ${mem ? mem.promClientBytesPerSample.toFixed(0) : '—'} |`)
  }
  return lines
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

module.exports = { run, scalingLines }
standalone(module, 'render', run)
