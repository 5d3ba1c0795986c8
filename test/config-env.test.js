'use strict'
// Bad configuration and environment (design §1, §7, §8): every key's wrong types, garbage in
// MQ_METRICS_BACKEND, native forced where the addon cannot load, a port in use, listen() twice,
// close() twice, listen() after or during close(). Each must be a clear error naming what is
// wrong, or a no-op — never a hang, a leaked port, or a broker that starts half-configured.
const t = require('tap')
const fs = require('node:fs')
const net = require('node:net')
const os = require('node:os')
const path = require('node:path')
const { spawn } = require('node:child_process')
const { backends, surfaceOn, lib, dist, within, request } = require('./helpers')


/** Runs node with `args` and extra env; resolves { code, signal, stdout, stderr, ms } (killed after 10 s). */
function node(args, env) {
  const started = Date.now()
  return new Promise((resolve) => {
    const childEnv = { ...process.env, ...env }
    for (const [k, v] of Object.entries(env)) if (v === undefined) delete childEnv[k]
    const child = spawn(process.execPath, args, { env: childEnv, stdio: ['ignore', 'pipe', 'pipe'] })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (d) => (stdout += d))
    child.stderr.on('data', (d) => (stderr += d))
    const timer = setTimeout(() => child.kill('SIGKILL'), 10_000)
    child.on('close', (code, signal) => { clearTimeout(timer); resolve({ code, signal, stdout, stderr, ms: Date.now() - started }) })
  })
}

const get = (port, target = '/metrics') => request(port, { path: target }).then((r) => r.status)

/** Resolves true when something accepts TCP connections on the port. */
function accepts(port) {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1')
    socket.on('connect', () => { socket.destroy(); resolve(true) })
    socket.on('error', () => resolve(false))
  })
}

// ---- configuration keys -------------------------------------------------------------------------

const NOT_BOOLEAN = ['true', 1, 0, null, {}, [], NaN]
const NOT_POSITIVE_INTEGER = ['10', 0, -1, 1.5, NaN, Infinity, -Infinity, null, true, 10n, {}, [10], '']
const WRONG = {
  metrics_enabled: NOT_BOOLEAN,
  e2e_latency: NOT_BOOLEAN,
  e2e_latency_timer: NOT_BOOLEAN,
  max_in_flight: [...NOT_POSITIVE_INTEGER, 2 ** 31],
  max_attempts: [...NOT_POSITIVE_INTEGER, 2 ** 53],
  max_topics: [...NOT_POSITIVE_INTEGER, 1_000_001],
  max_partitions_per_topic: [...NOT_POSITIVE_INTEGER, 1_000_001],
  max_groups_per_topic: [...NOT_POSITIVE_INTEGER, 100_001],
  metrics_auth_token: [5, null, true, {}, '', 'has space', 'tab\there', 'new\nline', 'caf\u00e9', 'x'.repeat(4097), ['t']],
}
const RIGHT = {
  metrics_enabled: [true, false],
  e2e_latency: [true, false],
  e2e_latency_timer: [true, false],
  max_in_flight: [1, 2 ** 31 - 1],
  max_attempts: [1, 100],
  max_topics: [1, 1_000_000],
  max_partitions_per_topic: [1, 1_000_000],
  max_groups_per_topic: [1, 100_000],
  metrics_auth_token: ['t', 'x'.repeat(4096), '!~Aa0-._'],
}

function show(value) {
  if (typeof value === 'bigint') return `${value}n`
  if (typeof value === 'string') return JSON.stringify(value.length > 20 ? value.slice(0, 20) + '…' : value)
  if (Number.isNaN(value)) return 'NaN'
  return JSON.stringify(value) ?? String(value)
}

t.test('every configuration key: each wrong type is a ConfigError naming the key; nothing starts', async (t) => {
  t.same(Object.keys(WRONG).sort(), Object.keys(lib.createSurface().config).sort(), 'the table covers every key design §8 lists')
  for (const [key, values] of Object.entries(WRONG)) {
    for (const value of values) {
      t.throws(() => lib.createSurface({ [key]: value }), { name: 'ConfigError', code: 'CONFIG_INVALID', key, message: new RegExp(`^${key}: `) },
        `${key}: ${show(value)} → ConfigError naming ${key}`)
    }
  }
  for (const [what, config] of [['null', null], ['a string', 'metrics'], ['an array', []], ['a number', 5], ['a function', () => {}]]) {
    t.throws(() => lib.createSurface(config), { name: 'ConfigError', key: 'config' }, `config as ${what} → ConfigError naming config`)
  }
  for (const key of ['metricsEnabled', 'max_inflight', 'token', '__proto__x', '']) {
    t.throws(() => lib.createSurface({ [key]: 1 }), { name: 'ConfigError', key, message: /unknown configuration key/ }, `unknown key ${JSON.stringify(key)} is named`)
  }
})

