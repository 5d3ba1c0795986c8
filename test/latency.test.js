'use strict'
// The latency estimator's core (design §9, §11) against the compiled dist/core/latency.js, and its C++
// twin (native/latency.cc) when the addon is built. Run `npx tsc -p tsconfig.json` first.
const t = require('tap')
const path = require('node:path')
const { Worker } = require('node:worker_threads')
const { prng } = require('./helpers')
const {
  LATENCY_BUCKETS,
  latencyBucketIndex,
  latencyBucketValue,
  recordLatency,
  quantilesFromCounts,
  LatencyWindow,
} = require('../dist/core/latency.js')

let native = null
let nativeMissing = 'the native addon is not built (run `npx node-gyp rebuild`)'
try {
  native = require(process.env.MQ_METRICS_ADDON_PATH || '../build/Release/mq_metrics.node') // the sanitizer run's build, if set
  if (typeof native.latencyQuantiles !== 'function') {
    nativeMissing = 'build/Release/mq_metrics.node predates latencyQuantiles (rebuild it)'
    native = null
  }
} catch {}

const ONE_MICROSECOND = 0.001
const ONE_HOUR = 3_600_000
const QUANTILES = [['p50', 50], ['p90', 90], ['p99', 99]]


function gaussian(random) {
  return Math.sqrt(-2 * Math.log(1 - random())) * Math.cos(2 * Math.PI * random())
}

// Rejection keeps every sample inside the range where the ≤ 1% promise holds.
function logNormal(random, medianMs, sigma) {
  for (;;) {
    const v = medianMs * Math.exp(sigma * gaussian(random))
    if (v >= ONE_MICROSECOND && v <= ONE_HOUR) return v
  }
}

const SAMPLES = 100_000
const distributions = [
  { name: 'uniform over 1 µs–1 h', sample: (r) => ONE_MICROSECOND + r() * (ONE_HOUR - ONE_MICROSECOND) },
  { name: 'log-uniform over 1 µs–1 h', sample: (r) => ONE_MICROSECOND * Math.pow(ONE_HOUR / ONE_MICROSECOND, r()) },
  { name: 'log-normal (median 20 ms, σ 1.5)', sample: (r) => logNormal(r, 20, 1.5) },
  { name: 'log-normal (median 5 µs, σ 3)', sample: (r) => logNormal(r, 0.005, 3) },
  {
    name: 'bimodal (92% ~0.3 ms, 8% ~2 s)',
    sample: (r) => (r() < 0.92 ? logNormal(r, 0.3, 0.2) : logNormal(r, 2000, 0.3)),
  },
  { name: 'bimodal (50% 1 µs–2 µs, 50% 30–60 min)', sample: (r) => (r() < 0.5 ? 0.001 + r() * 0.001 : 1_800_000 + r() * 1_800_000) },
  { name: 'constant 7.3 ms', sample: () => 7.3 },
  { name: 'constant 1 µs (lower end)', sample: () => ONE_MICROSECOND },
  { name: 'constant 1 h (upper end)', sample: () => ONE_HOUR },
]

function exactNearestRank(sorted, per) {
  // rank = ⌈n·q⌉, 1-based; same exact integer arithmetic as the estimator.
  return sorted[Math.ceil((sorted.length * per) / 100) - 1]
}

function recordAll(values, row = new Float64Array(LATENCY_BUCKETS), base = 0) {
  for (const v of values) recordLatency(row, base, v)
  return row
}

function errorOf(fn) {
  try {
    fn()
  } catch (err) {
    return err
  }
  return null
}

