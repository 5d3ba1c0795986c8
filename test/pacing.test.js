'use strict'
// Scrape pacing (docs/endpoints.md): scrapes back to back take at most `scrapeShare` of the main thread; a
// scrape now and then runs out of the burst, at once. The pacer against a fake clock; the options
// and their errors; the endpoints paced on both backends: answers still exact, the event loop free
// while a scrape waits, /healthz not held back, close() while a scrape waits.
const t = require('tap')
const zlib = require('node:zlib')
const { lib, backends, surfaceOn, within, steppingClock, faultsOf } = require('./helpers')
const { ScrapePacer, ScrapeScheduler } = require('../dist/http/pacing.js')
const { resolveSurfaceOptions, DEFAULT_SCRAPE_SHARE, DEFAULT_SCRAPE_BURST_MS } = require('../dist/http/options.js')

/** The exposition without its uptime line (the one value that moves between two renders of one state). */
const strip = (s) => s.replace(/^mq_broker_uptime_seconds .*$/m, '')

function fakeClock(start = 1000) {
  const clock = { now: start, read: () => clock.now }
  return clock
}

t.test('ScrapePacer against a fake clock', async (t) => {
  const clock = fakeClock()
  const pacer = new ScrapePacer(0.5, 10, clock.read)
  t.equal(pacer.delay(), 0, 'a full bucket: run now')
  t.equal(pacer.tokens, 10)
  clock.now += 30
  pacer.spend(30) // a 30 ms slice: 10 in the bucket, 15 back while it ran
  t.equal(pacer.tokens, -5, 'in debt by what the slice took beyond the bucket and its refill')
  t.equal(pacer.delay(), 10, 'the debt at 0.5 ms per ms: 10 ms')
  clock.now += 9
  t.equal(pacer.delay(), 1, 'not yet: at least 1 ms more')
  clock.now += 1
  t.equal(pacer.delay(), 0, 'the debt paid: run')
  clock.now += 1_000_000
  t.equal(pacer.delay(), 0)
  t.equal(pacer.tokens, 10, 'the bucket never holds more than the burst')
  pacer.spend(10.5)
  t.equal(pacer.delay(), 1, 'a debt of 0.5 ms at 0.5 ms per ms: 1 ms')
})

t.test('ScrapePacer: share 1 never waits; burst 0 waits after every slice', async (t) => {
  const clock = fakeClock()
  const free = new ScrapePacer(1, 0, clock.read)
  const strict = new ScrapePacer(0.25, 0, clock.read)
  for (let i = 0; i < 100; i++) {
    t.equal(free.delay(), 0)
    clock.now += 7
    free.spend(7)
  }
  t.equal(strict.delay(), 0, 'an empty bucket, not in debt: one slice may run')
  clock.now += 2
  strict.spend(2)
  t.equal(strict.delay(), 6, '2 ms of work, 0.5 ms of it earned while it ran: 1.5 ms of debt at 0.25 ms per ms')
})

t.test('ScrapePacer: back to back, the busy share converges to `share`', async (t) => {
  for (const [share, burst, slice] of [[0.3, 50, 10], [0.1, 0, 3], [0.5, 200, 0.7], [1, 50, 10]]) {
    const clock = fakeClock()
    const pacer = new ScrapePacer(share, burst, clock.read)
    let busy = 0
    const start = clock.now
    while (clock.now - start < 60_000) {
      const wait = pacer.delay()
      if (wait > 0) {
        clock.now += wait
        continue
      }
      clock.now += slice
      busy += slice
      pacer.spend(slice)
    }
    const elapsed = clock.now - start
    t.ok(busy <= share * elapsed + burst + slice, `share ${share}: busy ${busy.toFixed(0)} of ${elapsed.toFixed(0)} ms, at most share × elapsed + burst + one slice`)
    // Waits are rounded up to whole ms: a short slice loses a little per wait, never a quarter.
    t.ok(busy >= 0.75 * share * elapsed, `share ${share}: not starved (busy ${busy.toFixed(0)} ms ≥ 3/4 of share × elapsed)`)
  }
})

t.test('ScrapePacer refuses a share or burst out of range', async (t) => {
  for (const share of [0, -0.1, 1.01, NaN]) t.throws(() => new ScrapePacer(share, 10), RangeError, `share ${share}`)
  for (const burst of [-1, Infinity, NaN]) t.throws(() => new ScrapePacer(0.5, burst), RangeError, `burst ${burst}`)
})

