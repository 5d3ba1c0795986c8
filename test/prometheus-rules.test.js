'use strict'
// The shipped rules (prometheus/mq-alerts.yml, and the cluster rules mq-cluster.rules.yml) must
// load in Prometheus and pass their unit tests (*.test.yml), and operations.md's example rule must
// do what it says, checked by promtool from Debian's `prometheus` package. Without promtool the
// test is skipped locally, but fails in CI, which installs it.
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

  t.test("operations.md's MqTargetNeverUp example: fires for a target never up, not for a known one that went down", async (t) => {
    const fs = require('node:fs')
    const os = require('node:os')
    const doc = fs.readFileSync(path.join(root, 'docs', 'operations.md'), 'utf8')
    const example = /```yaml\n(groups:\n  - name: mq-deploy[^]*?)```/.exec(doc)
    t.ok(example, 'the example is in operations.md')
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'mq-deploy-rule-'))
    t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }))
    fs.writeFileSync(path.join(dir, 'deploy.yml'), example[1])
    fs.writeFileSync(path.join(dir, 'deploy.test.yml'), `rule_files: [deploy.yml, ${JSON.stringify(path.join(root, rules))}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'up{job="mq", instance="new:1"}'
        values: '0x10'
      - series: 'up{job="mq", instance="old:1"}'
        values: '1 1 0x8'
      - series: 'mq_quorum_state{job="mq", instance="old:1"}'
        values: '0 0'
    alert_rule_test:
      - eval_time: 3m
        alertname: MqTargetNeverUp
      - eval_time: 8m
        alertname: MqTargetNeverUp
        exp_alerts:
          - exp_labels: { severity: warning, job: mq, instance: 'new:1' }
            exp_annotations: { summary: 'new:1 has not served /metrics since it was added' }
`)
    const r = spawnSync(bin, ['test', 'rules', 'deploy.test.yml'], { cwd: dir, encoding: 'utf8', timeout: 60_000 })
    t.equal(r.status, 0, 'promtool test rules passes', { output: `${r.stdout}${r.stderr}` })
  })
}
