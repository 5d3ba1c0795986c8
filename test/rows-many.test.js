'use strict'
// A surface takes far more attaches over its life than it has thread rows (MAX_ROWS − 1): the
// rows of exited threads are reused (see rows.test.js for the row-level behaviour).
const t = require('tap')
const path = require('node:path')
const { backends } = require('./helpers')
const { MAX_ROWS } = require('../dist/memory')

// ~1,000 worker start-ups per backend: ~1 minute each here, more on a loaded machine. Bounded
// below by the per-child kill; this file gets 10 minutes instead of the default 5.
t.setTimeout(600_000)

t.test(`${MAX_ROWS + 40} attaches to one surface, 16 at a time: more than there are rows`, async (t) => {
  // Without reuse, attach number MAX_ROWS would throw RangeError. In child processes: see the fixture.
  const { spawn } = require('node:child_process')
  const TOTAL = MAX_ROWS + 40
  for (const backend of backends()) {
    const r = await new Promise((resolve, reject) => {
      // tap's process tracker puts its loader into every child's NODE_OPTIONS, and from there
      // into every worker (~3× the start-up cost): `env -u` takes it out again.
      const args = ['-c', 'exec env -u NODE_OPTIONS "$0" "$@"', process.execPath, path.join(__dirname, 'fixtures', 'row-churn.js'), backend, String(TOTAL)]
      const child = spawn('sh', args, { stdio: ['ignore', 'pipe', 'pipe'] })
      let out = ''
      let err = ''
      child.stdout.on('data', (d) => (out += d))
      child.stderr.on('data', (d) => (err += d))
      const timer = setTimeout(() => child.kill('SIGKILL'), 280_000)
      child.on('close', (code) => {
        clearTimeout(timer)
        try { resolve(JSON.parse(out)) } catch { reject(new Error(`row-churn ${backend} exited ${code}: ${err.slice(0, 1000)}`)) }
      })
    })
    t.comment(`${backend}: ${r.total} attaches in ${r.seconds} s, at most ${r.peakRows} thread rows`)
    t.ok(r.peakRows <= 17, `${backend}: at most the main thread's row and one per worker alive at once (${r.peakRows})`)
    t.equal(r.produced, TOTAL * 100, `${backend}: every message every worker published is counted`)
    t.equal(r.partitions, TOTAL)
    t.equal(r.exactSeqs, true, `${backend}: every partition's last_seq is its worker's last`)
  }
})
