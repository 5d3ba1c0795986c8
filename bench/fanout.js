'use strict'
// One topic with many groups: an MQTT topic every device subscribes to (a firmware channel), each
// client's subscription a group (examples/aedes). All of them subscribe at once after a broker
// restarts, and leave at once when a network split drops their sessions. This registers N groups
// on one topic (each with a first send() and settle(), as a subscriber's first message makes its
// settlement window), then removes them one by one, and prints µs per registration and per
// removal for each N: flat in N is what a broker wants (until 2026-11-28 both grew with N, each
// call reading or copying the topic's list of groups: 64,000 groups took 40 s to register, 115 s to remove).
//
//   node bench/fanout.js [--groups 1000,16000,64000] [--window 1024]
const path = require('node:path')
const { createSurface } = require(path.join(__dirname, '..', 'dist'))

const at = process.argv.indexOf('--groups')
const SIZES = (at === -1 ? '1000,16000,64000' : process.argv[at + 1]).split(',').map(Number)
const w = process.argv.indexOf('--window')
const WINDOW = w === -1 ? 1024 : Number(process.argv[w + 1])

for (const n of SIZES) {
  const surface = createSurface({ max_groups_per_topic: Math.max(n, 256) })
  const topic = surface.topic('firmware')
  topic.append(0, 100)
  let started = process.hrtime.bigint()
  for (let i = 0; i < n; i++) {
    const group = topic.group(`device-${i}`, { settle_window: WINDOW })
    group.send(0, 1)
    group.settle(0, 1, 'delivered')
  }
  const registered = Number(process.hrtime.bigint() - started) / 1e3 / n
  surface.render() // a scrape between: the groups are listed once
  started = process.hrtime.bigint()
  for (let i = 0; i < n; i++) topic.removeGroup(`device-${i}`)
  const removed = Number(process.hrtime.bigint() - started) / 1e3 / n
  console.log(`${surface.backend} ${String(n).padStart(6)} groups on one topic: ${registered.toFixed(1)} µs per registration (with its first send and settle), ${removed.toFixed(1)} µs per removal`)
  surface.close()
}