t.test('bucket layout', async (t) => {
  t.equal(LATENCY_BUCKETS, 2048, 'the layout is 32 octaves × 64 sub-buckets; a change here breaks the native twin and stored rows')
  t.equal(latencyBucketIndex(ONE_MICROSECOND) > 0, true, '1 µs must fall inside the range, not be clamped into the first bucket')
  t.equal(latencyBucketIndex(ONE_HOUR) < LATENCY_BUCKETS - 1, true, '1 h must fall inside the range, not be clamped into the last bucket')
  let previousValue = 0
  let ordered = true
  let roundTrips = true
  for (let i = 0; i < LATENCY_BUCKETS; i++) {
    const value = latencyBucketValue(i)
    if (!(value > previousValue)) ordered = false
    if (latencyBucketIndex(value) !== i) roundTrips = false
    previousValue = value
  }
  t.ok(ordered, 'bucket values must strictly increase with the index, or quantile order (p50 ≤ p90 ≤ p99) breaks')
  t.ok(roundTrips, "each bucket's reported value must lie inside that bucket")

  // Worst case of the relative error is at a bucket's ends; probe both ends of every bucket in range.
  let worst = 0
  let worstAt = 0
  for (let i = latencyBucketIndex(ONE_MICROSECOND); i <= latencyBucketIndex(ONE_HOUR); i++) {
    const lower = latencyBucketValue(i) / (1 + 1 / (2 * (64 + (i % 64))))
    for (const v of [Math.max(lower, ONE_MICROSECOND), Math.min(lower * (1 + 1 / (64 + (i % 64))) * (1 - 1e-15), ONE_HOUR)]) {
      const error = Math.abs(latencyBucketValue(latencyBucketIndex(v)) - v) / v
      if (error > worst) [worst, worstAt] = [error, v]
    }
  }
  t.ok(worst <= 0.01, `every value in 1 µs–1 h must be reported within 1%; worst was ${(worst * 100).toFixed(3)}% at ${worstAt} ms`)

  const badIndexes = [-1, LATENCY_BUCKETS, 1.5, NaN]
  for (const index of badIndexes) {
    const err = errorOf(() => latencyBucketValue(index))
    t.ok(err instanceof RangeError, `latencyBucketValue(${index}) must be a RangeError, not a made-up value from bits outside the layout`)
  }
})

t.test('accuracy against exact nearest-rank quantiles', async (t) => {
  let seed = 1
  for (const { name, sample } of distributions) {
    const random = prng(seed++)
    const values = Array.from({ length: SAMPLES }, () => sample(random))
    const row = recordAll(values)
    const got = quantilesFromCounts(row, 0)
    const sorted = Float64Array.from(values).sort()
    t.equal(got && got.count, SAMPLES, `${name}: count must be exactly the number recorded, or samples were lost or double-counted`)
    for (const [key, per] of QUANTILES) {
      const exact = exactNearestRank(sorted, per)
      const error = Math.abs(got[key] - exact) / exact
      t.ok(error <= 0.01, `${name}: ${key} ${got[key]} vs exact ${exact} (${(error * 100).toFixed(3)}%) must be within 1%, or the buckets or the rank scan are wrong`)
    }
    t.ok(got.p50 <= got.p90 && got.p90 <= got.p99, `${name}: p50 ≤ p90 ≤ p99 must hold (${got.p50}, ${got.p90}, ${got.p99})`)
  }
})

t.test('small windows use nearest rank ⌈q·n⌉', async (t) => {
  const cases = [
    { values: [5], want: [5, 5, 5], why: 'a single sample is every quantile' },
    { values: [1, 2], want: [1, 2, 2], why: 'n=2: ranks 1, 2, 2' },
    { values: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], want: [5, 9, 10], why: 'n=10: ranks 5, 9, 10 (not interpolated)' },
    { values: Array.from({ length: 100 }, (_, i) => i + 1), want: [50, 90, 99], why: 'n=100: ranks 50, 90, 99' },
  ]
  for (const { values, want, why } of cases) {
    const got = quantilesFromCounts(recordAll(values), 0)
    const gotIndexes = [got.p50, got.p90, got.p99].map(latencyBucketIndex)
    const wantIndexes = want.map(latencyBucketIndex)
    t.same(gotIndexes, wantIndexes, `${why}; a different bucket means an off-by-one in the rank`)
  }
  t.equal(quantilesFromCounts(new Float64Array(LATENCY_BUCKETS), 0), null, 'an empty window must have no quantiles (null), not zeros')
  const shifted = new Float64Array(3 * LATENCY_BUCKETS)
  recordLatency(shifted, LATENCY_BUCKETS, 42)
  t.equal(quantilesFromCounts(shifted, 0), null, 'offset 0 must read only the first LATENCY_BUCKETS cells')
  t.equal(quantilesFromCounts(shifted, LATENCY_BUCKETS).count, 1, 'an offset must select the row that starts there')
})

t.test('clamping at both ends (counted, not dropped)', async (t) => {
  const cases = [
    { ms: 0, bucket: 0, why: 'zero' },
    { ms: -0, bucket: 0, why: '−0 (its sign bit must not send it to the top)' },
    { ms: Number.MIN_VALUE, bucket: 0, why: 'the smallest subnormal' },
    { ms: 1e-9, bucket: 0, why: '1 ps, below the range' },
    { ms: 0.0009, bucket: 0, why: '0.9 µs, just below 2^-10 ms' },
    { ms: 5_000_000, bucket: LATENCY_BUCKETS - 1, why: '5,000 s, above the range' },
    { ms: 1e300, bucket: LATENCY_BUCKETS - 1, why: '1e300 ms' },
    { ms: Number.MAX_VALUE, bucket: LATENCY_BUCKETS - 1, why: 'the largest double' },
  ]
  for (const { ms, bucket, why } of cases) {
    t.equal(latencyBucketIndex(ms), bucket, `${why} must clamp into bucket ${bucket}`)
    const row = new Float64Array(LATENCY_BUCKETS)
    recordLatency(row, 0, ms)
    t.equal(row[bucket], 1, `${why} must be counted in the end bucket, not dropped`)
  }
})

