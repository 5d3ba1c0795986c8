'use strict'
// mq-stats (design §10) run as a child process against small fake brokers that serve canned /healthz
// and /stats JSON (the end-to-end test against a real surface lives with the surface). Run
// `npx tsc -p tsconfig.json` first: this runs dist/cli/mq-stats.js.
const t = require('tap')
require('./helpers') // children spawned here start without tap's hooks (see helpers.js)
const fs = require('node:fs')
const http = require('node:http')
const os = require('node:os')
const path = require('node:path')
const { execFile, execFileSync, spawn } = require('node:child_process')
const { main, parseExactJSON, formatUptime } = require('../dist/cli/mq-stats.js')

const CLI = path.join(__dirname, '..', 'dist', 'cli', 'mq-stats.js')
const TIERS = ['healthy', 'soft', 'read_only']
const VIEWS = 'topics, partitions, groups, quorum, latency, conservation, faults, collisions, config'

// JSON texts written by hand so that they carry integers JSON.parse would round (2^64 − 1).
const TOPICS = `{"filter":"topics","topics":[
  {"topic":"a.b","label":"a_b","produced":18446744073709551615,"delivered":30,"dropped":4,"dlq":3,"bytes":1152921504606846976,"partitions":2,"groups":2},
  {"topic":"orders\\u001b[2J","label":"orders__2J","produced":5,"delivered":1,"dropped":0,"dlq":0,"bytes":10,"partitions":1,"groups":1}],
  "totals":{"produced":18446744073709551620,"delivered":31,"dropped":4,"dlq":3,"bytes":1152921504606846986}}`
const GROUPS = `{"filter":"groups","groups":[
  {"topic":"a.b","topic_label":"a_b","group":"g.1","label":"g_1","delivered":20,"dropped":3,"dlq":2,"retries":5,"in_flight":2,"max_in_flight":50,"lag":15,"depth":15,"ack_floors":{"0":25,"3":10}},
  {"topic":"orders","topic_label":"orders","group":"billing","label":"billing","delivered":1,"dropped":0,"dlq":0,"retries":0,"in_flight":0,"max_in_flight":1000,"lag":0,"depth":0,"ack_floors":{"1":1}}]}`
const CONSERVATION = `{"filter":"conservation","topics":[
  {"topic":"a.b","label":"a_b","produced":40,"dropped":4,"dlq":3,"dlq_within_dropped":true,"groups":[
    {"group":"g.1","label":"g_1","delivered":20,"dropped":3,"depth":17,"residual":0,"quiet":true}]},
  {"topic":"idle","label":"idle","produced":0,"dropped":0,"dlq":0,"dlq_within_dropped":true,"groups":[]}]}`

/** A fake broker: quorum `state`, optional bearer `token`, optional per-path overrides. */
async function broker(t, { state = 0, epoch = 7, leader = false, connections = 12, uptime = 3723.5, faults = 4, token, override = {}, port = 0 } = {}) {
  const requests = []
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://x')
    requests.push({ url: req.url, authorization: req.headers.authorization })
    const send = (status, text) => {
      res.writeHead(status, { 'content-type': 'application/json' })
      res.end(text)
    }
    if (token !== undefined && req.headers.authorization !== `Bearer ${token}`) {
      return send(401, '{"error":{"code":"UNAUTHORIZED","message":"a bearer token is required"}}')
    }
    const key = url.pathname === '/stats' ? url.searchParams.get('filter') : url.pathname
    if (override[key]) return send(...override[key])
    switch (key) {
      case '/healthz':
        return send(state === 2 ? 503 : 200, JSON.stringify({ status: TIERS[state], quorum_state: state, runbook_level: 2 - state, leader_epoch: epoch, leader, replicas: 3, in_sync: 3 - state, uptime_seconds: uptime, faults }))
      case 'quorum':
        return send(200, JSON.stringify({ filter: 'quorum', quorum_state: state, status: TIERS[state], runbook_level: 2 - state, replicas: 3, in_sync: 3 - state, leader_epoch: epoch, connections, uptime_seconds: uptime }))
      case 'topics':
        return send(200, TOPICS)
      case 'groups':
        return send(200, GROUPS)
      case 'conservation':
        return send(200, CONSERVATION)
      case 'latency':
        return send(200, '{"filter":"latency","enabled":true,"p50":1.5,"p90":4.25,"p99":null,"count":3}')
      default:
        return send(404, '{"error":{"code":"NOT_FOUND","message":"no such path"}}')
    }
  })
  await new Promise((resolve, reject) => {
    server.once('error', reject)
    server.listen(port, '127.0.0.1', resolve)
  })
  t.teardown(() => new Promise((resolve) => server.close(resolve)))
  return { url: `http://127.0.0.1:${server.address().port}`, requests }
}

/** A port nobody listens on: bound, then released. */
/**
 * A port nothing listens on, and nothing will while the test runs: below the range from which the
 * kernel hands out ports to listen(0) (every server of the suite, in every process), so a broker a
 * test starts after it cannot take it (a port taken from that range and closed again could be).
 */
async function closedPort() {
  const [low] = (() => { try { return fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number) } catch { return [32768] } })()
  for (let tries = 0; tries < 100; tries++) {
    const port = 20000 + Math.floor(Math.random() * Math.max(1, Math.min(low, 65536) - 20000))
    const server = http.createServer()
    const free = await new Promise((resolve) => server.once('error', () => resolve(false)).listen(port, '127.0.0.1', () => resolve(true)))
    if (free) await new Promise((resolve) => server.close(resolve))
    if (free) return port
  }
  throw new Error('no closed port found below the ephemeral range')
}

/**
 * The tool in this process: main() with only the environment given (and PATH, as a child would
 * get) and its output captured, as the bin's pipe would show it (not a TTY). What only a real
 * process shows — the bin's exit status, SIGINT, a closed pipe — is tested with the bin itself
 * (`bin()` and the --watch tests below).
 */
async function run(args, env = {}) {
  let stdout = ''
  let stderr = ''
  const io = { stdout: { write: (text) => { stdout += text }, isTTY: false }, stderr: { write: (text) => { stderr += text } } }
  try {
    return { code: await main(args, { PATH: process.env.PATH, ...env }, io), stdout, stderr }
  } catch (error) {
    return { code: 70, stdout, stderr: `${stderr}mq-stats: internal error: ${error.message}\n` }
  }
}

// Async (not execFileSync): the fake brokers live in this process and must keep answering.
function bin(args, env = {}) {
  return new Promise((resolve) => {
    execFile(process.execPath, [CLI, ...args], { timeout: 15_000, env: { PATH: process.env.PATH, ...env } }, (error, stdout, stderr) => {
      resolve({ code: error ? (error.code ?? error.signal) : 0, stdout, stderr })
    })
  })
}

t.test('default view: one row per broker, exact cells', async (t) => {
  const soft = await broker(t, { state: 1 })
  const r = await run(['--url', soft.url])
  t.equal(r.code, 1, 'exit status is the quorum_state (soft)')
  t.equal(r.stderr, '')
  const pad = ' '.repeat(soft.url.length - 3)
  t.equal(r.stdout, [
    `url${pad}  quorum_state  leader_epoch  connections  uptime              produced  delivered  dropped  dlq  faults`,
    `${soft.url}  1 soft                   7           12   1h02m  18446744073709551620         31        4    3       4`,
    '',
  ].join('\n'), 'golden table: number and tier name, totals summed exactly over topics, no colour in a pipe')
  t.notMatch(r.stdout, /\x1b/, 'no ANSI escapes when stdout is not a TTY')
  t.same(soft.requests.map((q) => q.url).sort(), ['/healthz', '/stats?filter=quorum', '/stats?filter=topics'])
})

t.test('exit status is the worst quorum_state over all brokers', async (t) => {
  // One cluster: the first broker named leads, the others follow, at one epoch.
  const servers = new Map()
  const at = async (state, leader) => servers.get(`${state} ${leader}`) ?? servers.set(`${state} ${leader}`, await broker(t, { state, leader })).get(`${state} ${leader}`)
  const by = await Promise.all([0, 1, 2].map((s) => at(s, true)))
  const urls = async (states) => (await Promise.all(states.map((s, i) => at(s, i === 0)))).flatMap((b) => ['--url', b.url])
  const cases = [
    [[0], 0], [[1], 1], [[2], 2],
    [[0, 1], 1], [[1, 0], 1], [[0, 2], 2], [[2, 1], 2],
  ]
  for (const [states, expected] of cases) {
    const r = await run(await urls(states))
    t.equal(r.code, expected, `brokers in states ${states.join(', ')} → exit ${expected}`)
    t.equal(r.stdout.trim().split('\n').filter((line) => line !== '' && !line.startsWith('cluster  ')).length, 1 + states.length, `${states}: one row per broker (and a cluster line for several)`)
  }
  const r = await run(['--url', by[2].url])
  t.match(r.stdout, /  2 read_only  /, '/healthz 503 is a read_only reading, not an error')
  t.equal(r.stderr, '')
  // The bin itself, as a shell sees it: the same status, the same table.
  for (const [states, expected] of [[[0], 0], [[0, 2], 2]]) {
    const real = await bin(await urls(states))
    t.equal(real.code, expected, `the bin: brokers in states ${states.join(', ')} → exit ${expected}`)
    t.equal(real.stdout, (await run(await urls(states))).stdout, 'the bin prints what main() does')
  }
  const unreachable = await bin(['--url', `http://127.0.0.1:${await closedPort()}`])
  t.equal(unreachable.code, 3, 'the bin: an unreachable broker → exit 3')
  t.equal((await bin(['--bogus'])).code, 64, 'the bin: a usage error → exit 64')
})

