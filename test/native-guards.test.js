'use strict'
// The native core defends itself: every exported function checks its argument count, types and
// ranges and throws a JS error naming the argument, instead of touching memory out of bounds (an
// index that wrapped at 2^32 and wrote past the chunk table, a read of 2,048 doubles from a
// shorter array, an unchecked cast). lib/ validates first; these calls go to the addon directly.
const t = require('tap')
const path = require('node:path')

let addon
try {
  // The sanitizer run (scripts/test-asan.sh) points MQ_METRICS_ADDON_PATH at its own build.
  addon = require(process.env.MQ_METRICS_ADDON_PATH || path.join(__dirname, '..', 'build', 'Release', 'mq_metrics.node'))
} catch {}

t.test('every export checks what it is given', { skip: addon ? false : 'no native addon built' }, (t) => {
  t.same(Object.keys(addon).sort(), ['arenaChunk', 'arenaCreate', 'arenaRelease', 'latencyBuckets', 'latencyQuantiles'], 'no export that lib/ does not use')
  const cases = [
    ['arenaCreate', [], TypeError, /expected 1 arguments, got 0/],
    ['arenaCreate', ['65536'], TypeError, /chunkBytes must be a number/],
    ['arenaCreate', [0], RangeError, /chunkBytes must be an integer from 64/],
    ['arenaCreate', [65537], RangeError, /multiple of 64/],
    ['arenaCreate', [2 ** 31], RangeError, /chunkBytes/],
    ['arenaChunk', [1], TypeError, /expected 2 arguments/],
    ['arenaChunk', [0, 0], RangeError, /id must be an integer from 1/],
    ['arenaChunk', [1, -1], RangeError, /k must be an integer from 0/],
    ['arenaChunk', [1, 2 ** 32 - 1], RangeError, /k must be an integer/], // was: k + 1 wrapped to 0, then a write past the table
    ['arenaChunk', [1, 1.5], RangeError, /k must be an integer/],
    ['arenaChunk', [1, NaN], RangeError, /k must be an integer/],
    ['arenaChunk', [{}, 0], TypeError, /id must be a number/],
    ['arenaRelease', [], TypeError, /expected 1 arguments/],
    ['arenaRelease', [-3], RangeError, /id must be an integer/],
    ['latencyQuantiles', [new Float64Array(2048)], TypeError, /expected 2 arguments/],
    ['latencyQuantiles', [new Float32Array(2048), 0], TypeError, /counts must be a Float64Array/],
    ['latencyQuantiles', [[1, 2, 3], 0], TypeError, /counts must be a Float64Array/],
    ['latencyQuantiles', [new Float64Array(100), 0], RangeError, /must hold 2048 buckets from offset/], // was: a read of 2,048 doubles
    ['latencyQuantiles', [new Float64Array(2048), 1], RangeError, /must hold 2048 buckets/],
    ['latencyQuantiles', [new Float64Array(2048), -1], RangeError, /offset must be an integer/],
  ]
  for (const [name, args, type, message] of cases) {
    t.throws(() => addon[name](...args), { name: type.name, message }, `${name}(${args.map((a) => (ArrayBuffer.isView(a) ? `${a.constructor.name}(${a.length})` : JSON.stringify(a))).join(', ')})`)
  }
  const id = addon.arenaCreate(65536)
  t.equal(addon.arenaChunk(id, 3).byteLength, 65536, 'good arguments still work')
  t.equal(addon.latencyQuantiles(new Float64Array(4096), 2048), null, 'an empty window in range: null')
  addon.arenaRelease(id)
  t.end()
})