t.test('createSurface() options: defaults, errors naming the key, frozen', async (t) => {
  t.same(resolveSurfaceOptions(undefined), { scrapeShare: DEFAULT_SCRAPE_SHARE, scrapeBurstMs: DEFAULT_SCRAPE_BURST_MS, maxConnections: 1024, maxScrapeBytes: 64 * 2 ** 20, scrapeThread: true })
  t.equal(DEFAULT_SCRAPE_SHARE, 0.3)
  t.equal(DEFAULT_SCRAPE_BURST_MS, 50)
  t.same(resolveSurfaceOptions({ scrapeShare: 1, scrapeBurstMs: 0 }), { scrapeShare: 1, scrapeBurstMs: 0, maxConnections: 1024, maxScrapeBytes: 64 * 2 ** 20, scrapeThread: true })
  t.same(resolveSurfaceOptions({ scrapeShare: 0.01, scrapeBurstMs: 60_000, maxConnections: 1, maxScrapeBytes: 65536, scrapeThread: false }), { scrapeShare: 0.01, scrapeBurstMs: 60_000, maxConnections: 1, maxScrapeBytes: 65536, scrapeThread: false }, 'both ends of the ranges')
  const cases = [
    [null, 'options', /must be an object, got null/],
    [[], 'options', /must be an object/],
    [{ scrapeshare: 0.5 }, 'scrapeshare', /unknown option \(known options: scrapeShare, scrapeBurstMs, maxConnections, maxScrapeBytes, scrapeThread\)/],
    [{ scrapeThread: 'yes' }, 'scrapeThread', /must be true or false, got the string "yes"/],
    [{ scrapeShare: 0 }, 'scrapeShare', /from 0\.01 to 1/],
    [{ scrapeShare: 0.009 }, 'scrapeShare', /from 0\.01 to 1 \(1: unpaced\), got 0\.009/],
    [{ scrapeShare: 1.5 }, 'scrapeShare', /from 0\.01 to 1/],
    [{ scrapeShare: NaN }, 'scrapeShare', /from 0\.01 to 1/],
    [{ scrapeShare: '0.5' }, 'scrapeShare', /from 0\.01 to 1 \(1: unpaced\), got the string "0\.5"/],
    [{ scrapeBurstMs: -1 }, 'scrapeBurstMs', /from 0 to 60000, got -1/],
    [{ scrapeBurstMs: Infinity }, 'scrapeBurstMs', /from 0 to 60000/],
    [{ scrapeBurstMs: 60_001 }, 'scrapeBurstMs', /from 0 to 60000/],
    [{ maxConnections: 0 }, 'maxConnections', /from 1 to 65535, got 0/],
    [{ maxConnections: 1.5 }, 'maxConnections', /from 1 to 65535/],
    [{ maxConnections: 65536 }, 'maxConnections', /from 1 to 65535/],
    [{ maxScrapeBytes: 65535 }, 'maxScrapeBytes', /from 65536 to 9007199254740991 \(bytes\), got 65535/],
    [{ maxScrapeBytes: 2 ** 53 }, 'maxScrapeBytes', /from 65536 to 9007199254740991 \(bytes\), got 9007199254740992/],
    [{ maxScrapeBytes: '1mb' }, 'maxScrapeBytes', /from 65536 to 9007199254740991 \(bytes\), got the string "1mb"/],
    // null is not "the default", as in the configuration: leave the key out for that.
    [{ scrapeShare: null }, 'scrapeShare', /got null$/],
    [{ scrapeBurstMs: null }, 'scrapeBurstMs', /got null$/],
    [{ maxConnections: null }, 'maxConnections', /got null$/],
    [{ maxScrapeBytes: null }, 'maxScrapeBytes', /got null$/],
    [{ scrapeThread: null }, 'scrapeThread', /must be true or false, got null$/],
  ]
  for (const [options, key, message] of cases) {
    t.throws(() => lib.createSurface({}, options), { name: 'ConfigError', code: 'CONFIG_INVALID', key, message }, `${JSON.stringify(options)} names ${key}`)
  }
  const inherited = Object.create({ scrapeShare: 0.01 })
  t.same(resolveSurfaceOptions(inherited), { scrapeShare: 0.3, scrapeBurstMs: 50, maxConnections: 1024, maxScrapeBytes: 64 * 2 ** 20, scrapeThread: true }, 'an inherited key is not an option')
  const surface = lib.createSurface({}, { scrapeShare: 0.5 })
  t.teardown(() => surface.close())
  t.same(surface.options, { scrapeShare: 0.5, scrapeBurstMs: 50, maxConnections: 1024, maxScrapeBytes: 64 * 2 ** 20, scrapeThread: true })
  t.ok(Object.isFrozen(surface.options))
  t.notOk('scrapeShare' in surface.stats('config'), 'options are not broker configuration: /stats?filter=config is unchanged')
})

