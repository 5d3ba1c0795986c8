'use strict'
// The cluster rules (prometheus/mq-cluster.rules.yml, beside mq-alerts.yml) against the library's
// own /metrics, not hand-written series: each node of a simulated cluster is a surface of this
// process, driven second by second (leadership, quorum, epochs, traffic), and scraped as
// Prometheus scrapes a cluster — each target on its own phase of the interval, `up` 0 and its
// series marked stale when it is down. promtool then evaluates the shipped rules over the samples.
// Each case is one an SRE meets (a failover, a lull at night with a node down, a morning ramp, a
// wide topic falling behind); the rules before 2026-11-27 fired on the honest ones (see below).
const t = require('tap')
require('./helpers') // children spawned here start without tap's hooks (see helpers.js)
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { spawnSync } = require('node:child_process')
const { surfaceOn, backends, promtoolFor } = require('./helpers')

const backend = backends().at(-1) // native when built: the rules are the subject here, not the backend

const root = path.join(__dirname, '..')
const bin = promtoolFor(t)
if (bin !== undefined) main()

/**
 * A simulated cluster: `nodes` ids, `seconds` of simulated time, samples every `step` seconds
 * (the promtool input's interval), each node scraped every `interval` s from its `phase`.
 * `second(t, cluster)` makes second t's calls; `fails(id, t)` true: that scrape fails (`up` 0, the
 * node's series marked stale, as for a node down). Returns promtool's input_series lines.
 */
function simulate(t, { nodes, seconds, step = 15, interval = 60, phase = {}, second, fails = () => false }) {
  const cluster = {
    node: {},
    boot(id, config) {
      const surface = surfaceOn(t, backend, config, { scrapeThread: false })
      surface.on('fault', () => {}) // a read_only leader's refused writes raise faults: the subject here is the rules
      cluster.node[id] = { surface, bootedAt: now }
      return cluster.node[id]
    },
    kill(id) {
      cluster.node[id].surface.close()
      cluster.node[id] = undefined
    },
  }
  let now = 0
  const series = new Map() // 'name{labels}' → a value per step ('_': none)
  const last = new Map() // node id → the keys of its previous scrape
  const put = (key, at, value) => {
    if (!series.has(key)) series.set(key, [])
    const values = series.get(key)
    while (values.length < at) values.push('_')
    values[at] = value
  }
  const scrape = (id, at) => {
    const node = fails(id, now) ? undefined : cluster.node[id]
    const before = last.get(id) ?? new Set()
    const seen = new Set()
    put(`up{job="mq",instance="${id}"}`, at, node === undefined ? '0' : '1')
    if (node !== undefined) {
      for (const line of node.surface.render().split('\n')) {
        const m = /^(mq_[a-z_]+)(?:\{(.*)\})? (\S+)$/.exec(line)
        if (m === null || m[1] === 'mq_e2e_latency_ms') continue
        const key = `${m[1]}{job="mq",instance="${id}"${m[2] ? ',' + m[2] : ''}}`
        put(key, at, m[1] === 'mq_broker_uptime_seconds' ? String(now - node.bootedAt) : m[3]) // simulated time, not this process's
        seen.add(key)
      }
    }
    for (const key of before) if (!seen.has(key)) put(key, at, 'stale') // as Prometheus marks a series gone, or a target down
    last.set(id, seen)
  }
  for (now = 0; now < seconds; now++) {
    second(now, cluster)
    if (now % step !== 0) continue
    for (const id of nodes) if (now >= (phase[id] ?? 0) && (now - (phase[id] ?? 0)) % interval === 0) scrape(id, now / step)
  }
  return [...series].map(([key, values]) => `      - series: '${key}'\n        values: '${values.join(' ')}'`)
}

