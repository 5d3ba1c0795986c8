'use strict'
// The harness every bench section runs on: options, the context a section gets (the library,
// prom-client, the rounds), the report's formatting and the machine it ran on, and `standalone()`,
// which lets each section file run by itself (`node bench/render.js --quick`).
//
// Method, shared by every section. Every candidate runs once per round, rounds interleaved (ours,
// prom-client, ours, …) so that drift in CPU frequency, GC pressure or the neighbours' load hits
// both alike; the first round is a discarded warm-up; each sample loops until at least SAMPLE_MS
// have passed (the batch doubles until one batch takes a tenth of that); the table shows the
// median over the rounds. Every loop returns a value that is summed into a sink and checked at the
// end, so the JIT cannot drop the work (bench/sampling.js). Each library gets its own loop
// functions (separate closures), so no call site sees both.
const path = require('node:path')
const fs = require('node:fs')
const os = require('node:os')
const { execFileSync } = require('node:child_process')
const { performance } = require('node:perf_hooks')
const { SAMPLE_MS, checkSink, median } = require('./sampling')

const DIST = path.join(__dirname, '..', 'dist')

/** The sections, in the order `npm run bench` runs them; each is bench/<name>.js. */
const SECTIONS = ['hot', 'latency', 'workers', 'render', 'memory', 'load']

/**
 * `--quick` (fewer rounds and scrapes), `--only a,b` (run.js), `--json FILE`, `--nice N` (the load
 * section: the main thread at a lower scheduler weight, an experiment, not the default).
 */
function parseOptions(argv, { sections = SECTIONS, json = path.join(__dirname, 'results', 'latest.json') } = {}) {
  const out = { quick: false, only: new Set(sections), json, nice: 0, surface: {} }
  for (let i = 0; i < argv.length; i++) {
    const value = () => {
      if (i + 1 >= argv.length || argv[i + 1].startsWith('--')) throw new Error(`${argv[i]} needs a value`)
      return argv[++i]
    }
    if (argv[i] === '--quick') out.quick = true
    else if (argv[i] === '--only') out.only = new Set(value().split(','))
    else if (argv[i] === '--json') out.json = value()
    else if (argv[i] === '--nice') {
      out.nice = Number(value())
      if (!Number.isInteger(out.nice) || out.nice < 1 || out.nice > 19) throw new Error(`--nice takes 1 to 19, not ${argv[i]}`)
    } else if (argv[i] === '--scrape-share') out.surface.scrapeShare = Number(value())
    else if (argv[i] === '--main-thread') out.surface.scrapeThread = false
    else throw new Error(`unknown option ${argv[i]} (known: --quick, --only SECTIONS, --json FILE, --nice N, --scrape-share S, --main-thread)`)
  }
  for (const section of out.only) if (!sections.includes(section)) throw new Error(`unknown section ${section} (known: ${sections.join(', ')})`)
  return out
}

/** What a section's `run(context)` gets. */
function context(options) {
  return {
    options,
    rounds: options.quick ? 5 : 7,
    lib: require(path.join(DIST, 'index.js')),
    promClient: require('prom-client'),
    METRICS: require(path.join(DIST, 'exposition', 'allowlist.js')).METRICS,
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
/** A numeric option of a standalone script (`--rounds 5`): the number after `name` on the command line, or `fallback`. */
const flag = (name, fallback) => { const argv = process.argv; const i = argv.indexOf(name, 2); return i < 0 ? fallback : Number(argv[i + 1]) }

function log(text) {
  process.stderr.write(`[bench ${(performance.now() / 1000).toFixed(1)} s] ${text}\n`)
}

/** Per-operation medians of interleaved candidates: { [operation]: { oursNs, promClientNs, ratio, … } }. */
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
const formatCount = (n) => n.toLocaleString('en-US')
const pass = (ok) => (ok ? 'pass' : '**MISS**')

/** A table row: [operation, prom-client median, ours, ratio, target, verdict]. */
function row(operation, promClientMedian, ours, ratio, target, verdict) {
  return { operation, promClientMedian, ours, ratio, target, verdict }
}

function tableLines(rows) {
  const lines = ['| operation | prom-client (median) | ours (median) | ratio | target | |', '|---|---:|---:|---:|---|---|']
  for (const r of rows) lines.push(`| ${[r.operation, r.promClientMedian, r.ours, r.ratio, r.target, r.verdict].join(' | ')} |`)
  return lines
}

/**
 * Runs one section file by itself when it is the main module: `node bench/<name>.js [--quick]
 * [--json FILE]` prints its rows (and notes) and writes its results as JSON if asked.
 */
function standalone(module, name, run) {
  if (require.main !== module) return
  const options = parseOptions(process.argv.slice(2), { sections: [name], json: undefined })
  run(context(options))
    .then((section) => {
      checkSink()
      const lines = tableLines(section.rows)
      if (section.notes?.length) lines.push('', ...section.notes)
      console.log(lines.join('\n'))
      if (options.json) {
        fs.mkdirSync(path.dirname(options.json), { recursive: true })
        fs.writeFileSync(options.json, JSON.stringify({ machine: machine(), [name]: section.results }, null, 2) + '\n')
      }
      process.exit(process.exitCode ?? 0) // a lingering socket or timer must not keep a bench alive
    })
    .catch((error) => {
      console.error(error)
      process.exit(1)
    })
}

module.exports = {
  DIST, SECTIONS, SAMPLE_MS, parseOptions, context, sleep, flag, log, summarise, machine, row, tableLines, standalone,
  formatNs, formatCores, formatChange, formatMs, formatRatio, formatRate, formatCount, pass,
}