t.test('exit status 4: several brokers that do not agree on one leader, whatever their tiers', async (t) => {
  const list = (...brokers) => brokers.flatMap((b) => ['--url', typeof b === 'string' ? b : b.url])
  const leader = await broker(t, { epoch: 5, leader: true })
  const follower = await broker(t, { epoch: 5 })
  const dead = `http://127.0.0.1:${await closedPort()}`
  t.equal((await run(list(leader, follower))).code, 0, 'one leader, epochs agree: the tier (0)')
  t.equal((await run(list(follower))).code, 0, 'one follower alone is no cluster: its tier')
  const twin = await broker(t, { epoch: 5, leader: true })
  t.equal((await run(list(leader, follower, twin))).code, 4, 'two leaders at one epoch (split brain)')
  const stale = await broker(t, { state: 2, epoch: 4, leader: true })
  const r = await run(list(leader, follower, stale))
  t.equal(r.code, 4, 'a leader at a lower epoch (cut off, read_only): 4, not its tier 2')
  t.match(r.stdout, /stale leader/)
  const behind = await broker(t, { epoch: 4 })
  t.equal((await run(list(leader, behind))).code, 4, 'a follower told another epoch')
  t.equal((await run(list(follower, await broker(t, { epoch: 5, state: 1 })))).code, 1, 'none leading is no disagreement (brokers that never call setLeader() say they follow): the tier')
  t.equal((await run(list(follower, dead))).code, 3, 'one not read: 3, unreachable')
  t.equal((await run(list(leader, twin, dead))).code, 4, 'two leaders read, one node not read: 4 wins over 3')
  const fresh = await broker(t, { epoch: 0 })
  t.equal((await run(list(fresh, await broker(t, { epoch: 0 })))).code, 0, 'nodes not told an epoch yet (0) disagree with no one')
  t.equal((await run(list(leader, fresh))).code, 0, 'a node not told the epoch yet beside a leader')
  const inView = await run([...list(leader, twin), 'topics'])
  t.equal(inView.code, 4, 'with a VIEW too')
  t.equal(inView.stderr, `mq-stats: the brokers do not agree on one leader: 2 leaders at epoch 5: ${leader.url}, ${twin.url}\n`, 'stderr says why (a view has no cluster line)')
  const json = await run([...list(leader, stale, behind), '--json'])
  t.equal(json.code, 4, 'and with --json')
  t.equal(json.stderr, `mq-stats: the brokers do not agree on one leader: stale leader ${stale.url} (epoch 4); epochs disagree: 5 on 1, 4 on 2\n`)
  t.doesNotThrow(() => JSON.parse(json.stdout), 'stdout stays JSON')
  t.equal((await bin(list(leader, twin))).code, 4, 'the bin')
  // --watch on a terminal: the line comes after each frame's redraw, which would clear it.
  const interrupt = new AbortController()
  const screen = []
  const tty = { isTTY: true, write: (s) => { screen.push(['out', s]); if (screen.filter(([w]) => w === 'out').length === 2) interrupt.abort() } }
  const said = { write: (s) => screen.push(['err', s]) }
  t.equal(await main([...list(leader, twin), '--watch', '0.1', 'quorum'], { NO_COLOR: '1' }, { stdout: tty, stderr: said, signal: interrupt.signal }), 4)
  t.same(screen.map(([w, s]) => (w === 'out' ? (s.startsWith('\x1b[H\x1b[2J') ? 'frame' : 'out') : /do not agree on one leader/.test(s) ? 'why' : s)), ['frame', 'why', 'frame', 'why'], 'each frame, then why')
  // One broker written two ways is one row, not two leaders.
  const loud = leader.url.replace('http://', 'HTTP://')
  const once = await run(['--url', leader.url, '--url', loud, '--url', `${leader.url}/`, '--url', leader.url.replace('http://', 'http://ops:secret@')])
  t.equal(once.code, 0, 'HTTP://host, http://host, http://host/ and http://ops:secret@host are one broker')
  t.equal(once.stdout.split('\n').filter((line) => line.startsWith('http')).length, 1, 'one row')
})

t.test('faults view: a fault\'s raw names, quoted where they hold a space or =', async (t) => {
  const recent = [{ code: 'ALREADY_SETTLED', metric: 'mq_group_lag', labels: { topic: 'a_b', group: 'g_1', partition: '0' }, names: { topic: 'a b', group: 'g=1' }, previous: 1, attempted: 1, at: '2026-11-28T00:00:00.000Z' }]
  const b = await broker(t, { leader: true, override: { faults: [200, JSON.stringify({ filter: 'faults', capacity: 1000, counts: { ALREADY_SETTLED: 1 }, recent, total: 1 })] } })
  const r = await run(['--url', b.url, 'faults'])
  t.equal(r.code, 0, r.stderr)
  t.match(r.stdout, /ALREADY_SETTLED  mq_group_lag  topic=a_b group=g_1 partition=0  topic="a b" group="g=1"  /, 'labels as they are, names quoted: one read, not four')
})

t.test('--json: exact integers, one entry per broker', async (t) => {
  const a = await broker(t, { state: 1 })
  const r = await run(['--url', a.url, '--json'])
  t.equal(r.code, 1)
  t.match(r.stdout, /"produced": 18446744073709551620,/, 'the sum above 2^64 is printed digit for digit')
  const parsed = JSON.parse(r.stdout)
  t.same(Object.keys(parsed[0]), ['url', 'quorum_state', 'status', 'leader', 'leader_epoch', 'connections', 'uptime_seconds', 'produced', 'delivered', 'dropped', 'dlq', 'faults'])
  t.same({ ...parsed[0], produced: 0 }, { url: a.url, quorum_state: 1, status: 'soft', leader: false, leader_epoch: 7, connections: 12, uptime_seconds: 3723.5, produced: 0, delivered: 31, dropped: 4, dlq: 3, faults: 4 })

  const v = await run(['--url', a.url, 'topics', '--json'])
  t.match(v.stdout, /"produced": 18446744073709551615,/, 'a view passes 2^64 − 1 through exactly')
  t.match(v.stdout, /"bytes": 1152921504606846976,/)
  const view = JSON.parse(v.stdout)
  t.equal(view[0].view.filter, 'topics', 'each entry carries its broker\'s /stats body as view')
  t.equal(view[0].view.topics[1].topic, 'orders\u001b[2J', 'raw names survive JSON unchanged')
  t.equal(view[0].quorum_state, 1)
  t.equal(view[0].leader, false, 'a view entry carries the leader flag too')
  const leading = await broker(t, { epoch: 3, leader: true })
  t.same(JSON.parse((await run(['--url', leading.url, '--url', a.url, '--json'])).stdout).map((x) => [x.leader, x.leader_epoch]), [[true, 3], [false, 7]], 'what a script needs to find a stale leader: each node\'s leader flag and epoch')
  const viewed = JSON.parse((await run(['--url', leading.url, '--url', a.url, 'topics', '--json'])).stdout)
  t.same(viewed.map((x) => [x.leader, x.leader_epoch]), [[true, 3], [false, 7]], 'with a VIEW too: each entry carries the epoch from /healthz')
  t.same(Object.keys(viewed[0]), ['url', 'quorum_state', 'status', 'leader', 'leader_epoch', 'view'])
})