t.test('bad values are rejected and nothing is recorded', async (t) => {
  const cases = [
    { ms: -1, error: RangeError, shown: '-1' },
    { ms: -1e-300, error: RangeError, shown: '-1e-300' },
    { ms: NaN, error: RangeError, shown: 'NaN' },
    { ms: Infinity, error: RangeError, shown: 'Infinity' },
    { ms: -Infinity, error: RangeError, shown: '-Infinity' },
    // As every other argument check says it (the string was "got string 3", null "got object null").
    { ms: '3', error: TypeError, shown: 'got the string "3"' },
    { ms: undefined, error: TypeError, shown: 'got undefined' },
    { ms: null, error: TypeError, shown: 'got null' },
    { ms: 3n, error: TypeError, shown: 'got the bigint 3n' },
    { ms: new Number(3), error: TypeError, shown: 'got an object' },
  ]
  for (const { ms, error, shown } of cases) {
    const label = typeof ms === 'string' ? `'${ms}'` : typeof ms === 'bigint' ? `${ms}n` : typeof ms === 'object' && ms !== null ? 'new Number(3)' : String(ms)
    const row = new Float64Array(LATENCY_BUCKETS)
    const err = errorOf(() => recordLatency(row, 0, ms))
    t.ok(err instanceof error, `recordLatency(${label}) must throw ${error.name}, got ${err && err.name}; anything else hides a broker bug`)
    t.ok(err && err.message.includes(shown), `the message must name the bad value ${label}: "${err && err.message}"`)
    t.equal(row.reduce((a, b) => a + b, 0), 0, `recordLatency(${label}) must record nothing`)
    const indexErr = errorOf(() => latencyBucketIndex(ms))
    t.ok(indexErr instanceof error, `latencyBucketIndex(${label}) must throw ${error.name} like recordLatency`)
  }
})

// Several threads' rows over one buffer, summed the way a backend's sumCumulative does.
function rowsOf(threads, buffer = new SharedArrayBuffer(threads * LATENCY_BUCKETS * 8)) {
  const cells = new Float64Array(buffer)
  const sumCumulative = (out) => {
    out.fill(0)
    for (let thread = 0; thread < threads; thread++) {
      const base = thread * LATENCY_BUCKETS
      for (let i = 0; i < LATENCY_BUCKETS; i++) out[i] += cells[base + i]
    }
  }
  return { cells, sumCumulative }
}

t.test('rotate semantics', async (t) => {
  const { cells, sumCumulative } = rowsOf(2)
  const window = new LatencyWindow(sumCumulative)
  t.equal(window.quantiles(), null, 'a fresh window with nothing recorded must have no quantiles')

  recordLatency(cells, 0, 10)
  recordLatency(cells, LATENCY_BUCKETS, 10)
  t.equal(window.quantiles()?.count, 2, 'before the first rotation quantiles must read everything recorded so far (design §9: latency at once)')
  recordLatency(cells, 0, 10)
  t.equal(window.quantiles()?.count, 3, 'before the first rotation the partial window must be live, not a frozen snapshot')
  t.equal(window.sealedCount(), 0, 'nothing is sealed before the first rotation')

  window.rotate()
  t.equal(window.sealedCount(), 3, 'the first rotation must seal everything recorded since the start')
  recordLatency(cells, 0, 500)
  recordLatency(cells, LATENCY_BUCKETS, 500)
  const sealed = window.quantiles()
  t.equal(sealed?.count, 3, 'values recorded after a rotation must not enter the sealed window')
  t.equal(latencyBucketIndex(sealed.p99), latencyBucketIndex(10), 'the sealed window must hold only the 10 ms samples')

  window.rotate()
  const second = window.quantiles()
  t.equal(second?.count, 2, 'the next rotation must seal exactly the values recorded since the previous one')
  t.equal(latencyBucketIndex(second.p50), latencyBucketIndex(500), 'the second window must hold only the 500 ms samples, not the first window again')
  const counts = window.windowCounts()
  t.equal(counts[latencyBucketIndex(500)], 2, 'windowCounts must be the sealed per-bucket counts')
  counts[0] = 99
  t.equal(window.quantiles()?.count, 2, 'windowCounts must return a copy that cannot corrupt the sealed window')

  window.rotate()
  t.equal(window.quantiles(), null, 'a window in which nothing was recorded must have no quantiles (no stale values)')
  t.equal(window.sealedCount(), 0, 'an empty sealed window must count 0')

  const errors = [[() => new LatencyWindow(), 'sumCumulative'], [() => new LatencyWindow(sumCumulative, 5), 'quantiles']]
  for (const [make, argument] of errors) {
    const err = errorOf(make)
    t.ok(err instanceof TypeError && err.message.includes(argument), `a bad ${argument} must be a TypeError naming it, not a crash on the first rotation`)
  }
})

