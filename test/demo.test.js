'use strict'
// design §13: `npm start` runs a simulated broker that keeps honest books through the public API,
// serves the three endpoints, passes through soft and read_only in the `degraded` scenario, and
// stops cleanly (exit 0) after --duration or on SIGTERM. If these fail, the main job is broken:
// an operator running `npm start` would see faults, wrong numbers, or a process that hangs.
const t = require('tap')
const path = require('node:path')
const net = require('node:net')
const { spawn } = require('node:child_process')
const { dist, withoutBackendWarning, signalAtFirstLine } = require('./helpers')

const DEMO = path.join(dist, 'demo', 'demo.js')
const { runDemo, USAGE } = require(DEMO)

/** Every family of the closed allowlist (design §2). */
const FAMILIES = [
  'mq_broker_uptime_seconds', 'mq_connections', 'mq_leader_epoch', 'mq_quorum_state',
  'mq_topic_messages_produced_total', 'mq_topic_messages_delivered_total', 'mq_topic_messages_dropped_total',
  'mq_topic_messages_dlq_total', 'mq_topic_bytes_total', 'mq_partition_depth', 'mq_partition_last_seq',
  'mq_group_lag', 'mq_group_in_flight', 'mq_group_retries_total', 'mq_e2e_latency_ms',
]
/** Faults honest accounting must never raise (design §4, §5, §6). */
const HONEST_NEVER = ['CONSERVATION_BROKEN', 'DLQ_WITHOUT_DROP', 'SEQ_REGRESSION', 'IN_FLIGHT_UNDERFLOW', 'ACK_FLOOR_INVALID', 'WRITE_WHILE_READ_ONLY', 'EPOCH_REGRESSION']