for (const backend of backends()) {
  t.test(`${backend}: right values are accepted, read once, and frozen`, async (t) => {
    for (const [key, values] of Object.entries(RIGHT)) {
      for (const value of values) {
        const surface = surfaceOn(t, backend, { [key]: value })
        t.equal(surface.config[key], value, `${key}: ${show(value)} accepted`)
      }
    }
    const input = { max_in_flight: 7, metrics_auth_token: 'tok' }
    const surface = surfaceOn(t, backend, input)
    input.max_in_flight = 9
    input.metrics_auth_token = 'other'
    t.equal(surface.config.max_in_flight, 7, 'changing the object after createSurface changes nothing')
    t.ok(Object.isFrozen(surface.config), 'the effective configuration is frozen')
    t.throws(() => { 'use strict'; surface.config.max_in_flight = 1 }, TypeError, 'and cannot be written')
    const inherited = surfaceOn(t, backend, Object.create({ max_topics: 'not a number', metrics_enabled: false }))
    t.equal(inherited.config.max_topics, 10000, 'keys inherited from a prototype are not configuration')
    t.equal(inherited.enabled, true, 'not even metrics_enabled')
    t.equal(inherited.stats('config').metrics_auth_token, 'unset', 'the token shows as unset')
    t.equal(surface.stats('config').metrics_auth_token, 'set', 'and as set, never its value')
  })
}

// ---- environment --------------------------------------------------------------------------------

const START = `const s = require(${JSON.stringify(dist)}).createSurface(); console.log(s.backend); s.close()`

t.test('MQ_METRICS_BACKEND: garbage is a startup error naming the variable; exit non-zero, no hang', async (t) => {
  const garbage = ['garbage', 'NATIVE', 'Js', ' js', 'js ', 'auto', '1', 'native,js', '\u00e9']
  const runs = await Promise.all(garbage.map((value) => node(['-e', START], { MQ_METRICS_BACKEND: value })))
  garbage.forEach((value, i) => {
    const r = runs[i]
    t.equal(r.signal, null, `${JSON.stringify(value)}: exits by itself (${r.ms} ms), not killed by the 10 s bound`)
    t.not(r.code, 0, `${JSON.stringify(value)}: exit status non-zero`)
    t.match(r.stderr, /ConfigError: MQ_METRICS_BACKEND: must be "js" or "native"/, `${JSON.stringify(value)}: the error names the variable and the allowed values`)
  })
  const demo = await node([path.join(dist, 'demo', 'demo.js'), '--port', '0', '--duration', '1'], { MQ_METRICS_BACKEND: 'garbage' })
  t.not(demo.code, 0, 'the demo broker (npm start) refuses to start too')
  t.match(demo.stderr, /MQ_METRICS_BACKEND/, 'naming the variable')
  t.equal(demo.signal, null, 'without hanging')
  const auto = await node(['-e', START], { MQ_METRICS_BACKEND: '' })
  t.equal(auto.code, 0, 'an empty value means "choose" (not garbage)')
})

t.test('forcing native where the addon cannot load is a startup error; unforced falls back to js', async (t) => {
  const notAnAddon = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'mq-metrics-')), 'mq_metrics.node')
  fs.writeFileSync(notAnAddon, 'this is not a shared object')
  t.teardown(() => fs.rmSync(path.dirname(notAnAddon), { recursive: true, force: true }))
  // MQ_METRICS_ADDON_PATH is lib/core/backend.ts's test hook: it hides build/ from this child only.
  for (const [what, addon] of [['missing addon', '/nonexistent/mq_metrics.node'], ['corrupt addon', notAnAddon]]) {
    const forced = await node(['-e', START], { MQ_METRICS_BACKEND: 'native', MQ_METRICS_ADDON_PATH: addon })
    t.not(forced.code, 0, `${what}, native forced: exit non-zero`)
    t.match(forced.stderr, /ConfigError: MQ_METRICS_BACKEND: is "native" but the native core is unavailable/, `${what}: the error names the variable and says why`)
    t.equal(forced.signal, null, `${what}: no hang`)
    const unforced = await node(['-e', START], { MQ_METRICS_BACKEND: undefined, MQ_METRICS_ADDON_PATH: addon })
    t.equal(unforced.code, 0, `${what}, nothing forced: starts`)
    t.equal(unforced.stdout.trim(), 'js', `${what}, nothing forced: on the js backend`)
    const js = await node(['-e', START], { MQ_METRICS_BACKEND: 'js', MQ_METRICS_ADDON_PATH: addon })
    t.equal(js.stdout.trim(), 'js', `${what}, js forced: js`)
  }
})

