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

const bin = require('./helpers').promtoolFor(t)

function promtool (...args) {
  return spawnSync(bin, args, { cwd: root, encoding: 'utf8', timeout: 60_000 })
}

if (bin !== undefined) {
  for (const [name, args] of [
    ['promtool check rules', ['check', 'rules', rules]],
    ['promtool test rules', ['test', 'rules', tests]],
    ['promtool test rules (evaluated every 5 s)', ['test', 'rules', path.join('prometheus', 'mq-alerts.fast.test.yml')]],
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
      # two clusters whose pods share a name: eu's mq-0 never came up, us' did
      - series: 'up{job="mq", namespace="eu", instance="mq-0"}'
        values: '0x10'
      - series: 'up{job="mq", namespace="us", instance="mq-0"}'
        values: '1x10'
      - series: 'mq_quorum_state{job="mq", namespace="us", instance="mq-0"}'
        values: '0x10'
    alert_rule_test:
      - eval_time: 3m
        alertname: MqTargetNeverUp
      - eval_time: 8m
        alertname: MqTargetNeverUp
        exp_alerts:
          - exp_labels: { severity: warning, job: mq, namespace: eu, instance: 'mq-0' }
            exp_annotations: { summary: 'mq-0 has not served /metrics since it was added' }
          - exp_labels: { severity: warning, job: mq, instance: 'new:1' }
            exp_annotations: { summary: 'new:1 has not served /metrics since it was added' }
`)
    const r = spawnSync(bin, ['test', 'rules', 'deploy.test.yml'], { cwd: dir, encoding: 'utf8', timeout: 60_000 })
    t.equal(r.status, 0, 'promtool test rules passes', { output: `${r.stdout}${r.stderr}` })
  })

  // The conservation rule against the library's own /metrics, not hand-written series: 30 minutes
  // of one scrape a minute (render() after each minute's calls), every sample as scraped but the
  // uptime (a real process would have run 10 minutes by then). Topic `offline`: a subscriber
  // away, its messages owed, expired ones dropped and others sent and acknowledged out of order
  // above its floor, nothing in flight at any scrape: honest, the alert must stay quiet (it fired
  // when mq_partition_depth was counted from the floor). Topic `lossy`: one message counted
  // delivered twice at minute 12 (delivered() and settle(), a misuse, on a partition new then): the alert must fire. Topic
  // `resub`: its one subscriber leaves at minute 14 (what it owed settled, the group removed),
  // messages are published while no one subscribes, and it is back `from: 'latest'` at minute 15,
  // a scrape between: the messages owed by no one must not read as lost. Topic `churn`: sessions
  // that live between two scrapes (registered from 'latest', removed) must not read as double counts.
  // Topic `flap`: its group removed and registered again between two scrapes.
  for (const backend of require('./helpers').backends()) {
    t.test(`${backend}: MqConservationBroken on the library's own /metrics: quiet on honest out-of-order settlement, firing on a double count`, async (t) => {
      const fs = require('node:fs')
      const os = require('node:os')
      const { surfaceOn } = require('./helpers')
      const s = surfaceOn(t, backend, undefined, { scrapeThread: false })
      s.on('fault', () => {}) // the misuse raises faults of its own (its subject here is the rule)
      const offline = s.topic('offline')
      const away = offline.group('away')
      const lossy = s.topic('lossy')
      const g = lossy.group('g')
      const resub = s.topic('resub')
      let sub = resub.group('client-7', { from: 'latest' })
      const churn = s.topic('churn')
      const stays = churn.group('stays')
      const { leftClock } = require('../dist/core/left.js')
      const clock = leftClock.now
      let now = 0
      leftClock.now = () => now
      t.teardown(() => (leftClock.now = clock))
      const flap = s.topic('flap')
      let f = flap.group('f')
      const MINUTES = 30
      const series = new Map() // 'name{labels}' → a value per minute
      const scrape = (minute) => {
        for (const line of s.render().split('\n')) {
          const m = /^(mq_[a-z_]+)(?:\{(.*)\})? (\S+)$/.exec(line)
          if (m === null || m[1] === 'mq_broker_uptime_seconds' || m[1] === 'mq_e2e_latency_ms') continue
          const key = `${m[1]}{job="mq",instance="b:9464"${m[2] ? ',' + m[2] : ''}}`
          if (!series.has(key)) series.set(key, new Array(minute).fill('_'))
          series.get(key).push(m[3])
        }
        for (const values of series.values()) if (values.length === minute) values.push('_')
      }
      for (let minute = 0; minute < MINUTES; minute++) {
        for (let i = 0; i < 3; i++) {
          const seq = offline.append(0, 10)
          if (seq % 3 === 2) away.settle(0, seq, 'dropped') // expired before it could be sent
          else if (seq % 3 === 0) (away.send(0, seq), away.settle(0, seq, 'delivered')) // sent and acknowledged
          // seq % 3 === 1: owed, never sent (the floor stays below it)
        }
        for (let i = 0; i < 2; i++) {
          const seq = lossy.append(0, 10)
          g.send(0, seq)
          if (minute === 12 && i === 0) {
            // Counted by count as well: delivered twice. delivered() takes it only while some
            // partition of the topic has no window of the group: a new one here, settled per message after.
            const other = lossy.append(1, 10)
            g.delivered(1)
            g.send(1, other)
            g.settle(1, other, 'delivered')
          }
          g.settle(0, seq, 'delivered')
        }
        if (minute === 15) sub = resub.group('client-7', { from: 'latest' }) // back
        if (minute !== 14) {
          for (let i = 0; i < 2; i++) {
            const seq = resub.append(0, 10)
            sub.send(0, seq)
            sub.settle(0, seq, 'delivered')
          }
        } else {
          resub.removeGroup('client-7') // it owed nothing: every message it was sent is settled
          for (let i = 0; i < 3; i++) resub.append(0, 10) // published while no one subscribes
        }
        // churn: a session between two scrapes at minutes 8, 9 and 20 (registered from 'latest', sent two
        // messages, removed), seen by no scrape as live: it must not read as a double count.
        for (let i = 0; i < 2; i++) {
          const seq = churn.append(0, 10)
          if (minute === 8 || minute === 9 || minute === 20) {
            const session = churn.group(`session-${minute}`, { from: 'latest' })
            const mine = churn.append(0, 10)
            session.send(0, mine)
            session.settle(0, mine, 'delivered')
            stays.send(0, mine)
            stays.settle(0, mine, 'delivered')
            churn.removeGroup(`session-${minute}`)
          }
          stays.send(0, seq)
          stays.settle(0, seq, 'delivered')
        }
        // flap: its group removed and registered again from 'latest' between two scrapes, 3
        // messages published while it was away (owed by no one): must not read as lost.
        if (minute === 10) {
          flap.removeGroup('f')
          for (let i = 0; i < 3; i++) flap.append(0, 10)
          f = flap.group('f', { from: 'latest' })
        }
        const fseq = flap.append(0, 10)
        f.send(0, fseq)
        f.settle(0, fseq, 'delivered')
        now = (minute + 1) * 60_000
        scrape(minute)
      }
      const stayed = series.get('mq_group_retries_total{job="mq",instance="b:9464",topic="churn",group="stays"}')
      t.same([stayed[7], stayed[8], stayed[12], stayed[13]], ['0', '_', '_', '0'], 'after a session seen by no scrape as live, the topic\'s retries series is left out for 5 minutes')
      t.notOk([...series.keys()].some((key) => key.includes('session-')), 'and the session itself is in no scrape')
      const depth = s.stats('partitions', { topic: 'offline' }).partitions[0].depth
      t.equal(depth, MINUTES, 'the partition depth is what the group still owes (one message a minute), not last_seq − its floor')
      const input = [...series].map(([key, values]) => `      - series: '${key}'\n        values: '${values.join(' ')}'`)
      input.push(`      - series: 'mq_broker_uptime_seconds{job="mq",instance="b:9464"}'\n        values: '600+60x${MINUTES - 1}'`)
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'mq-conservation-rule-'))
      t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }))
      fs.writeFileSync(path.join(dir, 'conservation.test.yml'), `rule_files: [${JSON.stringify(path.join(root, rules))}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
${input.join('\n')}
    promql_expr_test:
      - expr: 'max by (alertname, topic) (max_over_time(ALERTS{alertname="MqConservationBroken",alertstate="firing"}[${MINUTES}m]))'
        eval_time: ${MINUTES - 1}m
        exp_samples:
          - labels: '{alertname="MqConservationBroken",topic="lossy"}'
            value: 1
`)
      const r = spawnSync(bin, ['test', 'rules', 'conservation.test.yml'], { cwd: dir, encoding: 'utf8', timeout: 60_000 })
      t.equal(r.status, 0, 'MqConservationBroken fired for lossy, and never for offline, resub, churn nor flap (promtool test rules)', { output: `${r.stdout}${r.stderr}` })
    })
  }
}
