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

module.exports = { lib, dist, backends, surfaceOn, faultsOf, topicNumbers }
