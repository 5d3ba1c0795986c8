'use strict'
// Node 24 and 26 pool Buffer.allocUnsafe() up to 32 KiB in 64 KiB slabs (Node 20: up to 4 KiB in 8 KiB).
// A body rendered into a pooled buffer shares its ArrayBuffer with other Buffers; recycling it
// whole for the next render wrote over them (label texts among them: corrupt /metrics lines on
// Node 24 and 26). Their pool is played here on any version: Buffer.poolSize is the slab's size.
const t = require('tap')
const { backends, surfaceOn } = require('./helpers')

for (const backend of backends()) {
  t.test(`${backend}: renders into buffers of their own, whatever Buffer's pool holds`, (t) => {
    const poolSize = Buffer.poolSize
    t.teardown(() => { Buffer.poolSize = poolSize })
    Buffer.poolSize = 64 * 1024
    Buffer.allocUnsafe(16 * 1024) // the old slab has no room for it: a slab of the new size starts
    const others = Array.from({ length: 40 }, (_, i) => Buffer.from(`another buffer ${i} `.repeat(10)))
    const surface = surfaceOn(t, backend)
    for (let i = 0; i < 30; i++) {
      const topic = surface.topic(`orders.${i}`)
      topic.produced(0, 5, 5, 5)
      topic.group(`billing-${i}`)
    }
    const steady = (body) => body.replace(/^mq_broker_uptime_seconds .*$/m, '')
    const first = steady(surface.render())
    let same = 0
    for (let i = 0; i < 20; i++) if (steady(surface.render()) === first) same++
    t.equal(same, 20, 'every render shows what the first did')
    t.ok(others.every((b, i) => b.toString() === `another buffer ${i} `.repeat(10)), "other Buffers of the pool are untouched")
    t.end()
  })
}