/** A handler call with a recording response: `sync` tells whether it was answered inside the call. */
function call(surface, path, headers = {}, onEnd = () => {}) {
  let resolve
  const answered = new Promise((r) => { resolve = r })
  const res = {
    statusCode: 0, headersSent: false, destroyed: false, headers: {},
    setHeader(name, value) { res.headers[name.toLowerCase()] = value },
    once() { return res },
    end(chunk) { res.body = chunk; onEnd(res); resolve(res) },
  }
  t.equal(surface.handler({ url: path, method: 'GET', headers }, res), true)
  return { sync: res.body !== undefined, answered: within(20_000, `GET ${path}`, answered) }
}

/**
 * Puts the pacer deep in debt after the next scrape, on any machine, however loaded: the clock
 * jumps `ms` forward as that scrape's last slice ends, so the pacer charges that slice `ms` more
 * (without it, a scrape that took several slices leaves only its last, maybe tiny, slice as debt).
 * Also counts the renders begun (surface.render() counts too). Undone at teardown.
 */
function debtAfterNextScrape(t, ms) {
  const { Renderer } = require('../dist/exposition/render.js')
  const realNow = performance.now
  let offset = 0
  performance.now = () => realNow.call(performance) + offset
  const { begin, beginGzip } = Renderer.prototype
  const counter = { begins: 0 }
  let armed = true
  const wrap = (original) => function (...args) {
    counter.begins++
    const job = original.apply(this, args)
    if (armed) {
      armed = false
      const step = job.step
      job.step = function (deadline) {
        const done = step.call(this, deadline)
        if (done) offset += ms
        return done
      }
    }
    return job
  }
  Renderer.prototype.begin = wrap(begin)
  Renderer.prototype.beginGzip = wrap(beginGzip)
  t.teardown(() => {
    performance.now = realNow
    Object.assign(Renderer.prototype, { begin, beginGzip })
  })
  return counter
}

function fill(surface, topics) {
  for (let i = 0; i < topics; i++) {
    const topic = surface.topic(`t${i}`)
    for (let p = 0; p < 4; p++) topic.produced(p, 10 + i, 100)
    const group = topic.group('g')
    group.dispatch(3)
    group.delivered(2)
  }
}

/**
 * A surface of 300 topics whose pacer is ≥ 100 ms in debt after one scrape (≥ 1 s to wait at
 * 10%), and a second scrape, made then, still waiting for its turn.
 */
async function waitingScrape(t, backend) {
  const surface = surfaceOn(t, backend, {}, { scrapeShare: 0.1, scrapeBurstMs: 0, scrapeThread: false })
  fill(surface, 300)
  debtAfterNextScrape(t, 100)
  await call(surface, '/metrics').answered
  const waiting = call(surface, '/metrics')
  t.notOk(waiting.sync, 'in debt: the second scrape is not answered inside the call')
  return { surface, waiting }
}

/** 20 topics with a message in flight each, and a last one, zz, quietly off by one (delivered, its floor never moved). */
function offByOne(t, backend) {
  const surface = surfaceOn(t, backend, {}, { scrapeThread: false })
  fill(surface, 20)
  const last = surface.topic('zz')
  last.produced(0, 1, 1)
  last.group('g').dispatch(1)
  last.group('g').delivered(1)
  return surface
}

/**
 * From now on every reading of the clock moves it 5 ms, so each hold of the lock (1 ms of reading)
 * reads one topic; and the event loop's turns are counted until `stop()` (returns their number).
 */
function oneTopicPerHold(t) {
  steppingClock(t, 5)
  let turns = 0
  let pending = true
  const spin = () => { if (pending) (turns++, setImmediate(spin)) }
  setImmediate(spin)
  return () => ((pending = false), turns)
}

