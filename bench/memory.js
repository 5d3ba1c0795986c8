'use strict'
// Memory per sample: a child process per library and size (node --expose-gc): heap + external
// growth after the series exist and were scraped (ours: twice, gzip, as Prometheus scrapes, so
// that the gzip chunk cache is in its steady state), divided by the sample count. Ours runs the
// JS backend there so that the arena is counted exactly (its SharedArrayBuffer's length: the
// native backend maps the same chunks, but V8 counts each external view of them again).
// Reproduce: node bench/memory.js [--quick]
const path = require('node:path')
const zlib = require('node:zlib')
const { execFileSync } = require('node:child_process')
const { DIST, formatCount, formatRatio, log, pass, row, standalone } = require('./harness')
const { SIZES, BIG, MILLION, buildOurs, buildPromClient, countSamples, scrapeBuffer, scrapeGzip } = require('./workload')

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
  const out = execFileSync(process.execPath, ['--expose-gc', __filename, '--child', library, String(topics)], {
    env, encoding: 'utf8', maxBuffer: 1 << 20,
  })
  return JSON.parse(out.trim().split('\n').pop())
}
async function run({ options }) {
  // 1M samples (the render section's largest size) are left out: prom-client's registry alone
  // takes gigabytes there, and bytes per sample are flat from 10k on.
  const sizes = options.quick ? [BIG] : SIZES.filter((topics) => topics !== MILLION)
  const measured = []
  for (const topics of sizes) {
    log(`memory: ${formatCount(topics)} topics, one child process per library`)
    measured.push({ topics, ours: runMemoryChild('ours', topics), promClient: runMemoryChild('prom-client', topics) })
  }
  const results = measured.map((m) => ({
    topics: m.topics,
    oursSamples: m.ours.samples,
    promClientSamples: m.promClient.samples,
    oursBytesPerSample: m.ours.scrapedBytes / m.ours.samples,
    promClientBytesPerSample: m.promClient.scrapedBytes / m.promClient.samples,
    oursBuiltBytesPerSample: m.ours.builtBytes / m.ours.samples,
    promClientBuiltBytesPerSample: m.promClient.builtBytes / m.promClient.samples,
    ours: m.ours,
    promClient: m.promClient,
  }))
  const big = results.find((m) => m.topics === BIG)
  return {
    results,
    rows: [row(`memory per sample at ${formatCount(big.oursSamples)} samples (heap + external + arena, after two gzip scrapes)`, `${big.promClientBytesPerSample.toFixed(0)} B`, `${big.oursBytesPerSample.toFixed(0)} B`, formatRatio(big.promClientBytesPerSample / big.oursBytesPerSample), '≤ 120 B', pass(big.oursBytesPerSample <= 120))],
  }
}

module.exports = { run }
if (require.main === module && process.argv[2] === '--child') {
  memoryChild(process.argv[3], Number(process.argv[4])).catch((error) => {
    console.error(error)
    process.exit(1)
  })
} else {
  standalone(module, 'memory', run)
}