// ---- the server's life cycle -------------------------------------------------------------------

for (const backend of backends()) {
  t.test(`${backend}: a port in use → listen rejects EADDRINUSE, and the surface keeps working`, async (t) => {
    const busy = net.createServer()
    await new Promise((resolve) => busy.listen(0, '127.0.0.1', resolve))
    t.teardown(() => busy.close())
    const port = busy.address().port
    const surface = surfaceOn(t, backend)
    surface.topic('x').produced(0, 1, 1)
    const error = await within(5000, 'listen on a busy port', surface.listen({ port }).then(() => null, (e) => e))
    t.equal(error?.code, 'EADDRINUSE', 'rejects with code EADDRINUSE')
    t.match(error?.message, new RegExp(`address already in use 127\\.0\\.0\\.1:${port}`), 'the message names the address and port')
    t.match(surface.render(), /mq_topic_messages_produced_total\{topic="x"\} 1/, 'recording and rendering go on')
    const server = await within(5000, 'listen on a free port', surface.listen({ port: 0 }))
    t.equal(await get(server.port), 200, 'a later listen() on a free port serves')
    let current = server
    for (const [what, options, name] of [['port -1', { port: -1 }, 'RangeError'], ['port 70000', { port: 70000 }, 'RangeError'], ['port "80"', { port: '80' }, 'TypeError'], ['host ""', { port: 0, host: '' }, 'TypeError'], ['a misspelt option (hostname)', { port: 0, hostname: '0.0.0.0' }, 'TypeError'], ['an array', [], 'TypeError']]) {
      await current.close()
      const bad = await within(5000, what, surface.listen(options).then(() => null, (e) => e))
      t.equal(bad?.name, name, `listen with ${what} → ${name}`)
      current = await within(5000, 'listen again', surface.listen({ port: 0 }))
    }
  })

  t.test(`${backend}: listen() twice → ALREADY_LISTENING; close() twice → no-op; listen() after close() → ClosedError`, async (t) => {
    const surface = surfaceOn(t, backend)
    const server = await within(5000, 'listen', surface.listen({ port: 0 }))
    await t.rejects(surface.listen({ port: 0 }), { code: 'ALREADY_LISTENING', message: new RegExp(`already listening on ${server.url.replace(/\./g, '\\.')}`) }, 'a second listen() names the first server')
    // Two in the same tick: only one may bind (else close() would leave the other open).
    const other = surfaceOn(t, backend)
    const both = await within(5000, 'concurrent listens', Promise.allSettled([other.listen({ port: 0 }), other.listen({ port: 0 })]))
    t.same(both.map((r) => r.status).sort(), ['fulfilled', 'rejected'], 'two concurrent listen() calls: one binds, one is refused')
    t.equal(both.find((r) => r.status === 'rejected').reason.code, 'ALREADY_LISTENING', 'with ALREADY_LISTENING')
    const bound = both.find((r) => r.status === 'fulfilled').value
    await within(5000, 'close', other.close())
    t.equal(await accepts(bound.port), false, 'close() closed the one server that bound')

    await server.close()
    await server.close() // the Listening handle's close is idempotent too
    const again = await within(5000, 'listen after the server closed', surface.listen({ port: 0 }))
    t.equal(await get(again.port), 200, 'after closing the server, listen() works again')

    const first = surface.close()
    const second = surface.close()
    t.equal(first, second, 'close() twice returns the same promise')
    await within(5000, 'close twice', Promise.all([first, second, surface.close()]))
    t.equal(await accepts(again.port), false, 'the server is gone after close()')
    await t.rejects(surface.listen({ port: 0 }), { name: 'ClosedError', code: 'SURFACE_CLOSED' }, 'listen() after close() → ClosedError')
    t.throws(() => surface.topic('x'), { code: 'SURFACE_CLOSED' }, 'so does registering')
  })

  t.test(`${backend}: close() during listen(): the port never stays open`, async (t) => {
    const surface = surfaceOn(t, backend)
    const listening = surface.listen({ port: 0 })
    const closing = surface.close()
    const result = await within(5000, 'listen during close', listening.then((l) => l, (e) => e))
    await within(5000, 'close', closing)
    t.equal(result.code, 'SURFACE_CLOSED', 'the listen() under way rejects with ClosedError')
  })

  t.test(`${backend}: metrics_enabled false → listen() rejects without opening a port; handler() declines`, async (t) => {
    const surface = surfaceOn(t, backend, { metrics_enabled: false })
    await t.rejects(within(5000, 'listen', surface.listen({ port: 0 })), { code: 'METRICS_DISABLED' }, 'a clear error')
    const req = { url: '/metrics', method: 'GET', headers: {} }
    t.equal(surface.handler(req, {}), false, 'handler() leaves every path to the broker')
    surface.topic('x').produced(0, 1, 1)
    t.match(surface.render(), /topic="x"/, 'recording still works')
  })
}

