'use strict'
// The cluster demo (docs/cluster.md): N nodes in one process, each with its own surface and port.
// Partition: the cut-off leader goes read_only and takes no writes while the majority elects a
// leader with a higher epoch; after the heal the old leader follows. Failover: the dead leader's
// endpoint is gone, a new leader takes over, the restarted node follows. Conservation holds on
// every node throughout, and no fault is raised. The scenario moves only when a test says so
// (phase 'manual'): what each check looks at cannot change under it on a slow machine.
const t = require('tap')
const path = require('node:path')
const { execFile, spawn } = require('node:child_process')
const { runCluster } = require('../dist/demo/cluster')

const { sleep, waitFor, signalAtFirstLine } = require('./helpers')

async function until(what, ok, ms = 10_000) {
  const value = await waitFor(ok, ms)
  if (!value) throw new Error(`timed out waiting for ${what}`)
  return value
}
const healthz = async (url) => (await fetch(`${url}/healthz`)).json()

async function start(t, scenario) {
  const lines = []
  const cluster = await runCluster({ nodes: 3, port: 0, host: '127.0.0.1', topics: 2, rate: 400, scenario, phase: 'manual', line: (l) => lines.push(l) })
  t.teardown(() => cluster.stop())
  return { cluster, lines }
}
const checkBooks = (t, cluster, lines) => {
  t.same(cluster.residuals().filter((r) => r.residual !== 0), [], 'conservation: residual 0 for every group on every node')
  t.same(lines.filter((l) => /FAULT/.test(l)), [], 'no faults')
}

t.test('partition: the cut-off leader goes read_only, the majority elects a higher epoch, the old leader then follows', async (t) => {
  const { cluster, lines } = await start(t, 'partition')
  t.match(lines.join('\n'), /targets: \['127\.0\.0\.1:\d+', '127\.0\.0\.1:\d+', '127\.0\.0\.1:\d+'\]/, 'a scrape config with the three targets is printed')
  const first = await until('a leader', () => cluster.nodes.find((n) => n.leads))
  t.equal(first.epoch, 1)
  const produced = (node) => node.surface.stats('topics').totals.produced
  await until('writes on the leader', () => produced(first) > 0)
  await cluster.advance() // phase 1: the leader is cut off
  const cut = await until('the leader cut off', () => cluster.nodes.find((n) => n.isolated))
  t.equal(cut.id, first.id, 'the leader is the node cut off')
  const next = await until('a new leader', () => cluster.nodes.find((n) => n.leads && !n.isolated))
  t.equal(next.epoch, 2, 'elected with a higher epoch')
  const cutHealth = await healthz(cut.url)
  t.match(cutHealth, { status: 'read_only', leader: true, leader_epoch: 1, in_sync: 1, replicas: 3 }, 'the cut-off node is read_only and still thinks it leads, at the old epoch')
  t.same([...cutHealth.lagging].sort(), cluster.nodes.filter((n) => n.id !== cut.id).map((n) => n.id).sort(), 'it names the two followers it cannot reach')
  const before = produced(cluster.nodes.find((n) => n.id === cut.id))
  await until('writes on the new leader', () => produced(next) > 0)
  await sleep(150)
  t.equal(produced(cluster.nodes.find((n) => n.id === cut.id)), before, 'the cut-off node takes no writes')
  for (const n of cluster.nodes.filter((x) => x.id !== cut.id)) t.match(await healthz(n.url), { status: 'soft', leader_epoch: 2, in_sync: 2, lagging: [cut.id] }, `${n.id}: the majority stays writable (soft), and names the node cut off`)
  t.ok(cluster.nodes.find((n) => n.id === cut.id).isolated, 'still cut off: every look above was inside the partition')
  await cluster.advance() // phase 2: nothing happens
  await cluster.advance() // phase 3: the heal
  await until('the heal', () => !cluster.nodes.some((n) => n.isolated))
  const old = await until('the old leader to follow', () => { const n = cluster.nodes.find((x) => x.id === cut.id); return !n.leads && n.epoch === 2 ? n : undefined })
  t.match(await healthz(old.url), { status: 'healthy', leader: false, leader_epoch: 2 }, 'healed: it follows at the new epoch')
  t.equal(cluster.nodes.filter((n) => n.leads).length, 1, 'one leader')
  checkBooks(t, cluster, lines)
})