/** Starts the demo as a child process; resolves the serving base URL from its output. */
function startDemo(t, args, { killAfterMs = 30_000 } = {}) {
  const child = spawn(process.execPath, [DEMO, ...args], { stdio: ['ignore', 'pipe', 'pipe'] })
  const out = { stdout: '', stderr: '' }
  child.stdout.setEncoding('utf8').on('data', (d) => (out.stdout += d))
  child.stderr.setEncoding('utf8').on('data', (d) => (out.stderr += d))
  const killer = setTimeout(() => child.kill('SIGKILL'), killAfterMs)
  // 'close', not 'exit': the child's last output may still be in its pipes when it exits.
  const exited = new Promise((resolve) => child.on('close', (code, signal) => {
    clearTimeout(killer)
    resolve({ code, signal })
  }))
  t.teardown(() => { if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL') })
  const url = new Promise((resolve, reject) => {
    const look = () => {
      const m = /^\s+(http:\/\/\S+)\/metrics$/m.exec(out.stdout)
      if (m) return resolve(m[1])
      if (child.exitCode !== null || child.signalCode !== null) return reject(new Error(`demo exited before serving:\n${out.stdout}\n${out.stderr}`))
      setTimeout(look, 25)
    }
    look()
  })
  return { child, out, url, exited }
}

async function get(url) {
  const res = await fetch(url, { signal: AbortSignal.timeout(2000) })
  return { status: res.status, body: await res.text() }
}

/** `name{labels} value` lines of one family, as [labels, value]. */
function samples(body, name) {
  const out = []
  for (const line of body.split('\n')) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$/.exec(line)
    if (m && m[1] === name) out.push([m[2] ?? '', Number(m[3])])
  }
  return out
}

function labelOf(labels, key) {
  const m = new RegExp(`${key}="([^"]*)"`).exec(labels)
  return m ? m[1] : undefined
}

t.test('degraded run: live endpoints, quorum cycle, honest books, exits 0 after --duration', async (t) => {
  // Phases of 0.5 s (two replication rounds each): two full cycles in 3.5 s.
  const demo = startDemo(t, ['--port', '0', '--duration', '3.5', '--scenario', 'degraded', '--phase', '0.5', '--rate', '2000', '--topics', '3'])
  const base = await demo.url
  const workerTopics = /worker thread topics: (.+)$/m.exec(demo.out.stdout)[1].split(', ')
  t.ok(workerTopics.length >= 1, 'the demo names the topics its worker thread owns')

  // Poll until the process goes away; keep the last good answer of each endpoint. /healthz has a
  // loop of its own, every 100 ms: the larger reads, in the other, must not make it miss a 0.5 s
  // phase on a loaded machine.
  const health = [] // [status, httpStatus] in order seen
  let metrics, faults, topics
  const alive = () => demo.child.exitCode === null && demo.child.signalCode === null
  const poll = async (every, read) => {
    while (alive()) {
      try {
        await read()
      } catch {
        // The server closes while the demo shuts down.
      }
      await new Promise((r) => setTimeout(r, every))
    }
  }
  await Promise.all([
    poll(100, async () => {
      const h = await get(`${base}/healthz`)
      const status = JSON.parse(h.body).status
      const last = health[health.length - 1]
      if (!last || last[0] !== status) health.push([status, h.status])
    }),
    poll(500, async () => {
      const [m, f, s] = await Promise.all([get(`${base}/metrics`), get(`${base}/stats?filter=faults`), get(`${base}/stats?filter=topics`)])
      if (m.status === 200) metrics = m.body
      if (f.status === 200) faults = JSON.parse(f.body)
      if (s.status === 200) topics = JSON.parse(s.body)
    }),
  ])
  const { code, signal } = await demo.exited
  t.equal(code, 0, `the demo exits 0 by itself after --duration (signal ${signal}; stderr: ${demo.out.stderr})`)
  t.match(demo.out.stdout, /drained in \d+ ms; worker joined; server closed/, 'it drains, joins the worker and closes the server')
  t.match(demo.out.stdout, /conservation: residual 0 in every group/, 'its final conservation view shows residual 0')

  const statuses = health.map(([s]) => s)
  t.ok(health.filter(([s]) => s === 'read_only').every(([, h]) => h === 503), '/healthz answers 503 in read_only')
  t.ok(health.filter(([s]) => s !== 'read_only').every(([, h]) => h === 200), '/healthz answers 200 when healthy or soft')
  const soft = statuses.indexOf('soft')
  const readOnly = statuses.indexOf('read_only', soft)
  t.ok(soft >= 0 && readOnly > soft && statuses.indexOf('healthy', readOnly) > readOnly,
    `/healthz passes healthy -> soft -> read_only -> healthy (saw ${statuses.join(' -> ')})`)

  t.ok(metrics, 'a /metrics scrape succeeded')
  for (const family of FAMILIES) t.match(metrics, new RegExp(`^# TYPE ${family} (gauge|counter)$`, 'm'), `/metrics has the ${family} family`)
  t.equal(new Set(metrics.split('\n').filter((l) => l.startsWith('# TYPE ')).map((l) => l.split(' ')[2])).size, 15, 'exactly 15 families')

  const dropped = new Map(samples(metrics, 'mq_topic_messages_dropped_total').map(([l, v]) => [labelOf(l, 'topic'), v]))
  const dlq = samples(metrics, 'mq_topic_messages_dlq_total')
  t.equal(dlq.length, 3, 'one dlq sample per topic')
  for (const [labels, value] of dlq) {
    t.ok(value <= dropped.get(labelOf(labels, 'topic')), `design §4: dlq (${value}) <= dropped (${dropped.get(labelOf(labels, 'topic'))}) for ${labels}`)
  }
  t.ok([...dropped.values()].reduce((a, b) => a + b, 0) > 0, 'messages past max_attempts were dropped (the retry path ran)')
  const epoch = samples(metrics, 'mq_leader_epoch')
  t.ok(epoch.length === 1 && epoch[0][1] >= 2, 'a new leader epoch after read_only')

  const latency = Object.fromEntries(samples(metrics, 'mq_e2e_latency_ms').map(([l, v]) => [labelOf(l, 'quantile'), v]))
  t.same(Object.keys(latency).sort(), ['p50', 'p90', 'p99'], 'the latency estimator has samples')
  t.ok(latency.p50 > 0 && latency.p50 <= latency.p90 && latency.p90 <= latency.p99, `p50 <= p90 <= p99 (${JSON.stringify(latency)})`)

  for (const name of workerTopics) {
    const topic = topics.topics.find((x) => x.topic === name)
    t.ok(topic && topic.produced > 0, `worker-owned topic ${name} recorded produced > 0 through attachSurface`)
  }
  t.ok(faults, 'a /stats?filter=faults read succeeded')
  for (const code of HONEST_NEVER) t.notOk(faults.counts[code], `no ${code} fault on honest traffic`)
  t.equal(faults.total, 0, `no fault at all (counts: ${JSON.stringify(faults.counts)})`)
  t.notMatch(demo.out.stderr, /fault:/, 'no fault printed')
})

t.test('SIGTERM: stops producing, drains, closes the server, exits 0', async (t) => {
  const demo = startDemo(t, ['--port', '0', '--topics', '2', '--rate', '1000'])
  const base = await demo.url
  // The line after the URLs may come in a later chunk of stdout than they did: wait for it (bounded).
  for (const end = Date.now() + 5000; !/press Ctrl-C to stop/.test(demo.out.stdout) && Date.now() < end;) {
    await new Promise((r) => setTimeout(r, 25))
  }
  t.match(demo.out.stdout, /press Ctrl-C to stop/, 'without --duration it runs until a signal')
  const m = await get(`${base}/metrics`)
  t.equal(m.status, 200, 'serving /metrics before the signal')
  demo.child.kill('SIGTERM')
  const { code, signal } = await demo.exited
  t.equal(code, 0, `SIGTERM → exit 0 (signal ${signal}; stderr: ${demo.out.stderr})`)
  t.match(demo.out.stdout, /stopping \(SIGTERM\)/, 'it says why it stops')
  t.match(demo.out.stdout, /conservation: residual 0 in every group/)
  await t.rejects(get(`${base}/metrics`), 'the server is closed after exit')
})

t.test('a SIGINT at its first line (before "press Ctrl-C to stop") stops it cleanly, not killed by the signal', async (t) => {
  // Before, the listener came after the demo had started and printed its prompt: a Ctrl-C in
  // between took Node's default action (killed, nothing drained or closed). The child stops after
  // its first line until the test lets it go on (fixtures/pause-after-first-line.js), and the
  // signal is sent meanwhile.
  const { atSignal, stdout, stderr, end } = await signalAtFirstLine(t, [DEMO, '--port', '0', '--topics', '2', '--rate', '1000'], 'mq-demo: simulated broker', 'SIGINT')
  t.match(atSignal, /^mq-demo: simulated broker/, 'its first line')
  t.notOk(atSignal.includes('press Ctrl-C to stop'), 'signalled before the prompt')
  t.same(end, { code: 0, signal: null }, stderr)
  t.match(stdout, /press Ctrl-C to stop\n(.*\n)*stopping \(SIGINT\)/, 'it started, then says why it stops')
  t.match(stdout, /conservation: residual 0 in every group/, 'after draining')
})

t.test('a reader that goes away (mq-demo | head -4): a quiet exit 0, no stack trace', async (t) => {
  const { child, out, url, exited } = startDemo(t, ['--port', '0', '--topics', '2', '--rate', '1000'])
  await url
  child.stdout.destroy() // the pipe's reading end closes: the demo's next line meets EPIPE
  const end = await exited
  t.same(end, { code: 0, signal: null }, out.stderr)
  t.notMatch(out.stderr, /EPIPE|Error/, 'nothing on stderr')
})

t.test('usage errors exit 64 with the usage on stderr', async (t) => {
  const cases = [
    [['--bogus'], /unknown flag --bogus/],
    [['stray'], /unexpected argument/],
    [['--scenario', 'chaos'], /--scenario must be one of steady, degraded/],
    [['--rate', '-5'], /--rate must be a number greater than 0/],
    [['--rate', 'fast'], /--rate must be a number/],
    [['--port', '70000'], /--port must be an integer from 0 to 65535/],
    [['--topics', '0'], /--topics must be an integer from 1/],
    [['--duration'], /--duration needs a value/],
    [['--duration', '0'], /--duration must be a number greater than 0/],
    [['--phase', '0.1'], /--phase must be at least 0.5/],
    [['--port=1', '--port=2'], /given more than once/],
  ]
  await Promise.all(cases.map(async ([args, message]) => {
    const demo = startDemo(t, args, { killAfterMs: 10_000 })
    demo.url.catch(() => {})
    const { code } = await demo.exited
    t.equal(code, 64, `${args.join(' ')} → exit 64`)
    t.match(demo.out.stderr, message, `${args.join(' ')} → names the problem`)
    t.ok(demo.out.stderr.includes('usage: mq-demo'), `${args.join(' ')} → usage on stderr`)
  }))
  const help = startDemo(t, ['--help'], { killAfterMs: 10_000 })
  help.url.catch(() => {})
  t.same(await help.exited, { code: 0, signal: null }, '--help exits 0')
  t.equal(help.out.stdout, USAGE, '--help prints the usage on stdout')
})

t.test('a port in use: one clear line, exit 1', async (t) => {
  const blocker = net.createServer()
  await new Promise((r) => blocker.listen(0, '127.0.0.1', r))
  t.teardown(() => blocker.close())
  const { port } = blocker.address()
  const demo = startDemo(t, ['--port', String(port), '--duration', '2'], { killAfterMs: 10_000 })
  demo.url.catch(() => {})
  const { code } = await demo.exited
  t.equal(code, 1, 'exit 1')
  t.equal(withoutBackendWarning(demo.out.stderr), `mq-demo: cannot listen on 127.0.0.1:${port}: address already in use (pick another --port, or --port 0 for a free one)\n`)
})

t.test('in process: runDemo keeps exact books — after the drain every group has residual 0, quiet', async (t) => {
  const demo = await runDemo({ port: 0, duration: 1.5, topics: 2, rate: 3000, scenario: 'steady', quiet: true })
  t.same(demo.topics, { main: ['orders'], worker: ['payments'] }, 'one topic on the main thread, one in the worker')
  const health = await get(`${demo.url}/healthz`)
  t.equal(health.status, 200)
  const result = await demo.done
  t.equal(result.reason, 'duration')
  t.equal(result.error, undefined)
  t.ok(result.drained, 'consumers settled every message before the drain bound')
  t.same(result.faults, {}, 'no fault of any kind')
  t.ok(result.totals.produced > 1500, `produced ${result.totals.produced} messages`)
  t.equal(result.totals.delivered + result.totals.dropped, 2 * result.totals.produced, 'each group settled each message exactly once')
  t.ok(result.totals.dlq <= result.totals.dropped)
  t.equal(result.conservation.topics.length, 2)
  for (const topic of result.conservation.topics) {
    t.ok(topic.dlq_within_dropped, `${topic.topic}: dlq within dropped`)
    t.equal(topic.groups.length, 2, `${topic.topic}: two consumer groups`)
    for (const group of topic.groups) {
      const where = `${topic.topic}/${group.group}`
      t.equal(group.residual, 0, `${where}: residual 0`)
      t.equal(group.quiet, true, `${where}: quiet after the drain`)
      t.equal(group.depth, 0, `${where}: depth 0 after the drain`)
      t.equal(Number(group.delivered) + Number(group.dropped), Number(topic.produced), `${where}: delivered + dropped = produced`)
    }
  }
  t.same(await demo.stop(), result, 'stop() after the end returns the same result')
})

t.test('runDemo validates its options like the flags', async (t) => {
  const cases = [
    [{ scenario: 'chaos' }, /--scenario/],
    [{ rate: 0 }, /--rate/],
    [{ topics: 1.5 }, /--topics/],
    [{ port: -1 }, /--port/],
    [{ colour: true }, /unknown option "colour"/],
  ]
  for (const [options, message] of cases) {
    await t.rejects(runDemo({ quiet: true, ...options }), { name: 'UsageError', message }, JSON.stringify(options))
  }
})

t.test('npm start: a SIGTERM sent to npm alone stops the demo (npm\'s shell does not pass it on)', async (t) => {
  // A container's stop or a process manager signals npm only. npm passes the signal to the shell
  // that runs the script, which ends without passing it on: the demo, orphaned, notices that its
  // parent has gone (it watches under npm) and stops as on SIGTERM, freeing its port.
  const child = spawn('npm', ['start', '--silent', '--', '--port', '0'], { cwd: path.join(__dirname, '..'), stdio: ['ignore', 'pipe', 'pipe'], detached: true })
  t.teardown(() => {
    try {
      process.kill(-child.pid, 'SIGKILL') // the whole process group: npm, its shell, the demo
    } catch {}
  })
  let stdout = ''
  child.stdout.setEncoding('utf8').on('data', (d) => (stdout += d))
  const closed = new Promise((resolve) => child.stdout.on('close', resolve)) // every writer gone: the demo too
  const deadline = Date.now() + 20_000
  let url
  while (url === undefined && Date.now() < deadline) {
    url = /^\s+(http:\/\/\S+)\/metrics$/m.exec(stdout)?.[1]
    await new Promise((resolve) => setTimeout(resolve, 25))
  }
  t.ok(url, "the demo serves under npm start", { stdout })
  t.equal((await get(`${url}/healthz`)).status, 200)
  process.kill(child.pid, 'SIGTERM') // npm only
  const gone = await Promise.race([closed.then(() => true), new Promise((resolve) => setTimeout(() => resolve(false), 10_000))])
  t.ok(gone, 'the demo has exited within 10 s')
  t.match(stdout, /conservation: residual 0/, 'after draining as on SIGTERM')
  await t.rejects(get(`${url}/healthz`), 'its port is closed')
})