// docs/install.md: the loader says which backend runs and why, and a missing native core is one
// warning line at the first surface — not one per surface, and none when js was chosen.
t.test('backendReason: where the native core came from, or why the TypeScript backend runs', async (t) => {
  const script = `
    const { createSurface } = require(${JSON.stringify(dist)})
    const a = createSurface(), b = createSurface()
    console.log(JSON.stringify({ backend: a.backend, reason: a.backendReason, config: a.stats('config').backend_reason, same: b.backendReason === a.backendReason }))
    a.close(); b.close()`
  const missing = await node(['-e', script], { MQ_METRICS_ADDON_PATH: path.join(os.tmpdir(), 'no-such-addon.node'), MQ_METRICS_BACKEND: undefined })
  t.equal(missing.code, 0, missing.stderr)
  const seen = JSON.parse(missing.stdout)
  t.equal(seen.backend, 'js')
  t.match(seen.reason, /^TypeScript backend: no native core for [a-z0-9]+-[a-z0-9]+ \(no file at MQ_METRICS_ADDON_PATH\); to build it, reinstall with a C\+\+ compiler/)
  t.equal(seen.config, seen.reason, '/stats?filter=config says the same')
  t.ok(seen.same)
  t.equal(missing.stderr.match(/MQ_METRICS_NO_NATIVE_CORE/g)?.length, 1, `one warning line for two surfaces: ${missing.stderr}`)
  t.match(missing.stderr, /Warning: mq-metrics: TypeScript backend: no native core/)

  const broken = path.join(t.testdir({ 'broken.node': 'not an ELF file' }), 'broken.node')
  const bad = await node(['-e', script], { MQ_METRICS_ADDON_PATH: broken, MQ_METRICS_BACKEND: undefined })
  t.match(JSON.parse(bad.stdout).reason, /MQ_METRICS_ADDON_PATH does not load: /, 'a binary that does not load is quoted')

  // native/install.js writes why its build failed beside the build (npm's quiet output hides its warning).
  const failedDir = t.testdir({ 'install-failure.txt': 'python3, make, g++ not found on PATH; gyp ERR! find Python\n', Release: {} })
  const failed = await node(['-e', script], { MQ_METRICS_ADDON_PATH: path.join(failedDir, 'Release', 'mq_metrics.node'), MQ_METRICS_BACKEND: undefined })
  t.match(JSON.parse(failed.stdout).reason, /\(no file at MQ_METRICS_ADDON_PATH: the build at install failed: python3, make, g\+\+ not found on PATH; gyp ERR! find Python\); to build it/, 'the reason says why the build at install failed')

  // An addon the process itself refuses: no compiler would help.
  const refused = await node(['--no-addons', '-e', script], { MQ_METRICS_BACKEND: undefined })
  t.equal(refused.code, 0, refused.stderr)
  t.match(JSON.parse(refused.stdout), { backend: 'js', reason: 'TypeScript backend: this process may not load native addons (node --no-addons, or the permission model without --allow-addons); allow them for the native core' })

  const forced = await node(['-e', script], { MQ_METRICS_BACKEND: 'js' })
  t.equal(JSON.parse(forced.stdout).reason, 'TypeScript backend: chosen by MQ_METRICS_BACKEND=js')
  t.notMatch(forced.stderr, /MQ_METRICS_NO_NATIVE_CORE/, 'no warning when js was chosen')

  if (backends().includes('native')) {
    const native = await node(['-e', script], { MQ_METRICS_BACKEND: undefined, MQ_METRICS_ADDON_PATH: undefined })
    t.match(JSON.parse(native.stdout), { backend: 'native', reason: /^native core: (the prebuilt binary for [a-z0-9-]+ \(prebuilds\/|the build from source \(build\/Release\/mq_metrics\.node\))/ })
    t.equal(native.stderr, '')
  }
})
