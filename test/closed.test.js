'use strict'
// After `await surface.close()` the surface cannot be used (README, design §12): every call on it,
// on the handles it gave out and on the recorders of its worker threads throws ClosedError
// (code SURFACE_CLOSED), on both backends; a worker cannot attach to it any more. Before this,
// handles kept recording into memory nobody would read again, and the broker-wide calls answered
// as if nothing had happened.
const t = require('tap')
const path = require('node:path')
const { Worker } = require('node:worker_threads')
const { backends, surfaceOn } = require('./helpers')

const DIST = JSON.stringify(path.join(__dirname, '..', 'dist'))
// The message says what to do, not only what is wrong (errors.md: create a new surface).
const CLOSED = { name: 'ClosedError', code: 'SURFACE_CLOSED', message: /^this mq-metrics surface is closed: .*create a new surface with createSurface\(\)/ }

/** Every call a broker makes, on a topic handle `topic` and its group `group`, as [what, call]. */
function recordingCalls(topic, group) {
  return [
    ['topic.produced', () => topic.produced(0, 2, 10)],
    ['topic.produced on a new partition', () => topic.produced(7, 1, 10)],
    ['topic.group (existing)', () => topic.group('g').delivered()],
    ['topic.group (new)', () => topic.group('new-group')],
    ['topic.lastSeqKnown', () => topic.lastSeqKnown(0)],
    ['group.dispatch', () => group.dispatch()],
    ['group.delivered', () => group.delivered()],
    ['group.dropped', () => group.dropped()],
    ['group.redelivered', () => group.redelivered()],
    ['group.deadLettered', () => group.deadLettered()],
    ['group.ackFloor', () => group.ackFloor(0, 1)],
    ['group.inFlight', () => group.inFlight()],
  ]
}