for (const backend of backends()) {
  t.test(`${backend}: a scrape in debt waits, the event loop stays free, the body is exact`, async (t) => {
    const surface = surfaceOn(t, backend, {}, { scrapeShare: 0.1, scrapeBurstMs: 0, scrapeThread: false })
    fill(surface, 300)
    debtAfterNextScrape(t, 100)
    const first = call(surface, '/metrics')
    const expected = strip(surface.render())
    t.equal(strip((await first.answered).body.toString('latin1')), expected)
    // Right after, the bucket is ≥ 100 ms in debt: ≥ 1 s to wait at 10%.
    const second = call(surface, '/metrics')
    const gzipped = call(surface, '/metrics', { 'accept-encoding': 'gzip' })
    t.notOk(second.sync, 'in debt: not answered inside the call')
    t.notOk(gzipped.sync)
    let ticks = 0
    const ticker = setInterval(() => ticks++, 1)
    let scraped = false
    second.answered.then(() => (scraped = true))
    const health = call(surface, '/healthz')
    t.equal((await health.answered).statusCode, 200)
    t.notOk(scraped, '/healthz is not paced: answered while the scrapes in debt still wait')
    const plain = await second.answered
    const packed = await gzipped.answered
    clearInterval(ticker)
    t.ok(ticks > 0, `the event loop ran while the scrapes waited (${ticks} timer ticks)`)
    t.equal(plain.statusCode, 200)
    t.equal(strip(plain.body.toString('latin1')), expected, 'the paced plain scrape: the whole exposition')
    t.equal(packed.headers['content-encoding'], 'gzip')
    t.equal(strip(zlib.gunzipSync(packed.body).toString('latin1')), expected, 'the paced gzip scrape: the whole exposition')
  })

  t.test(`${backend}: /healthz checks in slices with the event loop free between them; what the last slice finds is counted`, async (t) => {
    const surface = offByOne(t, backend)
    const stop = oneTopicPerHold(t)
    const health = call(surface, '/healthz')
    t.notOk(health.sync, 'not answered inside the call')
    await new Promise((resolve) => setImmediate(resolve))
    const again = call(surface, '/healthz') // while the first check is under way: it shares it
    const res = await health.answered
    const turns = stop()
    t.ok(turns >= 20, `the event loop ran between the slices (${turns} turns for 21 topics)`)
    t.equal(JSON.parse(res.body.toString()).faults, 1, 'the broken group, read in the last slice, is counted')
    t.equal(JSON.parse((await again.answered).body.toString()).faults, 1, 'the second probe: the same check')
    t.equal(surface.stats('faults').counts.CONSERVATION_BROKEN, 1)
  })

  t.test(`${backend}: /healthz reads topics unsorted and no carries: the check finds the same, colliding labels and removed names included`, async (t) => {
    // /healthz's reader lists topics as its thread learnt them, unsorted, and reads nothing carried
    // (lib/core/reader.ts checkOnly): the check reads neither. Here a broken group on a topic
    // registered first (it sorts last), labels that collide, a removed colliding name that left a
    // carry, and one registered after the first probe, one topic per hold.
    const surface = surfaceOn(t, backend, {}, { scrapeThread: false })
    const faults = faultsOf(surface)
    const broken = surface.topic('zz.broken')
    broken.produced(0, 1, 1)
    broken.group('g').dispatch(1)
    fill(surface, 10)
    for (const name of ['a.b', 'a_b', 'a-b']) {
      const topic = surface.topic(name)
      const seq = topic.append(0, 10)
      topic.group('g').send(0, seq)
      topic.group('g').settle(0, seq, 'delivered')
    }
    surface.removeTopic('a-b') // its counts stay in the label's series: a carry
    t.equal(surface.stats('collisions').topics.length, 1, 'a label collision with a carry')
    t.equal(faults.length, 0)
    broken.group('g').delivered(1) // off by one from now on: the floor never moves (after the read above, which checks too)
    const stop = oneTopicPerHold(t)
    const first = JSON.parse((await call(surface, '/healthz').answered).body.toString())
    t.equal(first.faults, 1, 'the broken group is found')
    surface.topic('b.c') // a change of names between probes
    const second = JSON.parse((await call(surface, '/healthz').answered).body.toString())
    stop()
    t.equal(second.faults, 1, 'and reported once: nothing else is off')
    t.match(faults, [{ code: 'CONSERVATION_BROKEN', labels: { topic: 'zz_broken', group: 'g' } }])
    t.equal(faults.length, 1)
    t.equal(surface.snapshot().topics.at(-1).name, 'zz.broken', 'reads that show the topics still list them sorted')
  })

  t.test(`${backend}: /stats over HTTP reads in slices with the event loop free between them, and shows what it read`, async (t) => {
    const surface = offByOne(t, backend)
    const expected = surface.stats('groups') // read in one hold
    const balance = surface.stats('conservation', { topic: 'zz' }).topics[0].groups[0]
    const stop = oneTopicPerHold(t)
    const groups = call(surface, '/stats?filter=groups')
    const conservation = call(surface, '/stats?filter=conservation&topic=zz')
    const bad = call(surface, '/stats?filter=nope')
    t.ok(bad.sync, 'a bad query is answered at once, before anything is read')
    t.equal((await bad.answered).statusCode, 400)
    t.notOk(groups.sync, 'a good one once its read is done')
    const body = JSON.parse((await groups.answered).body.toString())
    const turns = stop()
    t.ok(turns >= 20, `the event loop ran between the slices (${turns} turns for 21 topics)`)
    t.same(body, JSON.parse(JSON.stringify(expected)), 'the same view as a read in one hold')
    const row = JSON.parse((await conservation.answered).body.toString()).topics[0].groups[0]
    t.same([row.residual, row.quiet], [-1, true], 'the conservation view, from the slices: delivered, the floor not moved')
    t.same(row, JSON.parse(JSON.stringify(balance)), 'as a read in one hold shows it')
  })

  t.test(`${backend}: /stats requests that come while a read is under way share one read, made after them`, async (t) => {
    const surface = offByOne(t, backend)
    const { SnapshotReader } = require('../dist/core/reader.js')
    const begin = SnapshotReader.prototype.beginSliced
    let reads = 0
    let counting = true // reads in one hold (surface.stats()) begin the same way: not counted
    SnapshotReader.prototype.beginSliced = function (...args) { reads += counting ? 1 : 0; return begin.apply(this, args) }
    t.teardown(() => { SnapshotReader.prototype.beginSliced = begin })
    const stop = oneTopicPerHold(t)
    t.teardown(stop)
    const produced = (body) => JSON.parse(body.toString()).topics.find((x) => x.topic === 't0').produced
    const first = call(surface, '/stats?filter=topics')
    for (let i = 0; i < 3; i++) await new Promise((resolve) => setImmediate(resolve)) // t0 (read first) is read
    t.equal(reads, 1)
    surface.topic('t0').produced(0, 11, 7) // recorded after t0 was read, before the next requests
    const later = Array.from({ length: 8 }, () => call(surface, '/stats?filter=topics'))
    counting = false
    const expected = surface.stats('topics')
    counting = true
    const before = produced((await first.answered).body)
    const answers = await Promise.all(later.map((c) => c.answered))
    stop()
    t.equal(reads, 2, 'nine requests, two reads: the one under way and one queued behind it')
    t.equal(produced(answers[0].body), before + 1, 'the first answer does not show the message recorded after its read passed t0; the later ones do')
    for (const res of answers) t.same(JSON.parse(res.body.toString()), JSON.parse(JSON.stringify(expected)), 'each later answer: the view a read in one hold gives now')
    const again = call(surface, '/stats?filter=topics') // nothing under way: a read of its own
    await again.answered
    t.equal(reads, 3)
  })

  t.test(`${backend}: the small /stats views read no topic; faults runs the check, begun after the request`, async (t) => {
    const surface = offByOne(t, backend) // zz's group is off by one, not checked yet
    const heard = faultsOf(surface)
    const { SnapshotReader } = require('../dist/core/reader.js')
    const begin = SnapshotReader.prototype.beginSliced
    let reads = 0
    SnapshotReader.prototype.beginSliced = function (...args) { reads++; return begin.apply(this, args) }
    t.teardown(() => { SnapshotReader.prototype.beginSliced = begin })
    surface.replicationRound({ replicas: 3, inSync: 2, lagging: ['r3'] })
    surface.connectionOpened()
    const small = {}
    for (const view of ['quorum', 'latency', 'config']) small[view] = JSON.parse((await call(surface, `/stats?filter=${view}`).answered).body.toString())
    t.equal(reads, 0, 'quorum, latency and config: nothing read')
    t.same(heard, [], 'nor checked')
    t.match(small.quorum, { filter: 'quorum', quorum_state: surface.quorumState, replicas: 3, in_sync: 2, lagging: ['r3'], connections: 1, leader_epoch: 0 })
    // A /healthz check under way, one topic per hold: t0 is checked first (in registration order).
    const stop = oneTopicPerHold(t)
    const health = call(surface, '/healthz')
    for (let i = 0; i < 3; i++) await new Promise((resolve) => setImmediate(resolve))
    const t0 = surface.topic('t0').group('g')
    t0.delivered(1) // its last in flight: none now, and three delivered with the floor never moved, once the check under way has passed it
    const faults = call(surface, '/stats?filter=faults')
    t.equal(JSON.parse((await health.answered).body.toString()).faults, 1, 'the probe: zz only')
    const view = JSON.parse((await faults.answered).body.toString())
    stop()
    t.equal(view.counts.CONSERVATION_BROKEN, 2, 'the faults view: t0 too (its check began after the request)')
    t.match(view.recent.map((f) => f.labels.topic).sort(), ['t0', 'zz'])
    for (const view of ['quorum', 'latency', 'config']) {
      const { uptime_seconds: _, ...now } = JSON.parse(JSON.stringify(surface.stats(view)))
      const { uptime_seconds: __, ...then } = small[view]
      t.same(then, now, `${view}: what surface.stats() shows`)
    }
  })

  t.test(`${backend}: close() while a /stats read is under way and one is queued: every request gets 503`, async (t) => {
    const surface = offByOne(t, backend)
    const stop = oneTopicPerHold(t)
    t.teardown(stop)
    let errors = 0
    surface.on('error', () => errors++)
    const first = call(surface, '/stats?filter=groups')
    await new Promise((resolve) => setImmediate(resolve))
    const queued = [call(surface, '/stats?filter=topics'), call(surface, '/stats?filter=conservation')]
    await surface.close()
    for (const res of await Promise.all([first, ...queued].map((c) => c.answered))) {
      t.equal(res.statusCode, 503)
      t.match(JSON.parse(res.body.toString()), { error: { code: 'SURFACE_CLOSED' } })
    }
    t.equal(errors, 0, "no 'error' event: a closed surface is not a failure")
  })

  t.test(`${backend}: unpaced (scrapeShare 1) and default options answer small scrapes at once`, async (t) => {
    for (const options of [{ scrapeShare: 1, scrapeBurstMs: 0, scrapeThread: false }, { scrapeThread: false }]) {
      const surface = surfaceOn(t, backend, {}, options)
      fill(surface, 20)
      const expected = strip(surface.render())
      for (let i = 0; i < (options.scrapeShare ? 50 : 3); i++) {
        const scrape = call(surface, '/metrics')
        t.ok(scrape.sync, `${JSON.stringify(options)}: scrape ${i} answered inside the call`)
        t.equal(strip((await scrape.answered).body.toString('latin1')), expected)
      }
    }
  })

  t.test(`${backend}: the scrape's moment is its first slice, after the wait`, async (t) => {
    const { surface, waiting } = await waitingScrape(t, backend)
    surface.topic('t0').append(0, 5) // recorded after the request, before its snapshot
    const expected = strip(surface.render())
    t.match(expected, /mq_topic_messages_produced_total\{topic="t0"\} \d+/)
    t.equal(strip((await waiting.answered).body.toString('latin1')), expected, 'one moment, taken when the wait was over')
  })

  t.test(`${backend}: close() while a scrape is half rendered: 503 at once, no timer of it left`, async (t) => {
    // A scrape whose render had begun went on after close(), in paced slices, and was answered 200
    // with the closed surface's numbers up to ~1.8 s after close() resolved. Forced here: its
    // first slice renders as little as it can and leaves the pacer 100 ms in debt (1 s to wait).
    const surface = surfaceOn(t, backend, {}, { scrapeShare: 0.1, scrapeBurstMs: 0, scrapeThread: false })
    fill(surface, 300)
    const { Renderer } = require('../dist/exposition/render.js')
    const realNow = performance.now
    let offset = 0
    performance.now = () => realNow.call(performance) + offset
    const { begin } = Renderer.prototype
    let firstSlice = true
    let slices = 0
    Renderer.prototype.begin = function (...args) {
      const job = begin.apply(this, args)
      const step = job.step
      job.step = function (deadline) {
        slices++
        if (!firstSlice) return step.call(this, deadline)
        firstSlice = false
        const done = step.call(this, -Infinity) // the least it can do
        offset += 100
        return done
      }
      return job
    }
    t.teardown(() => {
      performance.now = realNow
      Renderer.prototype.begin = begin
    })
    const timers = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout' || r === 'Immediate').length
    const before = timers()
    const scrape = call(surface, '/metrics')
    t.notOk(scrape.sync, 'its first slice did not finish it')
    t.equal(slices, 1, 'one slice rendered')
    t.ok(timers() > before, 'it waits on a timer for its next slice')
    let answeredAt
    scrape.answered.then(() => (answeredAt = slices))
    await surface.close()
    const res = await scrape.answered
    t.equal(res.statusCode, 503, 'answered 503, not a body rendered after close()')
    t.match(JSON.parse(res.body.toString('utf8')), { error: { code: 'SURFACE_CLOSED' } })
    t.equal(answeredAt, 1, 'with no slice rendered after close()')
    t.equal(timers(), before, 'no timer or immediate of it is left')
  })

  t.test(`${backend}: close() while a scrape waits: it is answered with an error, nothing thrown`, async (t) => {
    const { surface, waiting } = await waitingScrape(t, backend)
    await surface.close()
    const res = await waiting.answered
    t.equal(res.statusCode, 503, 'the surface closed: 503, as every request after close() gets (not 500)')
    t.match(JSON.parse(res.body.toString('utf8')), { error: { code: 'SURFACE_CLOSED', message: /closed/ } })
  })
}