t.test('a /stats view as a table', async (t) => {
  const a = await broker(t, { leader: true })
  const groups = await run(['--url', a.url, 'groups'])
  t.equal(groups.code, 0)
  t.equal(groups.stdout, [
    'topic   topic_label  group    label    delivered  dropped  dlq  retries  in_flight  max_in_flight  lag  depth  ack_floors',
    'a.b     a_b          g.1      g_1             20        3    2        5          2             50   15     15  0=25 3=10',
    'orders  orders       billing  billing          1        0    0        0          0           1000    0      0  1=1',
    '',
  ].join('\n'), 'one row per group, numbers right-aligned, ack floors inline')

  const topics = await run(['--url', a.url, 'topics'])
  t.match(topics.stdout, /^topics:\ntopic +label +produced/, 'a view with several parts titles each')
  t.match(topics.stdout, / 18446744073709551615 /, 'exact big integer in the table')
  t.match(topics.stdout, /orders\\u001b\[2J/, 'a control character in a raw name is shown escaped, never sent to the terminal')
  t.match(topics.stdout, /\ntotals:\nkey +value\nproduced +18446744073709551620\n/)

  const conservation = await run(['--url', a.url, 'conservation'])
  t.equal(conservation.stdout, [
    'topic  label  produced  dropped  dlq  dlq_within_dropped  group  group_label  delivered  group_dropped  depth  residual  quiet',
    'a.b    a_b          40        4    3  true                g.1    g_1                 20              3     17         0  true',
    'idle   idle          0        0    0  true                -      -                    -              -      -         -  -',
    '',
  ].join('\n'), 'one row per group; a topic without groups still has its row')

  const latency = await run(['--url', a.url, 'latency'])
  t.equal(latency.stdout, 'key      value\nenabled  true\np50      1.5\np90      4.25\np99      -\ncount    3\n', 'a scalar view as key/value rows')

  const b = await broker(t, { state: 1 })
  const two = await run(['--url', a.url, '--url', b.url, 'latency'])
  t.equal(two.code, 1)
  t.match(two.stdout, new RegExp(`^== ${a.url} \\(quorum_state 0 healthy\\) ==\\n`), 'several brokers: one titled section each')
  t.match(two.stdout, new RegExp(`\\n== ${b.url} \\(quorum_state 1 soft\\) ==\\n`))
})

t.test('the quorum view names the replicas out of sync that the broker gave (a real surface)', async (t) => {
  const { surfaceOn, backends } = require('./helpers')
  const surface = surfaceOn(t, backends().at(-1))
  const { url } = await surface.listen({ port: 0, host: '127.0.0.1' })
  const lagging = async () => /^lagging +(.*)$/m.exec((await run(['--url', url, 'quorum'])).stdout)?.[1]
  surface.replicationRound({ replicas: 3, inSync: 1, lagging: ['node-2', 'node-3'] })
  const r = await run(['--url', url, 'quorum'])
  t.equal(r.code, 2)
  t.match(r.stdout, /^key +value\nquorum_state +2\nstatus +read_only\nrunbook_level +0\nreplicas +3\nin_sync +1\nlagging +node-2, node-3\nleader_epoch +0\n/, 'one row, beside replicas and in_sync')
  surface.replicationRound({ replicas: 3, inSync: 3, lagging: [] })
  t.equal(await lagging(), '(none)', 'all in sync')
  surface.replicationRound({ replicas: 3, inSync: 3 })
  t.equal(await lagging(), '-', 'not named by the broker')
  surface.replicationRound({ replicas: 3, inSync: 2, lagging: ['node\u202e3'] })
  t.equal(await lagging(), 'node\\u202e3', 'a name that would reorder text is shown escaped')
  surface.replicationRound({ replicas: 3, inSync: 1, lagging: ['node-2, node-3', 'a,b'] })
  t.equal(await lagging(), '"node-2, node-3", a,b', 'a name that holds a space is quoted: two names, not three')
  surface.replicationRound({ replicas: 3, inSync: 2, lagging: ['node\u202e3'] })
  const json = JSON.parse((await run(['--url', url, '--json', 'quorum'])).stdout)
  t.same(json[0].view.lagging, ['node\u202e3'], '--json: the names as the broker gave them')
})

t.test('an unreachable broker: exit 3, one line on stderr, no stack trace', async (t) => {
  const port = await closedPort()
  const good = await broker(t, { state: 2 })
  const cases = [
    ['alone', ['--url', `http://127.0.0.1:${port}`]],
    ['beside a read_only broker', ['--url', good.url, '--url', `http://127.0.0.1:${port}`]],
    ['in a view', ['--url', `http://127.0.0.1:${port}`, 'groups']],
  ]
  for (const [name, args] of cases) {
    const r = await run(args)
    t.equal(r.code, 3, `${name}: 3 wins over any quorum_state`)
    t.equal(r.stderr.split('\n').length, 2, `${name}: exactly one line on stderr`)
    t.match(r.stderr, new RegExp(`^mq-stats: http://127\\.0\\.0\\.1:${port}: unreachable: .*ECONNREFUSED`), `${name}: names the broker and the cause`)
    t.notMatch(r.stderr, /\n\s+at /, `${name}: no stack trace`)
  }
  const r = await run(cases[1][1])
  t.match(r.stdout, new RegExp(`${good.url}  2 read_only `), 'the reachable broker is still shown')
  t.match(r.stdout, /127\.0\.0\.1:\d+ +unreachable +- +- /, 'the unreachable broker has a row that says so')
})

t.test('a broker that answers with an error status: exit 3', async (t) => {
  const locked = await broker(t, { token: 's3cret' })
  const cases = [
    ['no token', ['--url', locked.url], {}, 3, /^mq-stats: http:\S+: GET \S+ answered HTTP 401 \(UNAUTHORIZED: a bearer token is required\); this broker needs its metrics_auth_token: pass --token TOKEN or set MQ_STATS_TOKEN\n$/],
    ['wrong token', ['--url', locked.url, '--token', 'nope'], {}, 3, /HTTP 401 .*; the token given \(--token or MQ_STATS_TOKEN\) was refused\n$/],
    ['--token', ['--url', locked.url, '--token', 's3cret'], {}, 0, null],
    ['--token=', ['--url', locked.url, '--token=s3cret'], {}, 0, null],
    ['MQ_STATS_TOKEN', ['--url', locked.url], { MQ_STATS_TOKEN: 's3cret' }, 0, null],
    ['--token wins over MQ_STATS_TOKEN', ['--url', locked.url, '--token', 's3cret'], { MQ_STATS_TOKEN: 'nope' }, 0, null],
  ]
  for (const [name, args, env, code, stderr] of cases) {
    const r = await run(args, env)
    t.equal(r.code, code, `${name}: exit ${code}`)
    if (stderr) t.match(r.stderr, stderr, `${name}: says why`)
    else t.equal(r.stderr, '', `${name}: quiet`)
  }
  t.ok(locked.requests.some((q) => q.authorization === 'Bearer s3cret'), 'the token is sent as a Bearer header')
  const table = await run(['--url', locked.url])
  t.match(table.stdout, /127\.0\.0\.1:\d+ +HTTP 401 +- +- /, 'the table row says what the broker answered, not "unreachable"')

  const broken = await broker(t, { override: { topics: [500, 'oops'], groups: [200, 'not json'], '/healthz': undefined } })
  const r = await run(['--url', broken.url])
  t.equal(r.code, 3, 'HTTP 500 on /stats is an error')
  t.match(r.stderr, /GET \/stats\?filter=topics answered HTTP 500 \(oops\)\n$/)
  const g = await run(['--url', broken.url, 'groups'])
  t.equal(g.code, 3, 'a body that is not JSON is an error')
  t.match(g.stderr, /did not answer with a JSON object/)
})

t.test('a broker on a port fetch() calls bad (6000, 6665, 10080, …) is read like any other', async (t) => {
  // fetch() refuses these ports before connecting ("bad port"), whatever listens there.
  let served
  for (const port of [6000, 6665, 6666, 6667, 10080]) {
    try {
      served = await broker(t, { port, state: 1 })
      break
    } catch (error) {
      if (error.code !== 'EADDRINUSE' && error.code !== 'EACCES') throw error
    }
  }
  if (served === undefined) return t.skip('every port tried is in use on this machine')
  const r = await run(['--url', served.url, '--json'])
  t.equal(r.code, 1, `${served.url}: read (quorum_state 1), exit 1`)
  t.equal(r.stderr, '')
  t.equal(JSON.parse(r.stdout)[0].quorum_state, 1)
})

t.test('usage errors exit 64 with one line; --help exits 0', async (t) => {
  const cases = [
    [['--nope'], /unknown option "--nope"/],
    [['nope'], new RegExp(`unknown view "nope"; allowed views: ${VIEWS}`)],
    [['topics', 'groups'], /only one VIEW/],
    [['--watch', '0'], /--watch needs a number of seconds/],
    [['--watch', 'soon'], /--watch needs a number of seconds/],
    [['--watch', '.'], /--watch needs a number of seconds/],
    [['--watch'], /--watch needs a value/],
    [['--url', 'ftp://x'], /--url needs an http or https URL/],
    // Port 0: the request went to port 80 and its answer was shown as the :0 URL's.
    [['--url', 'http://127.0.0.1:0'], /--url needs a port from 1 to 65535/],
    [['--url', 'https://127.0.0.1:000'], /--url needs a port from 1 to 65535/],
    // A query or fragment took the paths read in (/?x=1/healthz): the broker was blamed (a 404, exit 3).
    [['--url', 'http://127.0.0.1:9464?x=1'], /--url is a broker's base URL \(a path prefix at most\), without a query \(\?\) or fragment \(#\)/],
    [['--url', 'http://127.0.0.1:9464/mq#top'], /without a query \(\?\) or fragment \(#\)/],
    [['--url', 'http://127.0.0.1:9464/?'], /without a query \(\?\) or fragment \(#\)/],
    [['--url', 'localhost'], /--url needs an absolute http\(s\) URL/],
    [['--json=yes'], /--json takes no value/],
    [['--token', ''], /--token must not be empty/],
    // A token an HTTP header cannot carry: it was sent, and failed as "unreachable" (exit 3).
    [['--token', 'a\nb'], /^mq-stats: --token has a character an HTTP header cannot carry \(U\+000A\): a broker's metrics_auth_token is visible ASCII/],
    [['--token', 'ü€'], /--token has a character an HTTP header cannot carry \(U\+20AC\)/],
    [['--token=a\u0000'], /--token has a character an HTTP header cannot carry \(U\+0000\)/],
    [['--token', 's3cret'], /MQ_STATS_TOKEN has a character an HTTP header cannot carry \(U\+000D\)/, { MQ_STATS_TOKEN: 's3cret\r' }, 0],
    [[], /MQ_STATS_TOKEN has a character an HTTP header cannot carry \(U\+000D\)/, { MQ_STATS_TOKEN: 's3cret\r' }],
  ]
  for (const [args, message, env, code = 64] of cases) {
    if (code === 0) {
      // --token wins: the environment's token is not used, so not checked either.
      const r = await run([...args, '--url', 'http://127.0.0.1:1'], env)
      t.equal(r.code, 3, `--token given with ${JSON.stringify(env)}: the environment's token is not read (exit 3: unreachable)`)
      t.notMatch(r.stderr, message)
      continue
    }
    const r = await run(args, env)
    const label = args.map((arg) => (/^[\x21-\x7e]+$/.test(arg) ? arg : JSON.stringify(arg))).join(' ') + (env ? ` with ${JSON.stringify(env)}` : '')
    t.equal(r.code, 64, `${label}: exit 64`)
    t.match(r.stderr, message, `${label}: says what is wrong`)
    t.match(r.stderr, /^mq-stats: [^\n]*\(see mq-stats --help\)\n$/, `${label}: one line`)
    t.equal(r.stdout, '', `${label}: nothing on stdout`)
  }
  for (const flag of ['--help', '-h']) {
    const r = await run([flag, '--url', 'http://127.0.0.1:1'])
    t.equal(r.code, 0, `${flag}: exit 0, no request made`)
    t.match(r.stdout, /^Usage: mq-stats \[--url URL \.\.\.\] \[--urls-from FILE\] \[--token TOKEN\] \[VIEW\] \[--watch SECONDS\] \[--json\]/)
    t.match(r.stdout, new RegExp(VIEWS), `${flag}: lists the views`)
  }
})

t.test('--watch redraws until SIGINT, then exits with the last status', async (t) => {
  const soft = await broker(t, { state: 1 })
  const child = spawn(process.execPath, [CLI, '--url', soft.url, '--watch', '0.2'], { stdio: ['ignore', 'pipe', 'pipe'] })
  const killer = setTimeout(() => child.kill('SIGKILL'), 15_000)
  let stdout = ''
  child.stdout.on('data', (d) => {
    stdout += d
    if ((stdout.match(/Ctrl-C to stop/g) || []).length === 3) child.kill('SIGINT')
  })
  const [code, signal] = await new Promise((resolve) => child.on('close', (c, s) => resolve([c, s]))) // its output read to the end
  clearTimeout(killer)
  t.equal(signal, null, 'exits on its own after SIGINT (not killed)')
  t.equal(code, 1, 'with the last frame\'s status (soft)')
  t.equal((stdout.match(/ 1 soft /g) || []).length, 3, 'three frames were drawn')
  t.notMatch(stdout, /\x1b/, 'no screen control codes in a pipe')
})

// A --urls-from FIFO that nobody writes to: the list is read synchronously, so a SIGINT listener
// could never run and Ctrl-C did nothing. The test opens the FIFO's write end
// once mq-stats has opened its read end (a non-blocking open for writing succeeds only then) and
// writes nothing, so mq-stats is held in its read when the signal comes.
t.test('Ctrl-C ends mq-stats while it waits on a --urls-from FIFO', { skip: process.platform === 'win32' && 'no mkfifo' }, async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'mq-stats-fifo-'))
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }))
  const fifo = path.join(dir, 'brokers')
  execFileSync('mkfifo', [fifo])
  // Without tap's process hook (helpers.js takes it out), which would listen for SIGINT in
  // JavaScript, as mq-stats did, and a blocked read never lets such a listener run.
  const child = spawn(process.execPath, [CLI, '--urls-from', fifo], { stdio: ['ignore', 'pipe', 'pipe'] })
  const killer = setTimeout(() => child.kill('SIGKILL'), 15_000)
  const exited = new Promise((resolve) => child.on('exit', (c, s) => resolve([c, s])))
  let writer
  for (let i = 0; i < 1000 && writer === undefined; i++) {
    try {
      writer = fs.openSync(fifo, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK)
    } catch (error) {
      if (error.code !== 'ENXIO') throw error
      await new Promise((resolve) => setTimeout(resolve, 10))
    }
  }
  t.ok(writer !== undefined, 'mq-stats opened the FIFO to read it')
  child.kill('SIGINT')
  const [code, signal] = await exited
  clearTimeout(killer)
  if (writer !== undefined) fs.closeSync(writer)
  t.same([code, signal], [null, 'SIGINT'], 'ended by the SIGINT itself (a shell shows 130), not killed 15 s later')
})

t.test('a reader that goes away (mq-stats --watch 1 | head -2): a quiet exit 0', async (t) => {
  const soft = await broker(t, { state: 1 })
  const child = spawn(process.execPath, [CLI, '--url', soft.url, '--watch', '0.1'], { stdio: ['ignore', 'pipe', 'pipe'] })
  const killer = setTimeout(() => child.kill('SIGKILL'), 15_000)
  let stderr = ''
  child.stderr.on('data', (d) => (stderr += d))
  child.stdout.once('data', () => child.stdout.destroy()) // as head does after its lines
  const [code, signal] = await new Promise((resolve) => child.on('close', (c, s) => resolve([c, s]))) // its stderr read to the end
  clearTimeout(killer)
  t.equal(signal, null, 'not killed: it noticed')
  t.equal(code, 0)
  t.equal(stderr, '', 'no stack trace')
})

// In-process: colour and redraw need a TTY, which a child's pipe is not.
t.test('colour only on a TTY without NO_COLOR', async (t) => {
  const by = [await broker(t, { state: 0, leader: true }), await broker(t, { state: 1 }), await broker(t, { state: 2 })]
  const capture = (isTTY) => {
    const out = { text: '', isTTY, write: (s) => { out.text += s } }
    return out
  }
  const args = by.flatMap((b) => ['--url', b.url])
  const tty = capture(true)
  const err = capture(false)
  t.equal(await main(args, {}, { stdout: tty, stderr: err }), 2)
  t.match(tty.text, /\x1b\[32m0 healthy +\x1b\[0m/, 'healthy is green')
  t.match(tty.text, /\x1b\[33m1 soft +\x1b\[0m/, 'soft is yellow')
  t.match(tty.text, /\x1b\[31m2 read_only +\x1b\[0m/, 'read_only is red')
  const pipe = capture(false)
  await main(args, {}, { stdout: pipe, stderr: err })
  t.notMatch(pipe.text, /\x1b/, 'no colour when stdout is not a TTY')
  t.equal(tty.text.replace(/\x1b\[\d+m/g, ''), pipe.text, 'colour changes nothing else: same text, same alignment')

  const noColor = capture(true)
  await main(args, { NO_COLOR: '1' }, { stdout: noColor, stderr: err })
  t.notMatch(noColor.text, /\x1b/, 'NO_COLOR turns colour off')
  t.equal(err.text, '')

  const interrupt = new AbortController()
  const watching = capture(true)
  const frames = []
  watching.write = (s) => {
    frames.push(s)
    if (frames.length === 2) interrupt.abort()
  }
  t.equal(await main(['--url', by[1].url, '--watch', '0.1'], { NO_COLOR: '1' }, { stdout: watching, stderr: err, signal: interrupt.signal }), 1, 'an interrupted watch returns the last status')
  t.ok(frames.every((f) => f.startsWith('\x1b[H\x1b[2J')), 'on a TTY every frame clears the screen and starts from home')
  const half = new AbortController()
  const shown = []
  const quick = { isTTY: false, write: (s) => { shown.push(s); half.abort() } }
  t.equal(await main(['--url', by[1].url, '--watch', '.5'], {}, { stdout: quick, stderr: err, signal: half.signal }), 1, '--watch .5 is half a second, as 0.5 is')
  t.match(shown[0], /every 0\.5s/)
})

t.test('parseExactJSON keeps integers beyond 2^53 exact', async (t) => {
  const cases = [
    ['18446744073709551615', 18446744073709551615n],
    ['-9007199254740993', -9007199254740993n],
    ['9007199254740991', 9007199254740991],
    ['1.5e300', 1.5e300],
    ['123456789012345678901234567890.5', 123456789012345678901234567890.5],
    ['{"a":[1,"x\\u0000y",true,null,{}],"__proto__":{"b":2}}', JSON.parse('{"a":[1,"x\\u0000y",true,null,{}],"__proto__":{"b":2}}')],
    [' [ ] ', []],
  ]
  for (const [text, expected] of cases) t.strictSame(parseExactJSON(text), expected, text)
  const proto = parseExactJSON('{"__proto__":{"polluted":1}}')
  t.equal(Object.getPrototypeOf(proto), Object.prototype, '"__proto__" is an ordinary key')
  for (const bad of ['', '{', '[1,]', '01', '"\n"', '{"a":1}x', 'nul']) t.throws(() => parseExactJSON(bad), SyntaxError, `rejects ${JSON.stringify(bad)}`)
})

t.test('formatUptime', async (t) => {
  const cases = [[0, '0s'], [59.9, '59s'], [60, '1m00s'], [3599, '59m59s'], [3723.5, '1h02m'], [86399, '23h59m'], [90061, '1d01h']]
  for (const [seconds, expected] of cases) t.equal(formatUptime(seconds), expected, `${seconds} s`)
})

t.test('several brokers read as one cluster: worst tier, the leader, a stale leader, whether epochs agree', async (t) => {
  const a = await broker(t, { state: 1, epoch: 4, leader: true })
  const b = await broker(t, { state: 1, epoch: 4 })
  const c = await broker(t, { state: 2, epoch: 3, leader: true }) // cut off: it still thinks it leads
  const r = await run(['--url', a.url, '--url', b.url, '--url', c.url])
  t.equal(r.code, 4, 'the exit status says the nodes do not agree on one leader (not the worst tier, 2)')
  t.match(r.stdout, new RegExp(`\\ncluster  worst 2 read_only \\(${c.url}\\)  leader ${a.url} \\(epoch 4\\)  stale leader ${c.url} \\(epoch 3\\)  epochs disagree: 4 on 2, 3 on 1\\n$`))

  const healthy = [await broker(t, { epoch: 5, leader: true }), await broker(t, { epoch: 5 })]
  const ok = await run(['--url', healthy[0].url, '--url', healthy[1].url])
  t.equal(ok.code, 0)
  t.match(ok.stdout, new RegExp(`cluster  worst 0 healthy  leader ${healthy[0].url} \\(epoch 5\\)  epochs agree \\(5\\)\\n$`))

  const split = [await broker(t, { epoch: 6, leader: true }), await broker(t, { epoch: 6, leader: true })]
  t.match((await run(['--url', split[0].url, '--url', split[1].url])).stdout, /cluster  worst 0 healthy  2 leaders at epoch 6: \S+, \S+  epochs agree \(6\)/)
  const none = [await broker(t, { epoch: 6 }), await broker(t, { epoch: 6 })]
  t.match((await run(['--url', none[0].url, '--url', none[1].url])).stdout, /cluster  worst 0 healthy  leader: none  epochs agree/)
  // A node at epoch 0 has not been told the epoch yet: it disagrees with no one (as the cluster rules).
  const fresh = await broker(t, { epoch: 0 })
  t.match((await run(['--url', healthy[0].url, '--url', healthy[1].url, '--url', fresh.url])).stdout, /epochs agree \(5\)  1 not told the epoch yet \(0\)\n$/)
  t.match((await run(['--url', fresh.url, '--url', (await broker(t, { epoch: 0 })).url])).stdout, /leader: none  epochs not told yet \(0\)\n$/)

  const down = `http://127.0.0.1:${await closedPort()}`
  const partial = await run(['--url', healthy[0].url, '--url', down])
  t.equal(partial.code, 3, 'an unreachable node: exit 3')
  t.match(partial.stdout, /  1 of 2 unreachable\n$/)
  const dark = await run(['--url', down, '--url', `http://127.0.0.1:${await closedPort()}`])
  t.equal(dark.code, 3)
  t.match(dark.stdout, /\ncluster  worst unknown \(no broker read\)  leader: none  epochs unknown  2 of 2 unreachable\n$/, 'no broker read: no tier, no epoch made up')
  t.notMatch((await run(['--url', a.url])).stdout, /cluster/, 'one broker: no cluster line')
})

t.test('a broker whose answer never ends (or is huge): exit 3, one line, a bounded read; the others are still shown', async (t) => {
  const good = await broker(t)
  const flood = http.createServer((req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    const chunk = Buffer.alloc(1 << 20, 97)
    let sent = 0
    const write = () => { while (sent++ < 600 && !res.destroyed) if (!res.write(chunk)) return res.once('drain', write); res.end() }
    write()
  })
  await new Promise((resolve) => flood.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise((resolve) => { flood.closeAllConnections(); flood.close(resolve) }))
  const url = `http://127.0.0.1:${flood.address().port}`
  const r = await run(['--url', good.url, '--url', url])
  t.equal(r.code, 3)
  t.match(r.stdout, new RegExp(`${good.url} +0 healthy`), "the healthy broker is shown")
  t.match(r.stdout, /bad answer/, 'the flood: a bad answer')
  t.match(r.stderr, /^mq-stats: http:\S+: GET \/\S+ answered more than 64 MiB: not an mq-metrics answer\n$/)
  const used = process.memoryUsage().rss
  t.ok(used < 1.5 * 2 ** 30, `the read stopped at the bound (rss ${Math.round(used / 2 ** 20)} MB; 600 MB read whole would pass 1 GB)`)
})

t.test('/healthz answering 503 with an error body is an error answer, not a reading without a tier', async (t) => {
  for (const code of ['SURFACE_CLOSED', 'TOO_MANY_CONNECTIONS']) {
    const closing = await broker(t, { override: { '/healthz': [503, JSON.stringify({ error: { code, message: 'not now' } })] } })
    const r = await run(['--url', closing.url])
    t.equal(r.code, 3, `${code}: exit 3`)
    t.match(r.stdout, /HTTP 503/, `${code}: the row says HTTP 503`)
    t.match(r.stderr, new RegExp(`GET /healthz answered HTTP 503 \\(${code}: not now\\)\n$`), `${code}: the broker's own code`)
  }
  const readOnly = await broker(t, { state: 2 })
  t.equal((await run(['--url', readOnly.url])).code, 2, "read_only's 503, with its health body, is still a reading")
})

t.test('port 0 in --urls-from (a list or file_sd) is a usage error, not a read of port 80', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'mq-stats-port0-'))
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }))
  fs.writeFileSync(path.join(dir, 'list.txt'), '127.0.0.1:0\n')
  fs.writeFileSync(path.join(dir, 'sd.json'), JSON.stringify([{ targets: ['127.0.0.1:0'] }]))
  for (const file of ['list.txt', 'sd.json']) {
    const r = await run(['--urls-from', path.join(dir, file)])
    t.equal(r.code, 64, `${file}: exit 64`)
    t.match(r.stderr, /needs a port from 1 to 65535/, `${file}: says so`)
  }
})

t.test('a /healthz or quorum view whose fields have the wrong type: a bad answer, shown nowhere', async (t) => {
  // Only quorum_state was checked: a leader_epoch "x" reached --json (which scripts read) and the
  // judgement of leaders, an uptime of 1e400 was shown as "InfinitydNaNh".
  const healthz = (fields) => JSON.stringify({ status: 'healthy', quorum_state: 0, runbook_level: 2, leader_epoch: 7, leader: false, replicas: 3, in_sync: 3, uptime_seconds: 12, faults: 0, ...fields })
  const cases = [
    [{ leader_epoch: 'x' }, /\/healthz has leader_epoch "x", not a count/],
    [{ leader_epoch: -3 }, /leader_epoch -3, not a count/],
    [{ leader_epoch: 1.5 }, /leader_epoch 1\.5, not a count/],
    [{ leader: 'yes' }, /leader "yes", not true or false/],
    [{ status: 5 }, /status 5, not "healthy"/],
    [{ status: 'read_only' }, /status "read_only", not "healthy" \(its quorum_state is 0\)/],
    [{ faults: {} }, /faults \{\}, not a count/],
    [{ uptime_seconds: 'long' }, /uptime_seconds "long", not a number of seconds/],
    [{ uptime_seconds: -1 }, /uptime_seconds -1, not a number of seconds/],
  ]
  for (const [fields, message] of cases) {
    const b = await broker(t, { override: { '/healthz': [200, healthz(fields)] } })
    for (const args of [[], ['--json'], ['quorum', '--json']]) {
      const r = await run(['--url', b.url, ...args])
      const label = `${JSON.stringify(fields)} ${args.join(' ')}`
      t.equal(r.code, 3, `${label}: exit 3`)
      t.match(r.stderr, message, `${label}: says which field`)
      if (args.includes('--json')) t.same(Object.keys(JSON.parse(r.stdout)[0]), ['url', 'error'], `${label}: --json has the error, none of the body`)
      else t.match(r.stdout, /bad answer/, `${label}: the table says bad answer`)
    }
  }
  // 1e400 is parsed as Infinity
  const inf = await broker(t, { override: { '/healthz': [200, healthz({}).replace('"uptime_seconds":12', '"uptime_seconds":1e400')] } })
  const r = await run(['--url', inf.url])
  t.equal(r.code, 3, 'uptime_seconds 1e400: exit 3')
  t.notMatch(r.stdout, /Infinity|NaN/, 'nothing shows Infinity or NaN')
  // The quorum view (the summary's connections and uptime, VIEW quorum)
  const view = await broker(t, { override: { quorum: [200, JSON.stringify({ filter: 'quorum', quorum_state: 0, status: 'healthy', runbook_level: 2, replicas: 3, in_sync: 3, leader_epoch: 7, connections: 'many', uptime_seconds: 12 })] } })
  const q = await run(['--url', view.url, 'quorum', '--json'])
  t.equal(q.code, 3, 'the quorum view with connections "many": exit 3')
  t.match(q.stderr, /\/stats\?filter=quorum has connections "many", not a count/)
  const tier = await broker(t, { override: { quorum: [200, JSON.stringify({ filter: 'quorum', quorum_state: 7, status: 'healthy', leader_epoch: 7, connections: 1, uptime_seconds: 12 })] } })
  const q7 = await run(['--url', tier.url, 'quorum', '--json'])
  t.equal(q7.code, 3, 'the quorum view with quorum_state 7: exit 3')
  t.match(q7.stderr, /\/stats\?filter=quorum has quorum_state 7, not 0, 1 or 2/)
  // A broker too old to have a field leaves it out: still read.
  const old = await broker(t, { override: { '/healthz': [200, JSON.stringify({ status: 'soft', quorum_state: 1 })] } })
  const o = await run(['--url', old.url, '--json'])
  t.equal(o.code, 1, 'a /healthz with only status and quorum_state: read (exit 1, soft)')
  t.equal(JSON.parse(o.stdout)[0].leader, null, 'its leader: null')
})

t.test('an answer cut short: a bad answer, not unreachable', async (t) => {
  const net = require('node:net')
  const server = net.createServer((socket) => {
    socket.once('data', () => socket.end('HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"status":"heal'))
  })
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise((resolve) => server.close(() => resolve())))
  const r = await run(['--url', `http://127.0.0.1:${server.address().port}`])
  t.equal(r.code, 3)
  t.match(r.stdout, /bad answer/)
  t.notMatch(r.stdout, /unreachable/)
  t.match(r.stderr, /GET \/\S+ was cut short: the connection closed before the whole answer/)
})

t.test('the 64 MiB bound counts bytes: a body of 3-byte characters stops at 64 MiB of them', async (t) => {
  const wide = http.createServer((req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' })
    const chunk = Buffer.from('€'.repeat(1 << 18)) // 768 KiB, 262,144 characters
    let sent = 0
    const write = () => { while (sent++ < 100 && !res.destroyed) if (!res.write(chunk)) return res.once('drain', write); res.end() }
    write() // 75 MiB, 25 M characters: under 64 Mi characters, over 64 MiB
  })
  await new Promise((resolve) => wide.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise((resolve) => { wide.closeAllConnections(); wide.close(resolve) }))
  const r = await run(['--url', `http://127.0.0.1:${wide.address().port}`])
  t.equal(r.code, 3)
  t.match(r.stderr, /answered more than 64 MiB: not an mq-metrics answer\n$/)
})

t.test('a server that does not speak HTTP: a bad answer, not unreachable', async (t) => {
  const net = require('node:net')
  const server = net.createServer((socket) => socket.resume().end('SSH-2.0-OpenSSH_9.2\r\n')) // resume: it sees the client close
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise((resolve) => server.close(() => resolve())))
  const r = await run(['--url', `http://127.0.0.1:${server.address().port}`])
  t.equal(r.code, 3)
  t.match(r.stdout, /bad answer/)
  t.match(r.stderr, /did not answer with HTTP \(HPE_\w+\)\n$/)
})