t.test('native twin agrees bit for bit', { skip: native ? false : nativeMissing }, async (t) => {
  t.equal(native.latencyBuckets, LATENCY_BUCKETS, 'C++ and TypeScript must agree on the bucket count, or they read different layouts')

  let everyBucket = true
  const single = new Float64Array(LATENCY_BUCKETS)
  for (let i = 0; i < LATENCY_BUCKETS; i++) {
    single.fill(0)
    single[i] = 1
    const ours = quantilesFromCounts(single, 0)
    const theirs = native.latencyQuantiles(single, 0)
    if (!Object.is(ours.p50, theirs.p50) || !Object.is(ours.p99, theirs.p99) || ours.p50 !== latencyBucketValue(i)) {
      everyBucket = false
      t.fail(`bucket ${i}: TS ${ours.p50} vs C++ ${theirs.p50}: the bucket midpoint is computed differently`)
      break
    }
  }
  t.ok(everyBucket, 'every bucket must report the very same double from C++ and TypeScript')

  let seed = 100
  const cases = distributions.map(({ name, sample }) => {
    const random = prng(seed++)
    return { name, counts: recordAll(Array.from({ length: 10_000 }, () => sample(random))) }
  })
  const random = prng(7)
  const sparse = new Float64Array(LATENCY_BUCKETS)
  for (let k = 0; k < 40; k++) sparse[Math.floor(random() * LATENCY_BUCKETS)] += 1 + Math.floor(random() * 1e6)
  cases.push({ name: 'sparse random counts up to 1e6 per bucket', counts: sparse })
  cases.push({ name: 'empty', counts: new Float64Array(LATENCY_BUCKETS) })
  const fractional = new Float64Array(LATENCY_BUCKETS)
  fractional[3] = 1.25
  fractional[900] = 1.25
  cases.push({ name: 'non-integer counts (a misuse; rank99 > count must stop at the last bucket)', counts: fractional })
  for (const { name, counts } of cases) {
    t.same(native.latencyQuantiles(counts, 0), quantilesFromCounts(counts, 0), `${name}: C++ and TypeScript must return identical results`)
  }
  const padded = new Float64Array(LATENCY_BUCKETS * 3)
  padded.set(sparse, LATENCY_BUCKETS)
  const view = padded.subarray(1) // a byteOffset ≠ 0
  t.same(native.latencyQuantiles(view, LATENCY_BUCKETS - 1), quantilesFromCounts(view, LATENCY_BUCKETS - 1), 'C++ must honour both the offset and the view’s byteOffset')

  const { cells, sumCumulative } = rowsOf(1)
  recordAll([1, 2, 3, 400], cells)
  const window = new LatencyWindow(sumCumulative, native.latencyQuantiles)
  window.rotate()
  t.same(window.quantiles(), quantilesFromCounts(window.windowCounts(), 0), 'a LatencyWindow given the C++ quantiles must read the same sealed window')
})