for (const [name, headers] of [['plain', {}], ['gzip', { 'accept-encoding': 'gzip' }]]) {
  t.test(`a paced scrape in many slices (${name}) is one moment's numbers while recording goes on`, async (t) => {
    // If this failed, the waits between slices (setTimeout, not setImmediate) would let a scrape
    // mix numbers from before and after into one body.
    // Large enough to take several 10 ms slices on a fast machine (~390,000 samples, twice the
    // benchmark's 200,000, which render in ~13 ms there; the test checks it took more than one).
    const surface = lib.createSurface({}, { scrapeShare: 0.2, scrapeBurstMs: 0, scrapeThread: false })
    t.teardown(() => surface.close())
    const handles = []
    for (let i = 0; i < 9000; i++) {
      const topic = surface.topic(`torn-${i}`)
      for (let p = 0; p < 16; p++) topic.produced(p, 10, 100)
      topic.group('g').dispatch(1)
      topic.group('h').dispatch(1)
      handles.push(topic)
    }
    let seq = 10
    const meddle = setInterval(() => {
      seq++
      for (let i = seq % 10; i < handles.length; i += 10) handles[i].append(seq % 16, 7)
      if (handles.length > 8500) surface.removeTopic(handles.pop().name)
    }, 2)
    const before = surface.render()
    const started = performance.now()
    const scrape = call(surface, '/metrics', headers)
    t.notOk(scrape.sync, 'more than one slice: the first ran inside the call, the rest after waits')
    const res = await scrape.answered
    const ms = performance.now() - started
    clearInterval(meddle)
    t.ok(seq > 13, `recording went on while the scrape was under way (${seq - 10} rounds in ${ms.toFixed(0)} ms)`)
    const body = name === 'gzip' ? zlib.gunzipSync(res.body) : res.body
    t.equal(strip(body.toString('latin1')), strip(before), 'the body is the state when the scrape began, byte for byte')
    t.not(strip(surface.render()), strip(before), 'while the state itself moved on')
  })
}

