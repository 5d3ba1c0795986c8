'use strict'
// mq-metrics against prom-client 15 on the same workload, in the same process: every section of
// bench/ in one run, one table (docs/benchmarks.md shows the current one) and the full numbers as
// JSON.
//
// Reproduce:  npm run bench            (builds, then: node bench/run.js)
//             node bench/run.js --quick   (fewer rounds, sizes and scrapes)
//             node bench/run.js --only hot,render   (sections: hot latency workers render memory load)
//             node bench/render.js --quick          (any one section by itself)
//
// Each section is a file (bench/<section>.js: what it measures and how, at its top) exporting
// `run(context)` → { results, rows }; the method they share is in bench/harness.js and
// bench/sampling.js, the workload in bench/workload.js.
const path = require('node:path')
const fs = require('node:fs')
const os = require('node:os')
const { performance } = require('node:perf_hooks')
const { SAMPLE_MS, checkSink } = require('./sampling')
const { SECTIONS, context, log, machine, parseOptions, tableLines } = require('./harness')
const { scalingLines } = require('./render')

const TITLES = {
  hot: 'hot path: delivered, produced, dispatch',
  latency: 'latency estimator',
  workers: '2 worker threads vs 1',
  render: 'render, realistic workload, up to 1M samples',
  memory: 'memory per sample',
  load: '/metrics under load while 2 workers record',
}

async function main() {
  const started = performance.now()
  const options = parseOptions(process.argv.slice(2))
  const ctx = context(options)
  const probe = ctx.lib.createSurface()
  const results = {
    machine: machine(),
    command: `node bench/run.js${options.quick ? ' --quick' : ''}${options.nice ? ` --nice ${options.nice}` : ''}`,
    rounds: ctx.rounds, sampleMs: SAMPLE_MS, backend: probe.backend,
  }
  await probe.close()
  const rows = []
  for (const name of SECTIONS) {
    if (!options.only.has(name)) continue
    log(TITLES[name])
    const section = await require(`./${name}.js`).run(ctx)
    results[name] = section.results
    rows.push(...section.rows)
  }
  checkSink()
  results.machine.loadAverageAtEnd = os.loadavg().map((x) => Math.round(x * 100) / 100)
  results.durationSeconds = Math.round((performance.now() - started) / 100) / 10
  results.table = rows

  const m = results.machine
  const lines = []
  lines.push(`mq-metrics ${require('../package.json').version} (${results.backend} backend) vs prom-client ${m.promClient}: ${m.cpu}, ${m.cores} cores, ${m.platform}, Node ${m.node}; ${m.date.slice(0, 10)}; load average ${m.loadAverageAtStart.join(' ')} → ${m.loadAverageAtEnd.join(' ')}`)
  lines.push(`median of ${ctx.rounds} interleaved rounds of ≥ ${SAMPLE_MS} ms each; reproduce: npm run bench${options.quick ? ' -- --quick' : ''}`)
  if (options.nice) lines.push(`EXPERIMENT: the main thread ran the load section at nice ${options.nice} (--nice); not the library's default`)
  lines.push('', ...tableLines(rows))
  if (results.render) {
    lines.push('', ...scalingLines(results.render.scaling, results.memory))
    const big = results.render.scaling.find((s) => s.topics === require('./workload').BIG)
    lines.push('', `Of the ${big.oursMs.toFixed(1)} ms big scrape: the snapshot alone (read side + conservation check, as GET /healthz) ${results.render.snapshotMs.toFixed(1)} ms; surface.render() as a string ${results.render.renderStringMs.toFixed(1)} ms.`)
  }
  console.log(lines.join('\n'))

  fs.mkdirSync(path.dirname(options.json), { recursive: true })
  fs.writeFileSync(options.json, JSON.stringify(results, null, 2) + '\n')
  log(`done in ${results.durationSeconds} s; full numbers in ${path.relative(process.cwd(), options.json)}`)
  // Timers of the surfaces and the workers are gone; exit explicitly in case a socket lingers.
  process.exit(process.exitCode ?? 0)
}

main().catch((error) => {
  console.error(error)
  process.exit(1)
})
