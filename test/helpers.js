'use strict'
// Shared by the test files: which backends to run against, and a surface that is always closed.
const http = require('node:http')
const path = require('node:path')

// tap puts its process-tracking hook (@tapjs/processinfo, for coverage, which is off here) into
// NODE_OPTIONS, so every node process a test spawns (the demo, mq-stats, the docs' examples) would
// load it too: ~240 ms of CPU per child on this machine. The children do without it.
// The hook also puts itself back into each child's environment, from a listener on every spawn
// (the package process-on-spawn, which keeps its listeners on a global): a listener added after
// it takes the hook out again.
const withoutHook = (value) => value.replace(/(^|\s)"?--(import|loader|require)[= ]?[^\s"]*@tapjs\/processinfo[^\s"]*"?/g, '').trim()
const hooked = process.env.NODE_OPTIONS?.includes('@tapjs/processinfo') === true
if (process.env.NODE_OPTIONS) {
  const kept = withoutHook(process.env.NODE_OPTIONS)
  if (kept) process.env.NODE_OPTIONS = kept
  else delete process.env.NODE_OPTIONS
}
const onSpawn = global[Symbol.for('process-on-spawn@*:singletonId')]
// A tap that no longer keeps its listeners there would leave the hook in every child, where it
// listens for SIGINT in JavaScript (test/cli.test.js's FIFO test would blame mq-stats): say so.
if (hooked && !Array.isArray(onSpawn?.listeners)) throw new Error("test/helpers.js: tap's process hook is on, but process-on-spawn's listeners are not where they were: update how helpers.js keeps the hook out of children")
onSpawn?.listeners.push((spawned) => {
  if (spawned.env.NODE_OPTIONS === undefined) return
  const env = { ...spawned.env, NODE_OPTIONS: withoutHook(spawned.env.NODE_OPTIONS) }
  if (!env.NODE_OPTIONS) delete env.NODE_OPTIONS
  spawned.env = env
})

const dist = path.join(__dirname, '..', 'dist')
const lib = require(dist)

/** Every backend this machine can run. In CI the native core must be built (design §1). */
function backends() {
  const native = require(path.join(__dirname, '..', 'scripts', 'test-backends.js')).nativeCore().file !== undefined
  if (!native && process.env.CI) throw new Error('CI: the native core was not built, so its tests cannot run')
  return native ? ['js', 'native'] : ['js']
}

/** Creates a surface on `backend` (the environment variable is read at createSurface). */
function surfaceOn(t, backend, config, options) {
  const before = process.env.MQ_METRICS_BACKEND
  process.env.MQ_METRICS_BACKEND = backend
  let surface
  try {
    surface = lib.createSurface(config, options)
  } finally {
    if (before === undefined) delete process.env.MQ_METRICS_BACKEND
    else process.env.MQ_METRICS_BACKEND = before
  }
  t.teardown(() => surface.close())
  return surface
}

/**
 * Collects the faults a surface emits. Tests of single invariants do not keep honest books, so
 * they may pass `{ ignore: ['CONSERVATION_BROKEN'] }` to leave the conservation check out.
 */
function faultsOf(surface, { ignore = [] } = {}) {
  const faults = []
  surface.on('fault', (f) => { if (!ignore.includes(f.code)) faults.push(f) })
  return faults
}

/** The numbers of one topic, as plain JSON-able values (bigint → string). */
function topicNumbers(surface, name) {
  const topic = surface.snapshot().topics.find((x) => x.name === name)
  if (!topic) return undefined
  return JSON.parse(JSON.stringify(topic, (k, v) => (k === 'key' ? undefined : typeof v === 'bigint' ? `${v}n` : v)))
}

/** A seeded PRNG (mulberry32): the same seed gives the same sequence in [0, 1) on every run. */
function prng(seed) {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let x = a
    x = Math.imul(x ^ (x >>> 15), x | 1)
    x ^= x + Math.imul(x ^ (x >>> 7), x | 61)
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296
  }
}

/** Resolves as `promise` does, or rejects naming `what` after `ms` (keeps every wait bounded). */
function within(ms, what, promise) {
  let timer
  return Promise.race([
    promise,
    new Promise((resolve, reject) => { timer = setTimeout(() => reject(new Error(`${what}: not done within ${ms} ms`)), ms) }),
  ]).finally(() => clearTimeout(timer))
}

/**
 * Runs `node ...args` and resolves with the JSON it prints on stdout; rejects with its stderr if
 * it prints none, or if it has not finished within `timeoutMs` (then it is killed).
 * `withoutTapLoader`: tap's process tracker puts its loader into every child's NODE_OPTIONS, and
 * from there into every worker thread the child starts (~3× the start-up cost); `env -u` takes it
 * out again.
 */