t.test('ScrapeScheduler: one job at a time, in order of arrival; a failing job passes the turn on', async (t) => {
  const scheduler = new ScrapeScheduler(new ScrapePacer(1, 0), 10)
  let underWay = 0
  let most = 0
  const order = []
  const job = (name, steps, { failAt } = {}) => () => {
    underWay++
    most = Math.max(most, underWay)
    let n = 0
    return {
      step() {
        if (++n === failAt) {
          underWay--
          throw new Error(`${name} failed`)
        }
        return n >= steps
      },
      name,
    }
  }
  const take = (j) => {
    underWay--
    order.push(j.name)
    return j.name
  }
  const sync = scheduler.run(job('quick', 1), take)
  t.equal(sync, 'quick', 'nothing under way, bucket in credit, one slice: the answer itself, not a promise')
  const runs = [
    scheduler.run(job('a', 3), take),
    scheduler.run(job('b', 2), take),
    scheduler.run(job('c', 4, { failAt: 2 }), take),
    scheduler.run(job('d', 1), take),
  ]
  t.equal(scheduler.waiting, 3, 'a under way, b, c and d in line')
  const settled = await within(10_000, 'scheduler', Promise.allSettled(runs))
  t.same(settled.map((r) => r.status), ['fulfilled', 'fulfilled', 'rejected', 'fulfilled'])
  t.match(settled[2].reason.message, /c failed/)
  t.same(order, ['quick', 'a', 'b', 'd'], 'answered in order of arrival')
  t.equal(most, 1, 'never two jobs under way at once')
  t.equal(scheduler.waiting, 0)
  t.throws(() => scheduler.run(() => { throw new Error('begin failed') }, take), /begin failed/, 'a synchronous failure is thrown')
  t.equal(scheduler.run(job('after', 1), take), 'after', 'and the turn is free again')
})