/** promtool test rules over `input`: each expectation an expression, a time and the samples it must give. */
function check(t, name, { input, step = 15, evaluation = '15s', tests }) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'mq-cluster-rules-'))
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }))
  const file = path.join(dir, 'cluster.test.yml')
  const rules = ['mq-alerts.yml', 'mq-cluster.rules.yml'].map((f) => JSON.stringify(path.join(root, 'prometheus', f)))
  fs.writeFileSync(file, `rule_files: [${rules.join(', ')}]
evaluation_interval: ${evaluation}
tests:
  - name: ${JSON.stringify(name)}
    interval: ${step}s
    input_series:
${input.join('\n')}
    promql_expr_test:
${tests.map(({ expr, at, samples }) => `      - expr: '${expr}'
        eval_time: ${at}
        exp_samples: [${samples.map((labels) => `{ labels: '${labels}', value: 1 }`).join(', ')}]`).join('\n')}
`)
  const r = spawnSync(bin, ['test', 'rules', file], { cwd: dir, encoding: 'utf8', timeout: 120_000 })
  t.equal(r.status, 0, `promtool test rules: ${name}`, { output: `${r.stdout}${r.stderr}` })
}

/** Every alert of `names` that fired at some point in the `window` before `at`, by alertname and the labels in `by`. */
function fired(names, window, by = '') {
  return `max by (alertname${by}) (max_over_time(ALERTS{alertstate="firing",alertname=~"${names}"}[${window}]))`
}