for (const backend of backends()) {
  for (const e2e_latency of [true, false]) {
    t.test(`${backend}, e2e_latency ${e2e_latency}: every call after close() throws ClosedError`, async (t) => {
      const surface = surfaceOn(t, backend, { max_in_flight: 100, e2e_latency })
      const topic = surface.topic('orders')
      const group = topic.group('g')
      topic.produced(0, 1, 10)
      group.dispatch(2)
      surface.latency.record(3)
      t.equal(surface.closed, false, 'open')
      const closing = surface.close()
      t.equal(surface.closed, true, 'closed from the call of close() on, before it resolves')
      await closing
      t.equal(surface.closed, true)
      const calls = [
        ...recordingCalls(topic, group),
        ['latency.record', () => surface.latency.record(3)],
        ['latency.rotate', () => surface.latency.rotate()],
        ['latency.quantiles', () => surface.latency.quantiles()],
        ['connectionOpened', () => surface.connectionOpened()],
        ['connectionClosed', () => surface.connectionClosed()],
        ['setLeaderEpoch', () => surface.setLeaderEpoch(5)],
        ['replicationRound', () => surface.replicationRound({ replicas: 3, inSync: 3 })],
        ['admitWrite', () => surface.admitWrite()],
        ['topic()', () => surface.topic('orders')],
        ['removeTopic', () => surface.removeTopic('orders')],
        ['render', () => surface.render()],
        ['snapshot', () => surface.snapshot()],
        ['stats', () => surface.stats('topics')],
        ['share', () => surface.share()],
      ]
      for (const [what, call] of calls) t.throws(call, CLOSED, what)
    })
  }

  t.test(`${backend}: a removed topic's handle still says RemovedTopicError, until the surface closes`, async (t) => {
    const surface = surfaceOn(t, backend)
    const topic = surface.topic('gone')
    surface.removeTopic('gone')
    t.throws(() => topic.produced(0, 1, 1), { name: 'RemovedTopicError', code: 'TOPIC_REMOVED' })
    await surface.close()
    t.throws(() => topic.produced(0, 1, 1), CLOSED, 'once closed, the surface is what is gone')
  })

  t.test(`${backend}: a worker's recorder throws ClosedError once the main thread closed the surface`, async (t) => {
    const surface = surfaceOn(t, backend, { max_in_flight: 100, e2e_latency: true })
    const shared = surface.share()
    const worker = new Worker(`
      const { parentPort, workerData } = require('node:worker_threads')
      const { attachSurface } = require(${DIST})
      const recorder = attachSurface(workerData)
      const topic = recorder.topic('orders')
      const group = topic.group('g')
      topic.produced(0, 1, 10)
      group.dispatch(2)
      parentPort.postMessage('ready')
      parentPort.once('message', () => {
        const outcomes = {}
        const calls = {
          produced: () => topic.produced(0, 2, 10),
          'produced on a new partition': () => topic.produced(7, 1, 10),
          delivered: () => group.delivered(),
          dispatch: () => group.dispatch(),
          ackFloor: () => group.ackFloor(0, 1),
          'latency.record': () => recorder.latency.record(3),
          'topic (existing)': () => recorder.topic('orders'),
          'topic (new)': () => recorder.topic('fresh'),
        }
        for (const [what, call] of Object.entries(calls)) {
          try {
            call()
            outcomes[what] = 'no error'
          } catch (error) {
            outcomes[what] = error.name + ' ' + error.code
          }
        }
        parentPort.postMessage(outcomes)
      })
    `, { eval: true, workerData: shared, execArgv: [] })
    t.teardown(() => worker.terminate())
    await new Promise((resolve, reject) => {
      worker.once('error', reject)
      worker.once('message', resolve)
    })
    t.equal(surface.snapshot().topics[0].produced, 1, 'the worker recorded before the close')
    await surface.close()
    const outcomes = await new Promise((resolve, reject) => {
      worker.once('error', reject)
      worker.once('message', resolve)
      worker.postMessage('go')
    })
    const expected = Object.fromEntries(Object.keys(outcomes).map((what) => [what, 'ClosedError SURFACE_CLOSED']))
    t.equal(Object.keys(outcomes).length, 8)
    t.same(outcomes, expected, 'every call in the worker throws ClosedError')
  })

  t.test(`${backend}: attachSurface() after close() throws ClosedError`, async (t) => {
    const surface = surfaceOn(t, backend)
    surface.topic('orders').produced(0, 1, 1)
    const shared = surface.share()
    await surface.close()
    const outcome = await new Promise((resolve, reject) => {
      const worker = new Worker(`
        const { parentPort, workerData } = require('node:worker_threads')
        const { attachSurface } = require(${DIST})
        try {
          attachSurface(workerData)
          parentPort.postMessage('attached')
        } catch (error) {
          parentPort.postMessage(error.name + ' ' + error.code)
        }
      `, { eval: true, workerData: shared, execArgv: [] })
      worker.once('error', reject)
      worker.once('message', (m) => worker.terminate().then(() => resolve(m)))
    })
    t.equal(outcome, 'ClosedError SURFACE_CLOSED')
  })
}

for (const backend of backends()) {
  t.test(`${backend}: latency.record() rejects a bad value whether the estimator is on or off`, async (t) => {
    for (const e2e_latency of [true, false]) {
      const surface = surfaceOn(t, backend, { e2e_latency })
      for (const bad of [-1, -0.001, NaN, Infinity, -Infinity]) {
        t.throws(() => surface.latency.record(bad), { name: 'RangeError', message: /finite number ≥ 0/ }, `e2e_latency ${e2e_latency}: ${bad}`)
      }
      for (const bad of ['3', null, undefined, 3n, {}]) {
        t.throws(() => surface.latency.record(bad), TypeError, `e2e_latency ${e2e_latency}: ${typeof bad}`)
      }
      surface.latency.record(0)
      surface.latency.record(2.5)
      t.equal(surface.latency.quantiles() === null, !e2e_latency, 'good values are recorded only when it is on')
    }
  })

  t.test(`${backend}: removeTopic() applies the name rule of topic()`, async (t) => {
    const surface = surfaceOn(t, backend)
    surface.topic('kept').produced(0, 1, 1)
    t.throws(() => surface.removeTopic(''), { name: 'RangeError', message: /1 to 1024 characters/ })
    t.throws(() => surface.removeTopic('x'.repeat(1025)), { name: 'RangeError', message: /1 to 1024 characters/ })
    t.throws(() => surface.removeTopic(5), TypeError)
    t.equal(surface.removeTopic('x'.repeat(1024)), false, 'a valid name that is not a topic: false')
    t.same(surface.snapshot().topics.map((x) => x.name), ['kept'])
  })
}
