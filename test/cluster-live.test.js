'use strict'
// The cluster on a real Prometheus (docs/cluster.md): the 3-node demo (partition scenario), a
// Prometheus scraping its three targets with prometheus/mq-alerts.yml and mq-cluster.rules.yml
// loaded. Every rule evaluates without error and every recording rule has data; every panel
// query of grafana/mq-cluster.json returns data; the dashboard's variables resolve. The
// dashboard's structure is checked without Prometheus too. Without prometheus the live part is
// skipped locally and fails in CI, which installs it.
const t = require('tap')
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const net = require('node:net')
const { spawn, spawnSync } = require('node:child_process')

const root = path.join(__dirname, '..')
const dashboard = JSON.parse(fs.readFileSync(path.join(root, 'grafana', 'mq-cluster.json'), 'utf8'))
const PROMETHEUS = process.env.PROMETHEUS || 'prometheus'
const JOB = 'mq'
const { sleep, waitFor } = require('./helpers')
const targetsOf = (d) => d.panels.flatMap((p) => p.targets.map((x) => ({ panel: p.title, expr: x.expr })))
/** What Grafana puts in place of the variables, for a query through Prometheus' API. */
const substitute = (expr) => expr.replaceAll('$__rate_interval', '1m').replaceAll('$max_in_flight', '10000').replaceAll('$instance', '.*').replaceAll('$job', JOB).replaceAll('$cluster', '').replaceAll('$namespace', '') // no such labels: Grafana's None is ''

t.test('the dashboard imports as is: an input datasource, variables that resolve, a query and a datasource on every panel', async (t) => {
  t.match(dashboard.__inputs, [{ name: 'DS_PROMETHEUS', type: 'datasource', pluginId: 'prometheus' }])
  const variables = dashboard.templating.list.map((v) => v.name)
  t.same(variables, ['cluster', 'namespace', 'job', 'instance', 'max_in_flight'])
  for (const p of dashboard.panels) for (const x of p.targets) t.match(x.expr, /cluster=~"\$cluster", namespace=~"\$namespace", job="\$job"/, `${p.title}: one cluster, by the labels that name it`)
  const ids = new Set()
  for (const p of dashboard.panels) {
    t.ok(!ids.has(p.id), `panel ids are unique (${p.id})`)
    ids.add(p.id)
    t.same(p.datasource, { type: 'prometheus', uid: '${DS_PROMETHEUS}' }, `${p.title}: the input datasource`)
    t.ok(p.targets.length > 0 && p.targets.every((x) => typeof x.expr === 'string' && x.expr !== '' && x.datasource?.uid === '${DS_PROMETHEUS}'), `${p.title}: every target has a query and the datasource`)
    t.match(p.gridPos, { x: Number, y: Number, w: Number, h: Number })
    for (const x of p.targets) {
      for (const [, name] of x.expr.matchAll(/\$(\w+)/g)) t.ok(name === '__rate_interval' || variables.includes(name), `${p.title}: $${name} is a dashboard variable or Grafana's`)
      t.notMatch(substitute(x.expr), /\$/, `${p.title}: nothing left to substitute`)
    }
  }
  for (const v of dashboard.templating.list.filter((x) => x.type === 'query')) t.same(v.datasource, { type: 'prometheus', uid: '${DS_PROMETHEUS}' }, `variable ${v.name}: the input datasource`)
  const titles = dashboard.panels.map((p) => p.title).join('\n')
  for (const expected of [/Quorum state per node/, /Leader epoch/, /leaders/, /Produce rate/, /Deliver rate/, /Drop and DLQ/, /Lag by group/, /In flight by group, against max_in_flight/, /latency p50 \/ p90 \/ p99/, /conservation/]) t.match(titles, expected)
})

const probe = spawnSync(PROMETHEUS, ['--version'], { encoding: 'utf8' })
const missing = probe.error && probe.error.code === 'ENOENT'
const inCI = Boolean(process.env.CI) && !/^(0|false)$/i.test(process.env.CI)
if (missing && inCI) t.fail(`${PROMETHEUS} is not on PATH, but CI must have it`)
else if (missing) t.comment(`${PROMETHEUS} not found: the live cluster test is skipped`)
else t.test('a real Prometheus evaluates every cluster rule and every dashboard query with data', { timeout: 120_000 }, live)

function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer()
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => { const { port } = server.address(); server.close(() => resolve(port)) })
  })
}