t.test('keys and titles from a broker cannot move the cursor', async (t) => {
  const hostile = await broker(t, { override: { topics: [200, JSON.stringify({ filter: 'topics', topics: [{ '\u001b[31mRED\u001b[2J': 1 }], '\u001b]0;title\u0007': { a: 1 } })] } })
  const r = await run(['--url', hostile.url, 'topics'])
  t.notMatch(r.stdout, /\u001b/, 'no escape byte reaches the terminal')
  t.match(r.stdout, /\\u001b\[31mRED/, 'the key is shown escaped')
})

t.test('names that reorder or hide text are shown escaped; wide and combining characters keep the columns aligned', async (t) => {
  const topics = [
    { topic: 'plain', produced: 1 },
    { topic: '日本語', produced: 22 },
    { topic: 'cafe\u0301', produced: 333 },
    { topic: 'abc\u202edef', produced: 4 },
    { topic: 'zero\u200bwidth', produced: 5 },
  ]
  const named = await broker(t, { override: { topics: [200, JSON.stringify({ filter: 'topics', topics })] } })
  const r = await run(['--url', named.url, 'topics'])
  t.equal(r.code, 0, r.stderr)
  t.notMatch(r.stdout, /[\u202e\u200b]/, 'no right-to-left override or zero-width space reaches the terminal')
  t.match(r.stdout, /abc\\u202edef/)
  t.match(r.stdout, /zero\\u200bwidth/)
  const { displayWidth } = require('../dist/cli/terminal.js')
  const rows = r.stdout.split('\n').filter((l) => /plain|日本語|cafe|abc|zero/.test(l))
  t.equal(rows.length, 5)
  const ends = rows.map((l) => displayWidth(l.slice(0, l.search(/\d+\s*$/)) + l.match(/\d+\s*$/)[0].trimEnd()))
  t.ok(ends.every((e) => e === ends[0]), `the produced column ends at one terminal column on every row (${ends})`)
})

// Widths written out as Unicode has terminals draw them (East Asian Width, emoji presentation),
// not computed by the function under test.
t.test('emoji take two columns, as a terminal draws them, and keep the columns aligned', async (t) => {
  const { displayWidth } = require('../dist/cli/terminal.js')
  const cases = [['a', 1], ['日本', 4], ['cafe\u0301', 4], ['😀', 2], ['✅ ok', 5], ['\u2764\ufe0f', 2], ['\u2764', 1], ['👍🏽', 2], ['🇩🇪', 2], ['🇩🇪🇫🇷', 4], ['⚡x', 3], ['©', 1]]
  for (const [text, columns] of cases) t.equal(displayWidth(text), columns, `${JSON.stringify(text)} takes ${columns}`)
  const topics = [
    { topic: 'plain', produced: 1 },
    { topic: 'deploys ✅', produced: 22 },
    { topic: 'hot 🔥🔥', produced: 333 },
    { topic: 'de 🇩🇪', produced: 4 },
    { topic: 'love \u2764\ufe0f', produced: 5 },
  ]
  const named = await broker(t, { override: { topics: [200, JSON.stringify({ filter: 'topics', topics })] } })
  const r = await run(['--url', named.url, 'topics'])
  t.equal(r.code, 0, r.stderr)
  const rows = r.stdout.split('\n').filter((l) => /plain|deploys|hot|de |love/.test(l))
  t.equal(rows.length, 5)
  // Each row's produced column ends where plain's does: its name's columns (known above) plus
  // the padding the tool put after it are the same on every row.
  const widths = { plain: 5, 'deploys ✅': 10, 'hot 🔥🔥': 8, 'de 🇩🇪': 5, 'love \u2764\ufe0f': 7 }
  const ends = rows.map((l) => {
    const name = topics.find((x) => l.includes(x.topic)).topic
    const rest = l.slice(l.indexOf(name) + name.length)
    return l.indexOf(name) + widths[name] + rest.trimEnd().length
  })
  t.ok(ends.every((e) => e === ends[0]), `the produced column ends at one terminal column on every row (${ends})`)
})

t.test('a password in a broker URL is used, and shown as *** (table, --json, stderr, usage errors)', async (t) => {
  const b = await broker(t)
  const port = new URL(b.url).port
  const withSecret = `http://ops:s3cret@127.0.0.1:${port}`
  const gone = `http://ops:s3cret@127.0.0.1:${await closedPort()}`
  const cases = { 'default view': ['--url', withSecret, '--url', gone], '--json': ['--url', withSecret, '--url', gone, '--json'], topics: ['--url', withSecret, '--url', gone, 'topics'], 'usage error': ['--url', 'ftp://ops:s3cret@127.0.0.1'] }
  for (const [label, args] of Object.entries(cases)) {
    const r = await run(args)
    t.notMatch(r.stdout + r.stderr, /s3cret/, `${label}: the password is shown nowhere`)
    t.match(r.stdout + r.stderr, /ops:\*\*\*@127\.0\.0\.1/, 'the URL is shown with *** in its place')
  }
  t.ok(b.requests.length > 0 && b.requests.every((x) => x.authorization === `Basic ${Buffer.from('ops:s3cret').toString('base64')}`), 'the broker got the credentials')

  // Credentials the request could not decode (a % not followed by hex): a usage error, not a broker unreachable.
  for (const bad of [`http://ops:s3cret%zz@127.0.0.1:${port}`, `http://o%E0ps@127.0.0.1:${port}`, `http://{}:${port}`]) {
    const r = await run(['--url', bad])
    t.equal(r.code, 64, `${bad.replace("s3cret", "***")}: a usage error`)
    t.match(r.stderr, /^mq-stats: --url (has credentials with a malformed %-escape|needs a host name or an IP address)/)
    t.notMatch(r.stderr, /s3cret/)
  }
  // Credentials end at the authority's last @, as the URL parser reads them.
  const at = await run(['--url', `http://ops:p@ss@127.0.0.1:${port}`, '--json'])
  t.equal(at.code, 0, at.stderr)
  t.equal(JSON.parse(at.stdout)[0].url, `http://ops:***@127.0.0.1:${port}`, 'a password with an @ is masked whole')
  // A user name alone may be a token: masked too, and sent.
  const requestsBefore = b.requests.length
  const alone = await run(['--url', `http://tok3n@127.0.0.1:${port}`, '--json'])
  t.equal(JSON.parse(alone.stdout)[0].url, `http://***@127.0.0.1:${port}`)
  t.equal(b.requests[requestsBefore].authorization, `Basic ${Buffer.from('tok3n:').toString('base64')}`)
  // Text that is no URL is masked up to its last @: a bare target, a line with more on it, a
  // file_sd file that does not parse (the parser's own message would quote the file).
  const dir = t.testdir({ 'list.txt': 'ops:s3cret@10.0.0.1:9464 extra\n', 'sd.json': '[{"targets": ["ops:s3cret@10.0.0.1:9464"] ' })
  for (const args of [['--url', 'ops:s3cret@127.0.0.1:9464'], ['--urls-from', path.join(dir, 'list.txt')], ['--urls-from', path.join(dir, 'sd.json')]]) {
    const r = await run(args)
    t.equal(r.code, 64, `${args.join(' ')}: a usage error`)
    t.notMatch(r.stderr, /s3cret/, 'which does not show the password')
    t.equal(r.stderr.split('\n').length, 2, 'on one line')
  }
  // A token and URL credentials would be one Authorization header: node:http sends the token only.
  const both = await run(['--token', 'abc', '--url', withSecret])
  t.equal(both.code, 64, 'a token and credentials in a URL: a usage error')
  t.match(both.stderr, /--token and the credentials in "http:\/\/ops:\*\*\*@127\.0\.0\.1:\d+" cannot both be sent/)
  t.equal((await run(['--url', withSecret], { MQ_STATS_TOKEN: 'abc' })).code, 64, 'MQ_STATS_TOKEN too')
})

t.test('--urls-from FILE: one URL per line, or Prometheus file_sd JSON', async (t) => {
  const a = await broker(t, { epoch: 2, leader: true })
  const b = await broker(t, { epoch: 2 })
  const dir = t.testdir({
    'nodes.txt': `# the cluster\n${a.url}\n\n${b.url}   # the follower\n`,
    'sd.json': JSON.stringify([{ targets: [new URL(a.url).host], labels: { job: 'mq' } }, { targets: [new URL(b.url).host] }]),
    'empty.txt': '# nothing\n',
    'bad.json': '[{"targets": [1]}]',
    'none.json': '[]',
    'sd.yml': `- targets: ['${new URL(a.url).host}']\n`,
    'bom.json': `\uFEFF${JSON.stringify([{ targets: [new URL(a.url).host, new URL(b.url).host] }])}`, // as some editors save it
    'hosts.txt': `${new URL(a.url).host}\n${new URL(b.url).host}\n`, // host:port, as Prometheus writes targets
    'ftp.txt': 'ftp://127.0.0.1:21\n',
    'junk.txt': 'not a url\n',
    'typo.txt': 'htp:/oops\n', // a mistyped scheme, not a host named htp
    'v6.txt': '[::1]:1\n', // a line list whose first line starts with [, not JSON
    'object.json': '{}\n', // one object, not an array of target groups
    'star.txt': '*:1\n', // no host a broker can have
  })
  for (const file of ['nodes.txt', 'sd.json', 'bom.json', 'hosts.txt']) {
    const r = await run(['--urls-from', path.join(dir, file)])
    t.equal(r.code, 0, `${file}: ${r.stderr}`)
    t.match(r.stdout, new RegExp(`${a.url} .*\\n${b.url} [^]*cluster  worst 0 healthy  leader ${a.url} \\(epoch 2\\)`), `${file}: both brokers, then the cluster line`)
  }
  // A file of two clusters (file_sd labels cluster, namespace): a cluster line and a judgement each.
  const c = await broker(t, { epoch: 9, leader: true })
  const d = await broker(t, { epoch: 9, state: 1 })
  const host = (x) => new URL(x.url).host
  const two = path.join(dir, 'two.json')
  fs.writeFileSync(two, JSON.stringify([
    { targets: [host(a)], labels: { cluster: 'eu-1', zone: 'a' } }, { targets: [host(c), host(d)], labels: { cluster: 'us-1', job: 'mq' } },
    { targets: [host(b)], labels: { cluster: 'eu-1', zone: 'b' } }, // one cluster over two zones
  ]))
  const both = await run(['--urls-from', two])
  t.equal(both.code, 1, 'each cluster has one leader at one epoch (2 and 9): no disagreement, the worst tier', { stdout: both.stdout })
  t.match(both.stdout, new RegExp(`\\ncluster \\{cluster="eu-1"\\}  worst 0 healthy  leader ${a.url} \\(epoch 2\\)  epochs agree \\(2\\)\\ncluster \\{cluster="us-1"\\}  worst 1 soft \\(${d.url}\\)  leader ${c.url} \\(epoch 9\\)  epochs agree \\(9\\)\\n$`), 'one line per cluster, in the order named')
  fs.writeFileSync(two, JSON.stringify([{ targets: [host(a), host(b)], labels: { cluster: 'eu-1' } }, { targets: [host(c), host(d)], labels: { cluster: 'eu-1', namespace: 'prod' } }]))
  const split = await run(['--urls-from', two])
  t.match(split.stdout, /\ncluster \{cluster="eu-1"\}  [^\n]*\ncluster \{cluster="eu-1", namespace="prod"\}  /, 'namespace tells clusters apart too')
  t.equal(split.code, 1)
  fs.writeFileSync(two, JSON.stringify([{ targets: [host(a), host(b), host(c)], labels: { cluster: 'eu-1' } }]))
  t.equal((await run(['--urls-from', two])).code, 4, 'in one cluster, leaders at epochs 2 and 9 disagree')
  fs.writeFileSync(two, JSON.stringify([{ targets: [host(a)], labels: { cluster: 'eu-1' } }, { targets: [host(b)] }]))
  const some = await run(['--urls-from', two])
  t.equal(some.code, 0, 'a cluster label on some groups only: the others a cluster of their own, with no leader, which is no disagreement')
  t.match(some.stdout, /\ncluster \{cluster="eu-1"\}  worst 0 healthy  leader \S+ \(epoch 2\)  epochs agree \(2\)\ncluster  worst 0 healthy  leader: none  epochs agree \(2\)\n$/)
  fs.writeFileSync(two, JSON.stringify([{ targets: [host(a)], labels: { cluster: 7 } }]))
  const bad = await run(['--urls-from', two])
  t.equal(bad.code, 64, 'a label value that is not a string: a usage error')
  t.match(bad.stderr, /file_sd JSON must be \[\{"targets": \["host:port", \.\.\.\], "labels": \{"name": "value", \.\.\.\}\}, \.\.\.\]/)
  const twice = await run(['--url', a.url, '--urls-from', path.join(dir, 'nodes.txt')])
  t.equal(twice.stdout.split(a.url).length - 1, 2, 'a broker named twice is one row (and the cluster line names it as leader once)')
  t.notMatch(twice.stdout, /2 leaders/)
  for (const [file, message] of [['missing.txt', /cannot read --urls-from "\S+missing\.txt": ENOENT/], ['empty.txt', /lists no URL/], ['bad.json', /file_sd JSON must be/], ['none.json', /lists no target/], ['sd.yml', /looks like file_sd YAML, which mq-stats does not read: give it the JSON form/], ['ftp.txt', /^mq-stats: --urls-from "\S+ftp\.txt" needs an http or https URL, got "ftp:\/\/127\.0\.0\.1:21"/], ['junk.txt', /^mq-stats: --urls-from "\S+junk\.txt" needs a URL \(http:\/\/host:port\) or host:port, got "not a url"/], ['typo.txt', /^mq-stats: --urls-from "\S+typo\.txt" needs a URL \(http:\/\/host:port\) or host:port, got "htp:\/oops"/], ['object.json', /file_sd JSON must be \[.*\]: an array of target groups, not one object/], ['star.txt', /^mq-stats: --urls-from "\S+star\.txt" needs a host name or an IP address, got "\*:1"/]]) {
    const r = await run(['--urls-from', path.join(dir, file)])
    t.equal(r.code, 64, `${file}: a usage error`)
    t.match(r.stderr, message)
  }
  const v6 = await run(['--urls-from', path.join(dir, 'v6.txt')])
  t.equal(v6.code, 3, 'a line [::1]:1: read as a broker (unreachable), not as JSON that does not parse')
  t.match(v6.stderr, /^mq-stats: http:\/\/\[::1\]:1: unreachable/)
  // FILE -: the list from stdin.
  const child = spawn(process.execPath, [CLI, '--urls-from', '-'], { stdio: ['pipe', 'pipe', 'pipe'] })
  let stdout = ''
  child.stdout.on('data', (d) => (stdout += d))
  setTimeout(() => child.stdin.end(`${a.url}\n${b.url}\n`), 200) // nothing to read at first: it waits
  const [code] = await new Promise((resolve) => child.on('close', (c, sig) => resolve([c, sig]))) // its output read to the end
  t.equal(code, 0, '--urls-from - reads the list from stdin', { stdout })
  t.match(stdout, new RegExp(`${a.url} .*\\n${b.url} `))
  // A stdin left non-blocking (a file description shared with a program that set O_NONBLOCK on
  // it): reads answer EAGAIN until the list arrives, and mq-stats waits for it.
  const script = `import fcntl, os, subprocess, sys, time
r, w = os.pipe()
fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_NONBLOCK)
p = subprocess.Popen(sys.argv[1:], stdin=r, stdout=subprocess.PIPE)
os.close(r)
time.sleep(0.3)
os.write(w, sys.stdin.buffer.read())
os.close(w)
out = p.communicate()[0]
sys.stdout.buffer.write(out)
sys.exit(p.returncode)`
  const nonBlocking = await new Promise((resolve) => {
    const py = spawn('python3', ['-c', script, process.execPath, CLI, '--urls-from', '-'], { stdio: ['pipe', 'pipe', 'pipe'] })
    let out = ''
    let err = ''
    py.stdout.on('data', (d) => (out += d))
    py.stderr.on('data', (d) => (err += d))
    py.stdin.end(`${a.url}\n${b.url}\n`)
    py.on('close', (c) => resolve({ code: c, out, err })) // its output read to the end
  })
  t.equal(nonBlocking.code, 0, 'a non-blocking stdin is waited for', nonBlocking)
  t.match(nonBlocking.out, new RegExp(`${a.url} .*\\n${b.url} `))
})

t.test('--urls-from reads at most 4 MiB: a huge or endless file is a usage error, not a crash', async (t) => {
  const dir = t.testdir({
    // Valid otherwise (one broker named over and over): only its size is wrong.
    'huge.txt': 'http://127.0.0.1:1\n'.repeat(Math.ceil((4 * 2 ** 20 + 1) / 19)),
    'at-the-bound.txt': 'http://127.0.0.1:1\n'.padEnd(4 * 2 ** 20, '#'),
  })
  const message = /^mq-stats: --urls-from "[^"]+" is larger than 4 MiB: not a list of brokers \(see mq-stats --help\)\n$/
  const huge = await run(['--urls-from', path.join(dir, 'huge.txt')])
  t.equal(huge.code, 64, 'a regular file past the bound: exit 64')
  t.match(huge.stderr, message, 'one line saying why')
  const bounded = await run(['--urls-from', path.join(dir, 'at-the-bound.txt')])
  t.equal(bounded.code, 3, 'a file of exactly 4 MiB is read (its broker is unreachable: exit 3)')
  // An endless file (a device, a pipe that never closes with data): the bin, so that a read
  // without a bound would show as what it was, an abort once memory ran out.
  const endless = await bin(['--urls-from', '/dev/zero'])
  t.equal(endless.code, 64, '/dev/zero: exit 64')
  t.match(endless.stderr, message, '/dev/zero: one line saying why')
})

