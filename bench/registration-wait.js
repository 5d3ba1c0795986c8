'use strict'
// How long a main-thread registration can wait behind a scrape. The scrape thread reads its
// snapshot under the registration lock (docs/scrape-thread.md), so a new topic's registration, its
// first append to a partition, a group's registration and its first window wait for that read to
// end. This registers a new topic the way a broker with dynamic topics does (topic, append, group,
// send, floor) every millisecond for a few seconds, with another process scraping /metrics in a
// loop and, in alternate rounds, with no scraper, on a surface that already holds a large topology;
// it prints each arm's p50, p99 and maximum per registration.
//
//   node bench/registration-wait.js [--topics 1000] [--partitions 4] [--groups 4] [--rounds 4] [--seconds 3]
const path = require('node:path')
const { spawn } = require('node:child_process')
const { createSurface } = require(path.join(__dirname, '..', 'dist'))
const { flag } = require('./harness')

const TOPICS = flag('--topics', 1000)
const PARTITIONS = flag('--partitions', 4)
const GROUPS = flag('--groups', 4)
const ROUNDS = flag('--rounds', 4)
const SECONDS = flag('--seconds', 3)

/** Another process that scrapes /metrics over two connections until killed (at most `seconds` + 5 s). */
function scraper(port, seconds) {
  const code = `
    const http = require('node:http')
    const end = Date.now() + ${(seconds + 5) * 1000}
    const next = () => { if (Date.now() < end) http.get({ host: '127.0.0.1', port: ${port}, path: '/metrics' }, (res) => { res.resume(); res.on('end', next) }).on('error', () => {}) }
    next(); next()`
  return spawn(process.execPath, ['-e', code], { stdio: 'ignore' })
}

/** Registers one new topic every millisecond for `seconds`; resolves with the time each took, in ms. */
function registrations(surface, prefix, seconds) {
  return new Promise((resolve) => {
    const waits = []
    const end = Date.now() + seconds * 1000
    let i = 0
    const step = () => {
      if (Date.now() >= end) return resolve(waits)
      const started = process.hrtime.bigint()
      const topic = surface.topic(`${prefix}${i++}`)
      topic.append(0, 100)
      const group = topic.group('g')
      group.send(0, 1)
      group.floor(0)
      waits.push(Number(process.hrtime.bigint() - started) / 1e6)
      surface.removeTopic(topic.name)
      setTimeout(step, 1)
    }
    step()
  })
}

function quantiles(waits) {
  const sorted = [...waits].sort((a, b) => a - b)
  const at = (q) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]
  return { n: sorted.length, p50: at(0.5), p99: at(0.99), max: sorted[sorted.length - 1] }
}

async function main() {
  const surface = createSurface({ max_topics: TOPICS + 100 })
  for (let t = 0; t < TOPICS; t++) {
    const topic = surface.topic(`t${t}`)
    for (let p = 0; p < PARTITIONS; p++) topic.append(p, 100, 5)
    for (let g = 0; g < GROUPS; g++) {
      const group = topic.group(`g${g}`)
      for (let p = 0; p < PARTITIONS; p++) group.send(p, 1), group.settle(p, 1, 'delivered')
    }
  }
  const server = await surface.listen({ host: '127.0.0.1', port: 0 })
  const arms = { scraped: [], quiet: [] }
  for (let round = 0; round < ROUNDS; round++) {
    for (const arm of round % 2 === 0 ? ['scraped', 'quiet'] : ['quiet', 'scraped']) {
      const child = arm === 'scraped' ? scraper(server.port, SECONDS) : undefined
      await new Promise((resolve) => setTimeout(resolve, 300))
      arms[arm].push(...(await registrations(surface, `${arm}${round}-`, SECONDS)))
      child?.kill()
    }
  }
  console.log(`${TOPICS} topics × ${PARTITIONS} partitions × ${GROUPS} groups, ${surface.scrapeThread.scrapes} scrapes on the scrape thread; ms per new topic (topic, append, group, send, floor):`)
  for (const [arm, waits] of Object.entries(arms)) {
    const q = quantiles(waits)
    console.log(`  ${arm === 'scraped' ? 'while scraped' : 'no scrapes   '}  n ${q.n}  p50 ${q.p50.toFixed(3)}  p99 ${q.p99.toFixed(3)}  max ${q.max.toFixed(3)}`)
  }
  await surface.close()
}

main().catch((error) => {
  console.error(error)
  process.exitCode = 1
})