function jsonFromChild(name, args, { timeoutMs, withoutTapLoader = false }) {
  const { spawn } = require('node:child_process')
  return new Promise((resolve, reject) => {
    const child = withoutTapLoader
      ? spawn('sh', ['-c', 'exec env -u NODE_OPTIONS "$0" "$@"', process.execPath, ...args], { stdio: ['ignore', 'pipe', 'pipe'] })
      : spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'] })
    let stdout = ''
    let stderr = ''
    let timedOut = false
    child.stdout.on('data', (d) => (stdout += d))
    child.stderr.on('data', (d) => (stderr += d))
    const timer = setTimeout(() => {
      timedOut = true
      child.kill('SIGKILL')
    }, timeoutMs)
    child.on('close', (code) => {
      clearTimeout(timer)
      if (timedOut) return reject(new Error(`${name} did not finish within ${timeoutMs} ms`))
      try {
        resolve(JSON.parse(stdout))
      } catch {
        reject(new Error(`${name} exited ${code}: ${stderr.slice(0, 2000)}`))
      }
    })
  })
}

/**
 * One HTTP request to 127.0.0.1:`target` (a port) or to a base URL: resolves with
 * { status, headers, body (a Buffer), text (the body as UTF-8), bytes, ms }. `keepBody: false`
 * counts the body's bytes without holding it (big bodies). No agent: a fresh connection each time.
 */