t.test('ScrapeScheduler.close(): the job under way and those in line are rejected at once; later runs throw', async (t) => {
  let now = 0
  const pacer = new ScrapePacer(0.1, 0, () => now)
  const scheduler = new ScrapeScheduler(pacer, 10)
  const steps = []
  const job = (name) => () => ({ name, step() { steps.push(name); now += 5; return false } }) // never done; each slice 5 ms: 50 ms to wait
  const runs = [scheduler.run(job('a'), (j) => j.name), scheduler.run(job('b'), (j) => j.name), scheduler.run(job('c'), (j) => j.name)]
  t.same(steps, ['a'], 'a ran its first slice inside the call')
  t.equal(scheduler.waiting, 2)
  const closed = new Error('closed')
  scheduler.close(closed)
  const settled = await Promise.allSettled(runs)
  t.same(settled.map((r) => r.status), ['rejected', 'rejected', 'rejected'])
  t.ok(settled.every((r) => r.reason === closed), 'each with close()\'s error')
  t.equal(scheduler.waiting, 0)
  now += 1000
  await new Promise((resolve) => setTimeout(resolve, 80)) // a's timer (50 ms) would have fired by now
  t.same(steps, ['a'], 'nothing ran after close()')
  t.throws(() => scheduler.run(job('d'), (j) => j.name), closed, 'a run after close() throws its error')
})