t.test('failover: the leader dies, a new leader takes over with a higher epoch, the restarted node follows', async (t) => {
  const { cluster, lines } = await start(t, 'failover')
  const first = await until('a leader', () => cluster.nodes.find((n) => n.leads))
  await cluster.advance() // phase 1: the leader dies
  const dead = await until('the leader to die', () => cluster.nodes.find((n) => !n.alive))
  t.equal(dead.id, first.id)
  await t.rejects(fetch(`${dead.url}/healthz`), 'its endpoint is gone')
  const next = await until('a new leader', () => cluster.nodes.find((n) => n.leads && n.alive))
  t.equal(next.epoch, first.epoch + 1)
  await cluster.advance()
  await cluster.advance() // phase 3: it restarts
  const back = await until('the restart', () => { const n = cluster.nodes.find((x) => x.id === dead.id); return n.alive && n.epoch === next.epoch ? n : undefined })
  t.match(await healthz(back.url), { leader: false, leader_epoch: next.epoch }, 'restarted with a fresh surface, it learned the epoch and follows')
  checkBooks(t, cluster, lines)
})

t.test('mq-demo --nodes: usage errors exit 64; --nodes 1 is the single-node demo', async (t) => {
  const demo = path.join(__dirname, '..', 'dist', 'demo', 'demo.js')
  const run = (args) => new Promise((resolve) => execFile(process.execPath, [demo, ...args], { timeout: 15_000 }, (error, stdout, stderr) => resolve({ code: error ? error.code : 0, stdout, stderr })))
  for (const args of [['--nodes', '2'], ['--nodes', '3', '--scenario', 'degraded'], ['--nodes', '3', '--phase', '0'], ['--nodes', '3', '--bogus', '1']]) {
    const r = await run(args)
    t.equal(r.code, 64, `${args.join(' ')}: exit 64`)
    t.match(r.stderr, /^mq-demo: .+\n\nusage: mq-demo --nodes N/, 'with the message and the usage')
  }
  const help = await run(['--nodes', '3', '--help'])
  t.match(help.stdout, /--scenario NAME +steady \(default\); partition/)
  const single = await run(['--nodes', '1', '--port', '0', '--duration', '0.5'])
  t.equal(single.code, 0, single.stderr)
  t.match(single.stdout, /mq-demo: simulated broker/)
})

t.test('mq-demo --nodes 3: Ctrl-C says what it stops and exits 0', async (t) => {
  const demo = path.join(__dirname, '..', 'dist', 'demo', 'demo.js')
  const child = spawn(process.execPath, [demo, '--nodes', '3', '--port', '0'], { stdio: ['ignore', 'pipe', 'pipe'] })
  t.teardown(() => { if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL') })
  let stdout = ''
  let stderr = ''
  child.stdout.setEncoding('utf8').on('data', (d) => (stdout += d))
  child.stderr.setEncoding('utf8').on('data', (d) => (stderr += d))
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })))
  await until('the prompt', () => stdout.includes('press Ctrl-C to stop\n'), 15_000)
  child.kill('SIGINT')
  const end = await Promise.race([exited, sleep(15_000).then(() => ({ code: 'hung' }))])
  t.same(end, { code: 0, signal: null }, stderr)
  t.match(stdout, /\nstopping \(SIGINT\): closing 3 nodes\.\.\.\nstopped: 3 nodes closed in \d+ ms\n$/, 'the last lines say it stopped')
})

t.test('mq-demo --nodes 3: a Ctrl-C while the nodes start stops them once started, not killed by the signal', async (t) => {
  // Before, the listener came after "press Ctrl-C to stop": a Ctrl-C before it (here: at the first
  // line, while the nodes start) took Node's default action and killed the demo, nothing closed.
  // The child stops after its first line until the helper lets it go on, the signal sent meanwhile.
  const demo = path.join(__dirname, '..', 'dist', 'demo', 'demo.js')
  const { atSignal, stdout, stderr, end } = await signalAtFirstLine(t, [demo, '--nodes', '3', '--port', '0'], 'mq-demo: a cluster of 3 nodes', 'SIGINT')
  t.ok(atSignal.startsWith('mq-demo: a cluster of 3 nodes'), 'its first line')
  t.notOk(atSignal.includes('press Ctrl-C to stop'), 'signalled before the prompt')
  t.same(end, { code: 0, signal: null }, stderr)
  t.match(stdout, /\npress Ctrl-C to stop\nstopping \(SIGINT\): closing 3 nodes\.\.\.\nstopped: 3 nodes closed in \d+ ms\n$/, 'started, then stopped')
})
