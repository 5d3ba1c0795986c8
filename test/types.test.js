'use strict'
// design §12: the public types catch what a broker author gets wrong at compile time — a view's
// name, a field of another view, an event's name, a settlement's outcome. Compiled with the
// project's own TypeScript against the published declarations (dist/*.d.ts).
const t = require('tap')
require('./helpers') // children spawned here start without tap's hooks (see helpers.js)
const path = require('node:path')
const { spawnSync } = require('node:child_process')

const fixtures = path.join(__dirname, 'fixtures', 'types')
const tsc = require.resolve('typescript/bin/tsc')

// One compiler run for both files (it costs seconds): errors are told apart by file.
const r = spawnSync(process.execPath, [tsc, '--noEmit', '--skipLibCheck', '--strict', '--target', 'es2022', '--module', 'commonjs', '--types', 'node', path.join(fixtures, 'good.ts'), path.join(fixtures, 'bad.ts')], { encoding: 'utf8' })
const errors = (r.stdout + r.stderr).split('\n').filter((l) => /error TS/.test(l))

t.test('the right calls compile', async (t) => {
  t.same(errors.filter((e) => e.includes('good.ts')), [])
})

t.test('each mistake is a compile error on its own line', async (t) => {
  const bad = errors.filter((e) => e.includes('bad.ts'))
  const lines = new Set(bad.map((e) => Number(/\((\d+),\d+\)/.exec(e)[1])))
  t.same([...lines].sort((a, b) => a - b), [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18], bad.join('\n'))
  t.equal(errors.length, bad.length, 'no other errors')
})