function request(target, { method = 'GET', path = '/', headers = {}, body, agent = false, keepBody = true } = {}) {
  const started = process.hrtime.bigint()
  const base = typeof target === 'number' ? `http://127.0.0.1:${target}` : target
  return new Promise((resolve, reject) => {
    const req = http.request(base + path, { method, headers, agent }, (res) => {
      const chunks = []
      let bytes = 0
      res.on('data', (chunk) => {
        bytes += chunk.length
        if (keepBody) chunks.push(chunk)
      })
      res.on('end', () => {
        const buffer = Buffer.concat(chunks)
        resolve({ status: res.statusCode, headers: res.headers, body: buffer, text: buffer.toString('utf8'), bytes, ms: Number(process.hrtime.bigint() - started) / 1e6 })
      })
      res.on('error', reject)
    })
    req.on('error', reject)
    req.end(body)
  })
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

/** Polls `fn` until it returns something truthy (a throw counts as "not yet"); undefined after `ms`. */
async function waitFor(fn, ms, interval = 25) {
  const end = Date.now() + ms
  for (;;) {
    try {
      const value = await fn()
      if (value) return value
    } catch {}
    if (Date.now() > end) return undefined
    await sleep(interval)
  }
}

/**
 * From now on every reading of performance.now() moves the clock `stepMs` on (a slice of work
 * that checks it ends at once, on any machine). Returns what puts the real clock back; teardown
 * does too.
 */
function steppingClock(t, stepMs) {
  const realNow = performance.now
  let clock = realNow.call(performance)
  performance.now = () => (clock += stepMs)
  const restore = () => { performance.now = realNow }
  t.teardown(restore)
  return restore
}

/**
 * Date.now() — which the server's stall checks and the scrape thread's back-off read — runs `ms`
 * ahead of the real clock (behind, if negative) from now on: a test moves the library's time
 * instead of sleeping through it. Returns what puts the real clock back; teardown does too.
 */
function shiftedDateNow(t, ms) {
  const realNow = Date.now
  Date.now = () => realNow() + ms
  const restore = () => { Date.now = realNow }
  t.teardown(restore)
  return restore
}

/**
 * `stderr` without the one documented warning a process without the native core writes
 * (MQ_METRICS_NO_NATIVE_CORE, docs/install.md) and Node's hint after it: a clone on a machine
 * with no compiler runs every test on the TypeScript backend, and a test of what a program
 * writes to stderr must not fail there for that line.
 */
function withoutBackendWarning(stderr) {
  return stderr.replace(/^\(node:\d+\) \[MQ_METRICS_NO_NATIVE_CORE\] Warning: .*\n(\(Use `node --trace-warnings .*\n)?/m, '')
}

/**
 * Runs `node <args>` held after its first line of stdout (fixtures/pause-after-first-line.js), waits
 * (up to 15 s) for a first line starting with `firstLine`, sends `signal` while the child waits
 * there, lets it go on and waits (up to 20 s) for it to end. Resolves with the stdout seen when the
 * signal went, the whole stdout and stderr, and how it ended ({ code, signal }, or code 'hung').
 */
async function signalAtFirstLine(t, args, firstLine, signal) {
  const { spawn } = require('node:child_process')
  const pause = path.join(__dirname, 'fixtures', 'pause-after-first-line.js')
  const child = spawn(process.execPath, ['-r', pause, ...args], { stdio: ['ignore', 'pipe', 'pipe', 'pipe'] })
  t.teardown(() => { if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL') })
  let stdout = ''
  let stderr = ''
  child.stdout.setEncoding('utf8').on('data', (d) => (stdout += d))
  child.stderr.setEncoding('utf8').on('data', (d) => (stderr += d))
  child.stdio[3].on('error', () => {}) // its end closes as the child exits
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })))
  for (const end = Date.now() + 15_000; !stdout.startsWith(firstLine) && Date.now() < end;) await sleep(10)
  const atSignal = stdout
  child.kill(signal)
  await sleep(100) // delivered while the child waits (a process killed by it exits meanwhile)
  child.stdio[3].end('go')
  const end = await Promise.race([exited, sleep(20_000).then(() => ({ code: 'hung' }))])
  return { atSignal, stdout, stderr, end }
}

module.exports = { signalAtFirstLine, withoutBackendWarning, lib, dist, backends, surfaceOn, faultsOf, topicNumbers, prng, within, jsonFromChild, request, sleep, waitFor, steppingClock, shiftedDateNow }

/**
 * A worker thread that makes the calls a test scripts, one at a time: `await worker.call('t', 'g',
 * 'dispatch', 5)` (group undefined for a topic call) resolves with the result, or rejects with an
 * error carrying the worker's error code. `close()` terminates it.
 */
async function scriptedWorker(surface) {
  const { Worker } = require('node:worker_threads')
  const worker = new Worker(path.join(__dirname, 'fixtures', 'scripted-worker.js'), { workerData: { shared: surface.share() }, execArgv: [] })
  const pending = new Map()
  let next = 0
  await new Promise((resolve, reject) => {
    worker.once('message', resolve)
    worker.once('error', reject)
  })
  worker.on('message', ({ id, result, error, message }) => {
    const { resolve, reject } = pending.get(id)
    pending.delete(id)
    if (error === undefined) resolve(result)
    else reject(Object.assign(new Error(message), { code: error }))
  })
  return {
    call(topic, group, op, ...args) {
      const id = next++
      return new Promise((resolve, reject) => {
        pending.set(id, { resolve, reject })
        worker.postMessage({ id, topic, group, op, args })
      })
    },
    close: () => worker.terminate(),
  }
}

module.exports.scriptedWorker = scriptedWorker

/**
 * Threads played in this one, each with its own memory, registry, recorder and handles over one
 * arena (so that "stopped between two steps of a call" is certain): `threads[tid].alive` is what
 * /proc says of each. `read(side)` is a snapshot read as a scrape makes it.
 */
function played(backend) {
  const { Memory } = require(path.join(dist, 'core', 'memory'))
  const { createArena } = require(path.join(dist, 'core', 'backend'))
  const { Registry } = require(path.join(dist, 'core', 'registry'))
  const { Recorder } = require(path.join(dist, 'core', 'recording'))
  const { Handles } = require(path.join(dist, 'core', 'handles'))
  const { SnapshotReader } = require(path.join(dist, 'core', 'reader'))
  const { resolveConfig } = require(path.join(dist, 'core', 'config'))
  const arena = createArena(backend)
  const threads = { 1: { alive: true }, 2: { alive: true }, 3: { alive: true } }
  const liveness = (tid) => (threads[tid]?.alive ? 'alive' : 'gone')
  const config = resolveConfig({})
  const side = (fresh, tid) => {
    const memory = new Memory(arena, fresh, liveness)
    const row = memory.claimRow(tid === null ? null : { tid, start: 100 + tid })
    const registry = new Registry(memory, config)
    const recorder = new Recorder(registry, row, () => {})
    const handles = new Handles(recorder)
    return { memory, row, registry, recorder, handles }
  }
  const main = side(true, 1)
  const worker = side(false, 2)
  const readers = new Map()
  const read = (side = main) => {
    side.memory.lock()
    try {
      side.registry.sync()
      if (!readers.has(side)) readers.set(side, new SnapshotReader(side.registry))
      return readers.get(side).topics(true)
    } finally {
      side.memory.unlock()
    }
  }
  const topicNumbers = (name, side = main) => read(side).find((x) => x.name === name)
  return { threads, main, worker, side, read, topicNumbers }
}

module.exports.played = played

/**
 * promtool (PROMTOOL=/path overrides the one on PATH), or undefined when it is missing: the test
 * is then skipped locally and fails in CI, which installs Debian's prometheus package.
 */
function promtoolFor(t) {
  const bin = process.env.PROMTOOL || 'promtool'
  const probe = require('node:child_process').spawnSync(bin, ['--version'], { encoding: 'utf8' })
  if (!probe.error || probe.error.code !== 'ENOENT') return bin
  const inCI = Boolean(process.env.CI) && !/^(0|false)$/i.test(process.env.CI)
  if (inCI) t.fail(`${bin} is not on PATH, but CI must have it: .ci/run installs Debian's prometheus package`)
  else t.plan(0, `${bin} not found: install Debian's prometheus package (apt-get install --no-install-recommends prometheus) to check the rules`)
  return undefined
}
module.exports.promtoolFor = promtoolFor
