'use strict'
// The shipped rules (prometheus/mq-alerts.yml, and the cluster rules mq-cluster.rules.yml) must
// load in Prometheus and pass their unit tests (*.test.yml), checked by promtool from Debian's `prometheus`
// package. Without promtool the test is skipped locally, but fails in CI, which installs it.
// PROMTOOL=/path/to/promtool overrides the binary found on PATH.
const t = require('tap')
require('./helpers') // children spawned here start without tap's hooks (see helpers.js)
const path = require('node:path')
const { spawnSync } = require('node:child_process')

const root = path.join(__dirname, '..')
const rules = path.join('prometheus', 'mq-alerts.yml')
const tests = path.join('prometheus', 'mq-alerts.test.yml')

const bin = process.env.PROMTOOL || 'promtool'

function promtool (...args) {
  return spawnSync(bin, args, { cwd: root, encoding: 'utf8', timeout: 60_000 })
}

const probe = promtool('--version')
const missing = probe.error && probe.error.code === 'ENOENT'
const inCI = Boolean(process.env.CI) && !/^(0|false)$/i.test(process.env.CI)

if (missing && inCI) {
  t.fail(`${bin} is not on PATH, but CI must have it: .ci/run installs Debian's prometheus package`)
} else if (missing) {
  t.plan(0, `${bin} not found: install Debian's prometheus package (apt-get install --no-install-recommends prometheus) to check the alert rules`)
} else {
  for (const [name, args] of [
    ['promtool check rules', ['check', 'rules', rules]],
    ['promtool test rules', ['test', 'rules', tests]],
    ['promtool check rules (cluster)', ['check', 'rules', path.join('prometheus', 'mq-cluster.rules.yml')]],
    ['promtool test rules (cluster)', ['test', 'rules', path.join('prometheus', 'mq-cluster.rules.test.yml')]]
  ]) {
    t.test(name, async (t) => {
      const r = promtool(...args)
      const output = `${r.stdout || ''}${r.stderr || ''}`.trim()
      t.equal(r.error && r.error.message, undefined, `${name} could be started`)
      t.equal(r.signal, null, `${name} was not killed (timeout 60 s)`)
      t.equal(r.status, 0, `${name} ${args.slice(2).join(' ')} exits 0`, { output })
      if (r.status !== 0) t.comment(output)
    })
  }
}