function main() {
  // The leader `a` is cut off at 31m40s (read_only: 1 of 3 in sync), 10 s after a scrape of
  // it; `b` is elected at once (epoch 2) and leads; the cut heals at 61m40s and `a` follows (its
  // topic leaves). Scraped every 2 minutes, each node on its own phase: `a`'s next scrape still
  // shows the writes of its last 10 s, so it counts as leading until the one after, beside `b`
  // (counted from its second scrape since the election) for 100 s.
  // MqClusterTwoLeaders (for 1m) fired on it; there was one leader at every instant.
  t.test('a failover scraped every 2 minutes is not split brain, and no moment without a leader', async (t) => {
    const input = simulate(t, {
      nodes: ['a', 'b', 'c'], seconds: 75 * 60, step: 10, interval: 120, phase: { a: 90, b: 110, c: 50 },
      second(now, cluster) {
        if (now === 0) {
          for (const id of ['a', 'b', 'c']) cluster.boot(id).surface.setLeaderEpoch(1)
          cluster.node.a.surface.topic('orders')
        }
        if (now === 1900) {
          cluster.node.a.surface.replicationRound({ replicas: 3, inSync: 1 }) // cut off: read_only
          cluster.node.b.surface.setLeaderEpoch(2)
          cluster.node.c.surface.setLeaderEpoch(2)
          cluster.node.b.surface.topic('orders')
        }
        if (now === 3700) {
          cluster.node.a.surface.replicationRound({ replicas: 3, inSync: 3 })
          cluster.node.a.surface.setLeaderEpoch(2)
          cluster.node.a.surface.removeTopic('orders') // a follower serves no topics
        }
        const leader = now < 1900 ? cluster.node.a : cluster.node.b
        leader.surface.topic('orders').append(0, 100, 20)
      },
    })
    check(t, 'failover at a 2-minute scrape interval', {
      input, step: 10,
      tests: [
        { expr: fired('MqClusterTwoLeaders|MqClusterNoLeader', '74m'), at: '74m', samples: [] },
        { expr: fired('MqClusterNodeReadOnly', '74m', ', instance'), at: '74m', samples: ['{alertname="MqClusterNodeReadOnly",instance="a"}'] },
      ],
    })
  })

  // Split brain scraped every 2 minutes: `b` takes writes too from 10m to 20m, at epoch 2 while
  // `a` stays at 1. Held for 3 minutes, MqClusterTwoLeaders still fires for it.
  t.test('split brain scraped every 2 minutes fires MqClusterTwoLeaders', async (t) => {
    const input = simulate(t, {
      nodes: ['a', 'b'], seconds: 30 * 60, step: 10, interval: 120, phase: { a: 90, b: 110 },
      second(now, cluster) {
        if (now === 0) {
          for (const id of ['a', 'b']) cluster.boot(id).surface.setLeaderEpoch(1)
          cluster.node.a.surface.topic('orders')
        }
        if (now === 600) (cluster.node.b.surface.setLeaderEpoch(2), cluster.node.b.surface.topic('orders'))
        cluster.node.a.surface.topic('orders').append(0, 100, 20)
        if (now >= 600 && now < 1200) cluster.node.b.surface.topic('orders').append(0, 100, 20)
      },
    })
    check(t, 'split brain at a 2-minute scrape interval', {
      input, step: 10,
      tests: [
        { expr: fired('MqClusterTwoLeaders', '29m'), at: '29m', samples: ['{alertname="MqClusterTwoLeaders"}'] },
        { expr: fired('MqClusterTwoLeaders', '9m'), at: '9m', samples: [] },
      ],
    })
  })

  // A split brain at one epoch: `b` takes writes beside `a` from 10m, neither told of a new epoch
  // (MqClusterEpochsDisagree cannot fire), and each writes a burst every 4 minutes, 2 minutes
  // apart. Neither counts as leading at the other's scrapes, so the count of nodes taking writes
  // never reaches 2 (the rule's first condition alone pages no one); both serve topics while
  // writable throughout, which a follower never does.
  t.test('a split brain at one epoch between leaders that write in bursts fires MqClusterTwoLeaders, a scrape of the stale one failing now and then too', async (t) => {
    for (const [name, fails] of [['every scrape answered', () => false], ['one scrape of b in 7 fails', (id, now) => id === 'b' && Math.floor((now - 15) / 60) % 7 === 3]]) {
      const input = simulate(t, {
        nodes: ['a', 'b', 'c'], seconds: 40 * 60, interval: 60, phase: { a: 0, b: 15, c: 30 }, fails,
        second(now, cluster) {
          if (now === 0) {
            for (const id of ['a', 'b', 'c']) cluster.boot(id).surface.setLeaderEpoch(1)
            cluster.node.a.surface.topic('orders')
          }
          if (now === 600) cluster.node.b.surface.topic('orders')
          if (now % 240 === 5) cluster.node.a.surface.topic('orders').append(0, 100, 500)
          if (now >= 600 && now % 240 === 125) cluster.node.b.surface.topic('orders').append(0, 100, 500)
        },
      })
      check(t, `a split brain at one epoch, bursty: ${name}`, {
        input,
        tests: [
          { expr: fired('MqClusterTwoLeaders', '9m'), at: '9m', samples: [] },
          { expr: 'max_over_time(job:mq_nodes_leading:count[29m])', at: '39m', samples: ['{job="mq"}'] },
          { expr: fired('MqClusterTwoLeaders', '20m'), at: '30m', samples: ['{alertname="MqClusterTwoLeaders"}'] },
        ],
      })
    }
  })

  // Night traffic, one message every 4 minutes, while follower `c` is down for maintenance
  // (20m to 50m; `a` and `b` soft meanwhile). The leader is there and writable, its producers
  // merely quiet: MqClusterNoLeader (critical) paged on and off for this. Then, as a control,
  // the leader dies at 60m and nobody is elected: that is no leader.
  t.test('a lull at night with a follower down has a leader; a leader that dies with no successor does not', async (t) => {
    const input = simulate(t, {
      nodes: ['a', 'b', 'c'], seconds: 80 * 60, interval: 60, phase: { a: 0, b: 15, c: 30 },
      second(now, cluster) {
        if (now === 0) {
          for (const id of ['a', 'b', 'c']) cluster.boot(id).surface.setLeaderEpoch(1)
          cluster.node.a.surface.topic('orders')
        }
        const soft = (inSync) => { for (const id of ['a', 'b']) cluster.node[id]?.surface.replicationRound({ replicas: 3, inSync }) }
        if (now === 1200) (cluster.kill('c'), soft(2))
        if (now === 3000) (cluster.boot('c').surface.setLeaderEpoch(1), soft(3))
        if (now === 3600) (cluster.kill('a'), cluster.node.b.surface.replicationRound({ replicas: 3, inSync: 2 }), cluster.node.c.surface.replicationRound({ replicas: 3, inSync: 2 }))
        if (cluster.node.a !== undefined && now % 240 === 0) cluster.node.a.surface.topic('orders').append(0, 100, 1)
      },
    })
    check(t, 'a lull at night, then a leader lost', {
      input,
      tests: [
        { expr: fired('MqClusterNoLeader|MqClusterTwoLeaders', '59m'), at: '59m', samples: [] },
        { expr: fired('MqClusterNoLeader', '19m'), at: '78m', samples: ['{alertname="MqClusterNoLeader"}'] },
      ],
    })
  })

  // One node, 2 hours. `ramp`: its load climbs from 5 to 200 messages/s (a morning), and
  // `billing` keeps up, settling each message 5 s after it is appended (lag = rate × 5 s: it
  // grows with the load). `wide`: 16 partitions, 400 messages/s, and `slow` settles 99% of
  // what is produced, in order (its backlog grows by 4 messages a second). MqClusterGroupLagGrowing
  // must fire for `slow` and never for `billing`: the rule before 2026-11-27 fired for
  // `billing`, and its first fix (a second of the whole topic's production) missed `slow`.
  t.test('MqClusterGroupLagGrowing: quiet for a group that keeps up with a rising load, firing for one that falls behind on a wide topic', async (t) => {
    const SECONDS = 120 * 60
    const PARTITIONS = 16
    let ramp, billing, wide, slow
    const appended = new Array(PARTITIONS).fill(0)
    const owed = new Array(PARTITIONS).fill(0) // what slow has still to settle, by partition
    const rampSeqs = [] // [second, last seq appended that second]
    let carry = 0
    const input = simulate(t, {
      nodes: ['a'], seconds: SECONDS, interval: 30,
      second(now, cluster) {
        if (now === 0) {
          const a = cluster.boot('a')
          a.surface.setLeaderEpoch(1)
          ramp = a.surface.topic('ramp')
          billing = ramp.group('billing', { settle_window: 4096 })
          wide = a.surface.topic('wide')
          slow = wide.group('slow')
        }
        const rate = 5 + (195 * now) / SECONDS
        carry += rate
        const n = Math.floor(carry)
        carry -= n
        if (n > 0) rampSeqs.push([now, ramp.append(0, 100, n)])
        while (rampSeqs.length > 0 && rampSeqs[0][0] <= now - 5) billing.settleUpTo(0, rampSeqs.shift()[1], 'delivered')
        for (let p = 0; p < PARTITIONS; p++) {
          appended[p] = wide.append(p, 100, 25)
          owed[p] += 25
          const settle = now % 4 === 0 ? 24 : 25 // 99 of every 100
          owed[p] -= settle
          slow.settleUpTo(p, appended[p] - owed[p], 'delivered')
        }
      },
    })
    check(t, 'a rising load, a wide topic falling behind', {
      input,
      tests: [
        { expr: fired('MqClusterGroupLagGrowing', '119m', ', group'), at: '119m', samples: ['{alertname="MqClusterGroupLagGrowing",group="slow"}'] },
        { expr: fired('MqClusterGroupLagGrowing', '15m', ', group'), at: '119m', samples: ['{alertname="MqClusterGroupLagGrowing",group="slow"}'] },
      ],
    })
  })

  // One node, 3 hours: 100 messages/s, and a batch of 20,000 more (over a minute) every 20
  // minutes; `export` settles up to 119.6 a second, so each batch's backlog is drained within 17
  // minutes and the lag is back near 0 before the next. It keeps up: MqClusterGroupLagGrowing must
  // never fire. Judged by one sample every 15 minutes, the lag read 50 → 4,755 → 10,638 at minutes
  // 38, 53 and 68 (the 15 minutes aliasing against the 20), and the rule paged for 4 minutes of
  // every cycle (an SRE's replay, 2026-11-29).
  t.test('MqClusterGroupLagGrowing: quiet for a group that drains a batch every 20 minutes', async (t) => {
    const SECONDS = 180 * 60
    const CAPACITY = 100 + 20000 / (0.85 * 20 * 60)
    let topic, group
    let carry = 0
    let last = 0
    let settled = 0
    const input = simulate(t, {
      nodes: ['a'], seconds: SECONDS, interval: 30,
      second(now, cluster) {
        if (now === 0) {
          const a = cluster.boot('a')
          a.surface.setLeaderEpoch(1)
          topic = a.surface.topic('batch')
          group = topic.group('export')
        }
        carry += 100 + (now % 1200 < 60 ? 20000 / 60 : 0)
        const n = Math.floor(carry)
        carry -= n
        if (n > 0) last = topic.append(0, 100, n)
        settled = Math.min(last, settled + CAPACITY)
        if (Math.floor(settled) > group.floor(0)) group.settleUpTo(0, Math.floor(settled), 'delivered')
      },
    })
    check(t, 'a batch every 20 minutes, drained each time', {
      input,
      tests: [
        // the lag is periodic: its highest over a cycle is the same an hour apart, and it comes back near 0
        { expr: 'abs(max_over_time(job_topic_group:mq_group_lag:max[20m]) - max_over_time(job_topic_group:mq_group_lag:max[20m] offset 1h)) < bool 500', at: '179m', samples: ['{group="export",job="mq",topic="batch"}'] },
        { expr: 'min_over_time(job_topic_group:mq_group_lag:max[20m]) < bool 200', at: '179m', samples: ['{group="export",job="mq",topic="batch"}'] },
        { expr: fired('MqClusterGroupLagGrowing', '179m', ', group'), at: '179m', samples: [] },
      ],
    })
  })

  // The dashboard's rates by topic (grafana/mq-cluster.json), as Grafana sends them (its rate
  // interval at a 15 s scrape: 1m). The recorded 5-minute rates they would read otherwise go on
  // showing a topic's traffic for 5 minutes after its writes stop.
  t.test("the dashboard's rates by topic show writes that stop within a rate interval, and the recorded rates where Prometheus holds only those", async (t) => {
    const dashboard = JSON.parse(fs.readFileSync(path.join(root, 'grafana', 'mq-cluster.json'), 'utf8'))
    const panel = (title) => dashboard.panels.find((p) => p.title === title).targets.map((x) => x.expr.replaceAll('$__rate_interval', '1m').replaceAll('$cluster', '').replaceAll('$namespace', '').replaceAll('$job', 'mq').replaceAll('$instance', '.*'))
    const [produced] = panel('Produce rate by topic')
    const [delivered] = panel('Deliver rate by topic')
    t.match(produced, /mq_topic_messages_produced_total/)
    // `a` leads and writes 20 messages/s to `paused`, whose producers stop at 20m, and to
    // `orders`, delivered to one group, until it dies at 30m; `b` then leads (epoch 2).
    const input = simulate(t, {
      nodes: ['a', 'b', 'c'], seconds: 40 * 60, step: 5, interval: 15, phase: { b: 5, c: 10 },
      second(now, cluster) {
        if (now === 0) for (const id of ['a', 'b', 'c']) cluster.boot(id).surface.setLeaderEpoch(1)
        if (now === 30 * 60) {
          cluster.kill('a')
          for (const id of ['b', 'c']) cluster.node[id].surface.setLeaderEpoch(2)
        }
        const leader = now < 30 * 60 ? cluster.node.a : cluster.node.b
        if (now < 20 * 60) leader.surface.topic('paused').append(0, 100, 20)
        const g = leader.surface.topic('orders').group('billing', { settle_window: 4096 })
        const seq = leader.surface.topic('orders').append(0, 100, 20)
        if (now >= 30 * 60 + 60) g.settleUpTo(0, seq, 'delivered') // b's consumers catch up after a minute
      },
    })
    const is = (expr, test) => `(${expr}) ${test}`
    check(t, "the dashboard's rates by topic", {
      input, step: 5,
      tests: [
        { expr: is(produced, '> bool 19'), at: '15m', samples: ['{job="mq",topic="orders"}', '{job="mq",topic="paused"}'] },
        // 90 s after `paused` stopped: 0 on the panel, while the recorded rate still shows traffic.
        { expr: is(produced, '== bool 0') + ' and on (topic) {topic="paused"}', at: '21m30s', samples: ['{job="mq",topic="paused"}'] },
        { expr: 'job_topic:mq_topic_messages_produced:rate5m{topic="paused"} > bool 5', at: '21m30s', samples: ['{job="mq",topic="paused"}'] },
        // 90 s after `a` died: the new leader's rate.
        { expr: is(produced, '> bool 19'), at: '31m30s', samples: ['{job="mq",topic="orders"}'] },
        { expr: is(produced, '< bool 21'), at: '31m30s', samples: ['{job="mq",topic="orders"}'] },
        { expr: is(delivered, '> bool 0'), at: '35m', samples: ['{job="mq",topic="orders"}'] },
      ],
    })
    // Scraped every minute, Grafana's data source left at its 15 s default: a 1m rate interval
    // holds one sample between two scrapes, and the panels read 5-minute rates, not nothing
    // (the per-node produce rate and the retries by group read nothing until 2026-11-29: an
    // SRE's probe). `retried`: 2 messages a second, each sent twice.
    const [perNode] = panel('Produce rate per node')
    const [retries] = panel('Retries by group')
    const minutely = simulate(t, {
      nodes: ['a', 'b'], seconds: 20 * 60, interval: 60, phase: { b: 30 },
      second(now, cluster) {
        if (now === 0) for (const id of ['a', 'b']) cluster.boot(id).surface.setLeaderEpoch(1)
        cluster.node.a.surface.topic('orders').append(0, 100, 20)
        const retried = cluster.node.a.surface.topic('retried')
        const g = retried.group('billing')
        for (let i = 0; i < 2; i++) {
          const seq = retried.append(0, 100)
          g.send(0, seq)
          g.redeliver(0, seq)
          g.settle(0, seq, 'delivered')
        }
      },
    })
    check(t, "the dashboard's rates at a 1-minute scrape interval", {
      input: minutely,
      tests: [
        { expr: is(produced, '> bool 19') + ' and on (topic) {topic="orders"}', at: '15m30s', samples: ['{job="mq",topic="orders"}'] },
        { expr: is(produced, '< bool 21') + ' and on (topic) {topic="orders"}', at: '15m30s', samples: ['{job="mq",topic="orders"}'] },
        { expr: is(produced, '> bool 1.9') + ' and on (topic) {topic="retried"}', at: '15m30s', samples: ['{job="mq",topic="retried"}'] },
        { expr: is(perNode, '> bool 21.5') + ' and ' + is(perNode, '< bool 22.5'), at: '15m30s', samples: ['{instance="a",job="mq"}'] },
        { expr: is(retries, '> bool 1.9') + ' and ' + is(retries, '< bool 2.1'), at: '15m30s', samples: ['{group="billing",topic="retried"}'] },
      ],
    })
    // A global Prometheus that federates only the recorded series: the panels read those.
    const recorded = ['produced', 'delivered'].map((f) => `      - series: 'job_topic:mq_topic_messages_${f}:rate5m{job="mq",topic="orders"}'\n        values: '5+0x20'`)
    check(t, "the dashboard's rates by topic on the recorded series alone", {
      input: recorded,
      tests: [
        { expr: is(produced, '== bool 5'), at: '3m', samples: ['{job="mq",topic="orders"}'] },
        { expr: is(delivered, '== bool 5'), at: '3m', samples: ['{job="mq",topic="orders"}'] },
      ],
    })
  })
}
