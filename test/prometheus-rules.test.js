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

  // MqNearCardinalityCap against the library's own /metrics: broker `at` holds exactly 90% of each
  // cap (900 topics of max_topics 1000, 230 groups on one topic, 3,686 partitions on another) and
  // must stay quiet; broker `above` holds one more of each and must fire once per cap, after its 5
  // minutes, and resolve for topics once its topics are removed. promtool's unit tests refuse a
  // query over 5,000 samples, so the rule runs alone (its text cut from mq-alerts.yml), one broker
  // at a time, with max_topics 1,000 written in place of the default (as the rule's comment tells
  // an operator with another cap to do); the shipped figures must be the library's defaults.
  t.test('MqNearCardinalityCap: quiet at 90% of each cap, firing above it, resolved once below', async (t) => {
    const fs = require('node:fs')
    const os = require('node:os')
    const { surfaceOn } = require('./helpers')
    const defaults = require('../dist/core/config.js').resolveConfig({})
    const shipped = /\n(      - alert: MqNearCardinalityCap\n[^]*?)\n\n/.exec(fs.readFileSync(path.join(root, rules), 'utf8'))
    t.ok(shipped, 'the rule is in mq-alerts.yml')
    const rule = shipped[1]
    const figures = [...rule.matchAll(/> 0\.9 \* (\d+), "cap", "(\w+)"/g)].map((m) => [m[2], Number(m[1])])
    t.same(figures, ['max_topics', 'max_groups_per_topic', 'max_partitions_per_topic'].map((cap) => [cap, defaults[cap]]), "the rule's figures are the library's default caps")
    const TOPICS = 1000
    const lines = (instance, extra) => {
      const s = surfaceOn(t, 'js', { max_topics: TOPICS }, { scrapeThread: false })
      for (let i = 0; i < 0.9 * TOPICS - 2 + extra; i++) s.topic(`device-${i}`) // with `fan` and `wide`
      const fan = s.topic('fan')
      for (let i = 0; i < Math.floor(0.9 * defaults.max_groups_per_topic) + extra; i++) fan.group(`session-${i}`)
      const wide = s.topic('wide')
      for (let p = 0; p < Math.floor(0.9 * defaults.max_partitions_per_topic) + extra; p++) wide.append(p, 1)
      const out = new Map() // series → its value now
      for (const line of s.render().split('\n')) {
        const m = /^(mq_topic_messages_produced_total|mq_group_in_flight|mq_partition_last_seq)\{(.*)\} (\S+)$/.exec(line)
        if (m !== null) out.set(`${m[1]}{job="mq",instance="${instance}",${m[2]}}`, m[3])
      }
      s.close()
      return out
    }
    // 13 minutes scraped; broker above's device topics go (removed: their series stale) at minute 8.
    const gone = (key) => key.includes('"above:9464"') && key.startsWith('mq_topic') && key.includes('device-')
    const series = (lines) => [...lines].map(([key, v]) => `      - { series: '${key}', values: '${gone(key) ? `${v}x7 stale` : `${v}x12`}' }`).join('\n')
    const description = (value, cap, topic) => `${value} registered on above:9464${topic ? ` for topic ${topic}` : ''}, above 90% of ${cap} (the default cap; this rule's figure if yours differs). At the cap the library refuses to register more (LimitError LIMIT_REACHED): a broker that goes on counts nothing of what it refused, and no metric shows it. Look for names that should not be distinct (a topic or group per device, per session or per message), remove what is no longer used (removeTopic(), removeGroup(); the aedes example's \`idle\`), or raise the cap.`
    const firing = (value, cap, topic) => `          - exp_labels: { severity: warning, job: mq, instance: 'above:9464', cap: ${cap}${topic ? `, topic: ${topic}` : ''} }
            exp_annotations:
              summary: ${JSON.stringify(`above:9464 is near its ${cap}${topic ? ` on topic ${topic}` : ''}`)}
              description: ${JSON.stringify(description(value, cap, topic))}`
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'mq-cap-rule-'))
    t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }))
    fs.writeFileSync(path.join(dir, 'cap.yml'), `groups:\n  - name: cap\n    rules:\n${rule.replace(`0.9 * ${defaults.max_topics}`, `0.9 * ${TOPICS}`)}\n`)
    const run = (name, input, tests) => {
      fs.writeFileSync(path.join(dir, name), `rule_files: [cap.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
${input}
    alert_rule_test:
${tests}
`)
      const r = spawnSync(bin, ['test', 'rules', name], { cwd: dir, encoding: 'utf8', timeout: 120_000 })
      return { status: r.status, output: `${r.stdout}${r.stderr}`.slice(0, 4000) }
    }
    let r = run('at.test.yml', series(lines('at:9464', 0)), [4, 6, 12].map((m) => `      - { eval_time: ${m}m, alertname: MqNearCardinalityCap, exp_alerts: [] }`).join('\n'))
    t.equal(r.status, 0, 'broker at (900 topics, 230 groups, 3,686 partitions): quiet (promtool test rules)', { output: r.output })
    const above = lines('above:9464', 1)
    t.equal([...above.keys()].filter((k) => k.startsWith('mq_topic')).length, 901, 'broker above has 901 topics in /metrics')
    r = run('above.test.yml', series(above), `      - { eval_time: 4m, alertname: MqNearCardinalityCap, exp_alerts: [] }
      - eval_time: 6m
        alertname: MqNearCardinalityCap
        exp_alerts:
${firing(901, 'max_topics')}
${firing(231, 'max_groups_per_topic', 'fan')}
${firing(3687, 'max_partitions_per_topic', 'wide')}
      - eval_time: 12m
        alertname: MqNearCardinalityCap
        exp_alerts:
${firing(231, 'max_groups_per_topic', 'fan')}
${firing(3687, 'max_partitions_per_topic', 'wide')}`)
    t.equal(r.status, 0, 'broker above (901, 231, 3,687): quiet within the 5 minutes, then firing for each cap, the topics one resolved once its topics went (promtool test rules)', { output: r.output })
  })
}