for (const backend of backends()) {
  t.test(`${backend}: concurrent scrapes run one at a time, each from the state at its own start`, async (t) => {
    // If this failed, a scrape that arrived while another was under way would have taken its
    // snapshot at once — older than the first one's answer — and every concurrent scraper would
    // hold a snapshot and a body at the same time.
    const surface = surfaceOn(t, backend, {}, { scrapeShare: 1, scrapeThread: false })
    for (let i = 0; i < 400; i++) {
      const topic = surface.topic(`q${i}`)
      for (let p = 0; p < 8; p++) topic.produced(p, 10, 100)
      topic.group('g').dispatch(1)
    }
    // A clock that moves 50 ms at every read: every slice ends at its first clock check, so each
    // scrape takes many slices on any machine (unpaced: the pacer never waits at share 1).
    const realClock = steppingClock(t, 50)
    const t0 = surface.topic('q0')
    const expected = [strip(surface.render())]
    const answered = []
    const after = (seq) => (res) => {
      answered.push(seq)
      t0.append(0, 1) // recorded once this scrape has its body, before the next one starts
      expected.push(strip(surface.render()))
    }
    const a = call(surface, '/metrics', {}, after(100))
    // Plain bodies: a gzip answer may go out after the next job's (compressed on the thread pool
    // once its job is done), and this test records in the answer's callback.
    const b = call(surface, '/metrics', {}, after(200))
    const c = call(surface, '/metrics', {}, after(300))
    t.notOk(a.sync, 'the first scrape takes more than one slice (else this test shows nothing)')
    t.notOk(b.sync, 'the second waits for its turn')
    t.notOk(c.sync)
    const [ra, rb, rc] = await Promise.all([a.answered, b.answered, c.answered])
    realClock()
    t.same(answered, [100, 200, 300], 'answered in order of arrival')
    t.equal(strip(ra.body.toString('latin1')), expected[0], 'the first: the state at its request')
    t.equal(strip(rb.body.toString('latin1')), expected[1], 'the second: the state after the first one answered')
    t.equal(strip(rc.body.toString('latin1')), expected[2], 'the third: the state after the second one answered')
  })
}

t.test('ScrapeScheduler: a waiting scrape whose client went away is skipped, never started', async (t) => {
  const scheduler = new ScrapeScheduler(new ScrapePacer(1, 0), 10)
  const begun = []
  const job = (name, steps) => () => {
    begun.push(name)
    let n = 0
    return { step: () => ++n >= steps, name }
  }
  const take = (j) => j.name
  let gone = false
  const a = scheduler.run(job('a', 3), take)
  const b = scheduler.run(job('b', 1), take, () => gone)
  const c = scheduler.run(job('c', 1), take, () => false)
  gone = true // b's client leaves while a is under way
  const settled = await within(10_000, 'scheduler', Promise.allSettled([a, b, c]))
  t.same(settled.map((r) => r.status), ['fulfilled', 'rejected', 'fulfilled'])
  t.equal(settled[1].reason.name, 'ScrapeAbandoned')
  t.same(begun, ['a', 'c'], 'b was never started')
})

for (const backend of backends()) {
  t.test(`${backend}: a client that leaves while its scrape waits costs no render, and nothing breaks`, async (t) => {
    const http = require('node:http')
    const surface = surfaceOn(t, backend, {}, { scrapeShare: 0.1, scrapeBurstMs: 0, scrapeThread: false })
    fill(surface, 300)
    const errors = []
    surface.on('error', (e) => errors.push(e))
    const counter = debtAfterNextScrape(t, 100)
    let received
    const server = http.createServer((req, res) => {
      t.ok(surface.handler(req, res))
      received?.()
    })
    await new Promise((r) => server.listen(0, '127.0.0.1', r))
    t.teardown(() => new Promise((r) => server.close(r)))
    const port = server.address().port
    const get = (onRequest) => new Promise((resolve, reject) => {
      const req = http.get({ host: '127.0.0.1', port, path: '/metrics', agent: false }, (res) => {
        let body = ''
        res.setEncoding('latin1').on('data', (d) => (body += d)).on('end', () => resolve({ status: res.statusCode, body }))
      })
      req.on('error', reject)
      onRequest?.(req)
    })
    const first = await within(20_000, 'first scrape', get())
    t.equal(first.status, 200)
    t.equal(counter.begins, 1)
    // The bucket is now ≥ 100 ms in debt: the next scrape waits ≥ 1 s at 10%.
    const arrived = new Promise((r) => { received = r })
    const leaving = get((req) => arrived.then(() => req.destroy())).catch((e) => e)
    await arrived
    received = undefined
    t.match((await leaving).code, /ECONNRESET/, 'the client left before its answer')
    const second = await within(30_000, 'second scrape', get())
    t.equal(second.status, 200)
    t.equal(counter.begins, 2, 'the abandoned scrape was never started: one render for each client still there')
    t.equal(strip(second.body), strip(surface.render()), 'the next client gets the whole exposition')
    t.same(errors, [])
  })
}
