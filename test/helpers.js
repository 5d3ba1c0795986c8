'use strict'
// Shared by the test files: which backends to run against, and a surface that is always closed.
const path = require('node:path')

const dist = path.join(__dirname, '..', 'dist')
const lib = require(dist)

/** Every backend this machine can run. In CI the native core must be built (SPEC §1). */
function backends() {
  let native = false
  try {
    require(path.join(__dirname, '..', 'build', 'Release', 'mq_metrics.node'))
    native = true
  } catch {}
  if (!native && process.env.CI) throw new Error('CI: the native core was not built, so its tests cannot run')
  return native ? ['js', 'native'] : ['js']
}

/** Creates a surface on `backend` (the environment variable is read at createSurface). */
function surfaceOn(t, backend, config) {
  const before = process.env.MQ_METRICS_BACKEND
  process.env.MQ_METRICS_BACKEND = backend
  let surface
  try {
    surface = lib.createSurface(config)
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

module.exports = { lib, dist, backends, surfaceOn, faultsOf, topicNumbers, prng, within }