t.test('2 workers record while the main thread rotates: no value lost or counted twice', async (t) => {
  const WORKERS = 2
  const PER_WORKER = 500_000
  const MAX_ROTATIONS = 1_000_000 // bound: the loop also stops when both workers are done
  const MAX_MS = 30_000
  const buffer = new SharedArrayBuffer(WORKERS * LATENCY_BUCKETS * 8)
  const rows = rowsOf(WORKERS, buffer)
  const control = new Int32Array(new SharedArrayBuffer(8)) // [0] start flag, [1] workers done

  const workerSource = `
    const { workerData } = require('node:worker_threads')
    const { recordLatency, LATENCY_BUCKETS } = require(workerData.latencyPath)
    const cells = new Float64Array(workerData.buffer)
    const control = new Int32Array(workerData.control)
    const base = workerData.thread * LATENCY_BUCKETS
    let a = workerData.thread + 1
    Atomics.wait(control, 0, 0)
    for (let n = 0; n < workerData.count; n++) {
      a = (Math.imul(a, 1103515245) + 12345) >>> 0
      recordLatency(cells, base, 0.001 * Math.pow(3.6e9, a / 4294967296))
    }
    Atomics.add(control, 1, 1)
  `
  const workers = []
  for (let thread = 0; thread < WORKERS; thread++) {
    const worker = new Worker(workerSource, {
      eval: true,
      workerData: { latencyPath: path.join(__dirname, '../dist/core/latency.js'), buffer, control: control.buffer, thread, count: PER_WORKER },
      execArgv: [],
    })
    workers.push({ worker, exited: new Promise((resolve, reject) => { worker.on('exit', resolve); worker.on('error', reject) }) })
  }
  await Promise.all(workers.map(({ worker }) => new Promise((resolve) => worker.once('online', resolve))))

  const window = new LatencyWindow(rows.sumCumulative)
  let total = 0
  let rotations = 0
  let nonEmptyWindows = 0
  let negativeCells = 0
  const deadline = Date.now() + MAX_MS
  Atomics.store(control, 0, 1)
  Atomics.notify(control, 0)
  while (Atomics.load(control, 1) < WORKERS && rotations < MAX_ROTATIONS && Date.now() < deadline) {
    window.rotate()
    rotations++
    const sealed = window.sealedCount()
    total += sealed
    if (sealed > 0) nonEmptyWindows++
    if (rotations % 64 === 0 && window.windowCounts().some((c) => c < 0)) negativeCells++
  }
  const exitCodes = await Promise.all(workers.map(({ exited }) => exited))
  t.same(exitCodes, [0, 0], 'both workers must finish recording without an error')
  window.rotate() // the final window: everything recorded since the last rotation in the loop
  total += window.sealedCount()

  t.equal(total, WORKERS * PER_WORKER, `the sealed windows (${rotations + 1} rotations) must add up to every value recorded, or a rotation lost or double-counted values`)
  t.ok(nonEmptyWindows >= 2, `recording must have overlapped several rotations (${nonEmptyWindows} non-empty windows), or this test proved nothing about racing`)
  t.equal(negativeCells, 0, 'no window may show a negative bucket count, or a snapshot saw a cell go backwards')
  const all = new Float64Array(LATENCY_BUCKETS)
  rows.sumCumulative(all)
  t.equal(all.reduce((a, b) => a + b, 0), WORKERS * PER_WORKER, 'the cumulative rows must hold every value (single writer per row, no lost update)')
})

t.test('e2e_latency_timer: false leaves the window to the broker\'s clock; by default the surface rotates every 60 s', async (t) => {
  const { createSurface } = require('../dist')
  for (const timer of [undefined, false]) {
    const intervals = []
    const real = global.setInterval
    global.setInterval = (fn, ms, ...rest) => {
      const handle = real(fn, ms, ...rest)
      intervals.push({ fn, ms })
      return handle
    }
    let s
    try {
      s = createSurface({ e2e_latency: true, ...(timer === undefined ? {} : { e2e_latency_timer: timer }), metrics_enabled: false })
    } finally {
      global.setInterval = real
    }
    const rotations = intervals.filter((x) => x.ms === 60000)
    t.equal(s.config.e2e_latency_timer, timer ?? true)
    s.latency.rotate() // the broker's clock: t = 0
    for (let i = 0; i < 90; i++) s.latency.record(10)
    for (const { fn } of rotations) fn() // t = 30 s: the surface's timer, if it has one
    for (let i = 0; i < 10; i++) s.latency.record(500)
    s.latency.rotate() // the broker's clock: t = 60 s
    if (timer === undefined) {
      t.equal(rotations.length, 1, 'by default the surface rotates every 60 s')
      t.equal(s.latency.quantiles().count, 10, 'and with both clocks the window is cut where the timer fired (why a broker with its own clock turns it off)')
    } else {
      t.equal(rotations.length, 0, 'no timer')
      const q = s.latency.quantiles()
      t.same([q.count, Math.round(q.p50), Math.round(q.p99)], [100, 10, 502], 'the window is the broker\'s: 0 to 60 s (values within 0.78 %)')
    }
    t.equal(s.stats('config').e2e_latency_timer, timer ?? true, 'stats(\'config\') shows it')
    s.close()
  }
  t.throws(() => createSurface({ e2e_latency_timer: 'no' }), { name: 'ConfigError', message: /e2e_latency_timer: must be a boolean/ })
})
