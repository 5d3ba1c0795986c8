'use strict'
// Issue #2: require() and import both work from another project's node_modules, with types.
const t = require('tap')
require('./helpers') // children spawned here start without tap's hooks (see helpers.js)
const fs = require('node:fs')
const os = require('node:os')
const path = require('node:path')
const { execFileSync } = require('node:child_process')

const root = path.join(__dirname, '..')

t.test('CommonJS and ESM consumers in another project', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'mq-consumer-'))
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }))
  fs.mkdirSync(path.join(dir, 'node_modules'))
  fs.symlinkSync(root, path.join(dir, 'node_modules', 'mq-metrics'), 'dir')
  fs.writeFileSync(path.join(dir, 'a.cjs'), `
    const { createSurface, METRICS_CONTENT_TYPE } = require('mq-metrics')
    const s = createSurface(); s.topic('t').produced(0, 1, 1)
    console.log(typeof createSurface, METRICS_CONTENT_TYPE, s.backend); s.close()`)
  fs.writeFileSync(path.join(dir, 'b.mjs'), `
    import { createSurface, attachSurface, ConfigError, FatalInvariantError, METRICS_CONTENT_TYPE } from 'mq-metrics'
    const s = createSurface(); console.log(typeof attachSurface, typeof ConfigError, typeof FatalInvariantError, METRICS_CONTENT_TYPE); await s.close()`)
  const cjs = execFileSync(process.execPath, ['a.cjs'], { cwd: dir, encoding: 'utf8', timeout: 30_000 })
  t.match(cjs, /^function text\/plain; version=0\.0\.4; charset=utf-8 (native|js)\n$/, 'require() works')
  const esm = execFileSync(process.execPath, ['b.mjs'], { cwd: dir, encoding: 'utf8', timeout: 30_000 })
  t.equal(esm, 'function function function text/plain; version=0.0.4; charset=utf-8\n', 'import works')
  t.ok(fs.existsSync(path.join(root, 'dist', 'index.d.ts')), 'type declarations ship')
  // The exports docs/api.md lists, no more and no fewer, the same from require() and import.
  const EXPORTS = ['ClosedError', 'ConfigError', 'FOLLOWER_LAG', 'FatalInvariantError', 'LimitError', 'METRICS_CONTENT_TYPE', 'MqMetricsError', 'READ_ONLY_DEGRADED', 'RemovedGroupError', 'RemovedTopicError', 'StatsError', 'UsageError', 'attachSurface', 'createSurface']
  fs.writeFileSync(path.join(dir, 'c.cjs'), `console.log(JSON.stringify(Object.keys(require('mq-metrics')).sort()))`)
  fs.writeFileSync(path.join(dir, 'd.mjs'), `console.log(JSON.stringify(Object.keys(await import('mq-metrics')).filter((k) => k !== 'default').sort()))`)
  t.same(JSON.parse(execFileSync(process.execPath, ['c.cjs'], { cwd: dir, encoding: 'utf8', timeout: 30_000 })), EXPORTS, 'require() exports')
  t.same(JSON.parse(execFileSync(process.execPath, ['d.mjs'], { cwd: dir, encoding: 'utf8', timeout: 30_000 })), EXPORTS, 'import exports')
  const pkg = require('../package.json')
  t.same(Object.keys(pkg.dependencies || {}), [], 'zero runtime dependencies')
})