async function live(t) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'mq-cluster-'))
  const children = []
  let demoOut = ''
  t.teardown(async () => {
    for (const child of children) if (child.exitCode === null) child.kill('SIGKILL')
    await sleep(100)
    fs.rmSync(dir, { recursive: true, force: true })
  })
  const demo = spawn(process.execPath, [path.join(root, 'dist', 'demo', 'demo.js'), '--nodes', '3', '--port', '0', '--scenario', 'partition', '--phase', '2', '--rate', '300', '--duration', '110'], { stdio: ['ignore', 'pipe', 'pipe'] })
  children.push(demo)
  demo.stdout.on('data', (d) => (demoOut += d))
  demo.stderr.on('data', (d) => (demoOut += d))
  const targets = await waitFor(() => /targets: \[(.+)\]/.exec(demoOut)?.[1].split(', ').map((x) => x.slice(1, -1)), 20_000, 50)
  if (!t.ok(targets, 'the demo printed its scrape targets', { output: demoOut })) return
  t.equal(targets.length, 3)

  const port = await freePort()
  const config = path.join(dir, 'prometheus.yml')
  fs.writeFileSync(config, JSON.stringify({
    global: { scrape_interval: '500ms', scrape_timeout: '500ms', evaluation_interval: '500ms' },
    rule_files: [path.join(root, 'prometheus', 'mq-alerts.yml'), path.join(root, 'prometheus', 'mq-cluster.rules.yml')],
    // Each node in a zone of its own, as file_sd or Kubernetes relabelling labels a target: the
    // cluster rules must aggregate that label away with `instance` (docs/cluster.md, Labels).
    scrape_configs: [{ job_name: JOB, static_configs: targets.map((x, i) => ({ targets: [x], labels: { zone: `zone-${i}` } })) }],
  }))
  const log = path.join(dir, 'prometheus.log')
  const fd = fs.openSync(log, 'w')
  const prom = spawn(PROMETHEUS, [`--config.file=${config}`, `--storage.tsdb.path=${path.join(dir, 'data')}`, `--web.listen-address=127.0.0.1:${port}`], { stdio: ['ignore', fd, fd] })
  fs.closeSync(fd)
  children.push(prom)
  const api = `http://127.0.0.1:${port}/api/v1`
  const get = async (url) => (await fetch(url, { signal: AbortSignal.timeout(3000) })).json()
  const query = async (expr) => {
    const r = await get(`${api}/query?${new URLSearchParams({ query: expr })}`)
    if (r.status !== 'success') throw new Error(`${expr}: ${JSON.stringify(r)}`)
    return r.data.result
  }
  const ready = await waitFor(async () => (await fetch(`http://127.0.0.1:${port}/-/ready`)).status === 200, 30_000)
  if (!t.ok(ready, 'Prometheus is ready', { log: fs.readFileSync(log, 'utf8').slice(-3000) })) return

  // The partition: a node went read_only and a new leader was elected (epoch 2), seen by the rules.
  const moved = await waitFor(async () => {
    const up = await query(`sum(up{job="${JOB}"})`)
    const cut = await query('max_over_time(job:mq_nodes_read_only:count[5m])')
    const epoch = await query('job:mq_leader_epoch:max')
    return Number(up[0]?.value[1]) === 3 && Number(cut[0]?.value[1]) >= 1 && Number(epoch[0]?.value[1]) >= 2
  }, 60_000, 500)
  t.ok(moved, 'Prometheus saw the three nodes up, one of them read_only, and a new epoch', { demo: demoOut.slice(-2000) })
  await sleep(1500) // rate() windows fill (three scrapes)

  const groups = (await get(`${api}/rules`)).data.groups
  const rules = groups.flatMap((g) => g.rules)
  t.ok(rules.length >= 29, `both rule files are loaded (${rules.length} rules)`)
  t.same(rules.filter((r) => r.health !== 'ok').map((r) => `${r.name}: ${r.lastError}`), [], 'every rule evaluates without error')
  for (const r of rules.filter((x) => x.type === 'recording' && x.name.includes(':mq_'))) {
    const series = await query(r.name)
    t.ok(series.length > 0, `recording rule ${r.name} has data`)
    if (r.name.startsWith('job')) t.same(series.filter((x) => 'zone' in x.metric || 'instance' in x.metric).map((x) => x.metric), [], `${r.name} keeps no label of one node`)
  }
  t.equal((await query('job:mq_quorum_state:max')).length, 1, 'one cluster, one series')
  t.same((await query('ALERTS{alertname=~"MqClusterTwoLeaders|MqClusterConservationBroken|MqClusterEpochDecreased|MqConservationBroken",alertstate="firing"}')).map((a) => a.metric.alertname), [], 'no alert that means a bug fires')

  for (const { panel, expr } of targetsOf(dashboard)) {
    const result = await query(substitute(expr)).catch((error) => ({ error: error.message }))
    t.ok(Array.isArray(result) && result.length > 0, `panel "${panel}": ${substitute(expr)} returns data`, { result })
  }
  for (const label of ['cluster', 'namespace']) {
    const values = (await get(`${api}/label/${label}/values?${new URLSearchParams({ 'match[]': 'job:mq_quorum_state:max' })}`)).data
    t.same(values, [], `variable ${label} has no value (Grafana's None, matching series without the label)`)
  }
  const jobs = (await get(`${api}/label/job/values?${new URLSearchParams({ 'match[]': 'job:mq_quorum_state:max{cluster="", namespace=""}' })}`)).data
  t.same(jobs, [JOB], 'variable job resolves: label_values(job:mq_quorum_state:max{cluster="", namespace=""}, job)')
  const queries = dashboard.templating.list.filter((v) => v.type === 'query').map((v) => v.query.query)
  t.same(queries.slice(0, 3), ['label_values(job:mq_quorum_state:max, cluster)', 'label_values(job:mq_quorum_state:max{cluster=~"$cluster"}, namespace)', 'label_values(job:mq_quorum_state:max{cluster=~"$cluster", namespace=~"$namespace"}, job)'], 'the variables checked above are the dashboard\'s')
  const instances = (await get(`${api}/label/instance/values?${new URLSearchParams({ 'match[]': `mq_quorum_state{job="${JOB}"}` })}`)).data
  t.same(instances.sort(), [...targets].sort(), 'variable instance resolves to the three nodes')
}
