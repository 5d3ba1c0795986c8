'use strict'
// How long the broker's thread is held while an endpoint is answered (docs/scrape-thread.md). A
// surface of many topics (one group, one partition each) serves HTTP; a client in another process
// asks for one path at a time; a setImmediate ticker on the broker's thread records the longest
// gap between its turns while each answer is prepared and sent. Prints, per path, the median and
// the maximum of that longest gap over the requests, with idle windows of the same length first.
// `--churn MS` registers a new topic every MS ms meanwhile, as a broker with dynamic topics does
// (the names change between any two requests). `--off N`: the first N topics also have a group kept
// by floor whose settlement is under way (its floor moved, its delivered() not yet made), so
// /stats?filter=conservation shows them with a residual (docs/scrape-thread.md).
//
//   node bench/holds.js [--topics 20000] [--requests 6] [--churn 0] [--off 0] [--paths /healthz,/stats?filter=topics,…]
const path = require('node:path')
const { spawn } = require('node:child_process')
const readline = require('node:readline')
const { createSurface } = require(path.join(__dirname, '..', 'dist'))
const { flag } = require('./harness')

const TOPICS = flag('--topics', 20000)
const REQUESTS = flag('--requests', 6)
const CHURN = flag('--churn', 0)
const OFF = flag('--off', 0)
const at = process.argv.indexOf('--paths')
const PATHS = at > 0 ? process.argv[at + 1].split(',') : ['/healthz', '/stats?filter=topics', '/stats?filter=groups', '/stats?filter=conservation', '/stats?filter=partitions', '/stats?filter=quorum', '/metrics']

const surface = createSurface({ max_topics: TOPICS + 10_000 })
for (let i = 0; i < TOPICS; i++) {
  const topic = surface.topic(`topic.${i}`)
  const group = topic.group('group-0')
  const seq = topic.append(0, 100)
  group.send(0, seq)
  group.settle(0, seq, 'delivered')
  if (i < OFF) {
    const floor = topic.group('floor-level')
    floor.dispatch(1)
    floor.ackFloor(0, seq)
  }
}

let last = performance.now()
let longest = 0
let ticking = true
const tick = () => {
  const now = performance.now()
  longest = Math.max(longest, now - last)
  last = now
  if (ticking) setImmediate(tick)
}
tick()
let churned = 0
const churn = CHURN > 0 ? setInterval(() => surface.topic(`new.${churned++}`), CHURN) : undefined
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function main() {
  const { url } = await surface.listen({ port: 0 })
  // The client: reads a path per line, answers with status, bytes and ms once the body is in.
  const client = spawn(process.execPath, ['-e', `
    require('node:readline').createInterface({ input: process.stdin }).on('line', async (p) => {
      const started = Date.now()
      const res = await fetch(${JSON.stringify(url)} + p, { headers: { 'accept-encoding': p === '/metrics' ? 'gzip' : 'identity' }, signal: AbortSignal.timeout(60_000) })
      const body = await res.arrayBuffer()
      console.log(res.status + ' ' + body.byteLength + ' ' + (Date.now() - started))
    })`], { stdio: ['pipe', 'pipe', 'inherit'] })
  const lines = readline.createInterface({ input: client.stdout })
  const answer = () => new Promise((resolve) => lines.once('line', resolve))
  console.log(`backend ${surface.backend}, ${TOPICS} topics × 1 group × 1 partition${CHURN > 0 ? `, a new topic every ${CHURN} ms` : ''}; longest hold of the broker's thread per request (ms)`)
  for (const which of [null, ...PATHS]) {
    const holds = []
    let seen = ''
    for (let i = 0; i < REQUESTS; i++) {
      await sleep(200)
      longest = 0
      last = performance.now()
      if (which === null) await sleep(500)
      else {
        client.stdin.write(which + '\n')
        seen = await answer()
      }
      holds.push(longest)
    }
    holds.sort((a, b) => a - b)
    const label = which ?? 'idle (500 ms windows)'
    console.log(`${label.padEnd(30)} median ${holds[holds.length >> 1].toFixed(1).padStart(5)}  max ${holds.at(-1).toFixed(1).padStart(5)}${which === null ? '' : `   (last: status, bytes, ms = ${seen})`}`)
  }
  ticking = false
  clearInterval(churn)
  client.kill()
  await surface.close()
}

main()
