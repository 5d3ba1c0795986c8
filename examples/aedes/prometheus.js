'use strict'
// Points a real Prometheus (the `prometheus` binary, or $PROMETHEUS) at a /metrics URL and waits
// until every family the endpoint shows is queryable. Without the binary it says so and returns.
const { spawn, spawnSync } = require('node:child_process')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const net = require('node:net')

const BIN = process.env.PROMETHEUS || 'prometheus'

async function freePort() {
  const server = net.createServer().listen(0, '127.0.0.1')
  await new Promise((resolve) => server.once('listening', resolve))
  const { port } = server.address()
  await new Promise((resolve) => server.close(resolve))
  return port
}

async function prometheusIngests(metricsUrl, { timeoutMs = 60_000 } = {}) {
  if (spawnSync(BIN, ['--version']).status !== 0) {
    if (process.env.CI) throw new Error(`${BIN} is not installed (CI installs Debian's prometheus package)`)
    console.log(`# ${BIN} not found: the Prometheus ingestion check is skipped`)
    return
  }
  const text = await (await fetch(`${metricsUrl}/metrics`)).text()
  const samples = text.split('\n').filter((l) => l.startsWith('mq_'))
  // Every family with at least one sample (a family can be declared with none, e.g. latency when off).
  const families = [...new Set(text.match(/^# TYPE (mq_\w+)/gm).map((l) => l.slice(7)))].filter((f) => samples.some((l) => l.startsWith(f)))
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'aedes-prom-'))
  const { host } = new URL(metricsUrl)
  fs.writeFileSync(path.join(dir, 'prometheus.yml'), `global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: aedes\n    static_configs:\n      - targets: ['${host}']\n        labels: { mq_log: none }\n`)
  const port = await freePort()
  const child = spawn(BIN, [`--config.file=${path.join(dir, 'prometheus.yml')}`, `--storage.tsdb.path=${path.join(dir, 'data')}`, `--web.listen-address=127.0.0.1:${port}`], { stdio: 'ignore' })
  try {
    const end = Date.now() + timeoutMs
    for (;;) {
      const missing = []
      for (const name of families) {
        const answer = await fetch(`http://127.0.0.1:${port}/api/v1/query?query=${encodeURIComponent(`count({__name__=~"${name}(_bucket|_sum|_count)?"})`)}`).then((r) => r.json()).catch(() => null)
        if (!answer || answer.status !== 'success' || answer.data.result.length === 0) missing.push(name)
      }
      if (missing.length === 0) return families
      if (Date.now() > end) throw new Error(`Prometheus did not ingest: ${missing.join(', ')}`)
      await new Promise((resolve) => setTimeout(resolve, 500))
    }
  } finally {
    child.kill('SIGKILL')
    fs.rmSync(dir, { recursive: true, force: true })
  }
}

module.exports = { prometheusIngests }