t.test("a broker's error message cannot move the cursor or clear the screen: stderr is escaped as the table is", async (t) => {
  const hostile = await broker(t, { override: { '/healthz': [503, JSON.stringify({ error: { code: 'X\u001b[2J', message: 'not now\u001b[H\u0007' } })] } })
  const r = await run(['--url', hostile.url])
  t.equal(r.code, 3)
  t.notMatch(r.stderr, /[\u0000-\u0008\u000b-\u001f\u007f]/, 'no control character reaches stderr')
  t.match(r.stderr, /X\\u001b\[2J: not now\\u001b\[H\\u0007/, 'shown escaped')
})

t.test('an output that cannot be written (a full disk) exits 74 with one line, not a stack trace read as a quorum state', { skip: !require('node:fs').existsSync('/dev/full') && 'no /dev/full' }, async (t) => {
  const healthy = await broker(t)
  const fs = require('node:fs')
  const full = fs.openSync('/dev/full', 'w')
  t.teardown(() => fs.closeSync(full))
  const child = spawn(process.execPath, [CLI, '--url', healthy.url], { stdio: ['ignore', full, 'pipe'] })
  let stderr = ''
  child.stderr.on('data', (chunk) => (stderr += chunk))
  const code = await new Promise((resolve) => child.once('exit', resolve))
  t.equal(code, 74)
  t.match(stderr, /^mq-stats: cannot write its output: ENOSPC[^\n]*\n$/)
})

t.test('a long list of brokers is read a bounded number at a time: no EMFILE calls a live broker unreachable', async (t) => {
  const BROKERS_AT_ONCE = require('../dist/cli/mq-stats.js').BROKERS_AT_ONCE ?? 64 // (the bound's value, so that an unbounded CLI fails on the count)
  const good = await broker(t, { epoch: 0 }) // 256 times the same node: not told an epoch, so no two leaders (exit 4)
  let open = 0
  let most = 0
  // A proxy in front of the fake broker that answers each request after 20 ms, counting the requests open at once.
  const slow = http.createServer((req, res) => {
    open++
    most = Math.max(most, open)
    setTimeout(() => http.get(good.url + req.url.replace(/^\/b\d+/, ''), (answer) => {
      res.writeHead(answer.statusCode, answer.headers)
      answer.pipe(res).on('finish', () => open--)
    }), 20)
  })
  await new Promise((resolve) => slow.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise((resolve) => { slow.closeAllConnections(); slow.close(resolve) }))
  const url = `http://127.0.0.1:${slow.address().port}`
  const urls = Array.from({ length: 4 * BROKERS_AT_ONCE }, (_, i) => `${url}/b${i}`) // each a broker of its own (a path prefix)
  const r = await run(urls.flatMap((u) => ['--url', u]))
  t.equal(r.code, 0, `${urls.length} brokers, all read`)
  t.ok(most <= 3 * BROKERS_AT_ONCE, `at most ${3 * BROKERS_AT_ONCE} requests open at once (saw ${most}; reading every broker at once opened ${3 * urls.length})`)
  t.ok(most > BROKERS_AT_ONCE, `and brokers are read side by side (saw ${most})`)
})
