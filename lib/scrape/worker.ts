// The scrape thread itself (docs/scrape-thread.md): a worker of the library's own that maps the
// surface's shared memory like a recording worker, and answers each /metrics request from the main
// thread with the finished body — snapshot, conservation check, render and gzip all done here —
// and each batch of /stats views with their JSON, from one read.
// Started and fed by ./thread.ts; nothing else loads this file.
import { parentPort, workerData } from 'node:worker_threads'
import { gzipSync } from 'node:zlib'
import { attachArena } from '../core/backend'
import type { ResolvedConfig } from '../core/config'
import { faultRecord, type FaultRecord } from '../core/faults'
import { Memory } from '../core/memory'
import { Observer } from '../core/observer'
import { keepAnnouncing } from '../core/reclamation'
import { Handles } from '../core/handles'
import { Recorder } from '../core/recording'
import { Registry } from '../core/registry'
import { GZIP_LEVEL } from '../exposition/gzip'
import { Renderer } from '../exposition/render'
import { THREAD_VIEWS, conservationHeldBack, statsPlanOf, type ConservationView, type HeldBack, type StatsContext, type StatsRequest } from '../exposition/stats'
import { materialize, toJSON } from '../core/json'
import type { Suspect } from '../core/observer'
import { ScrapePacer, ScrapeScheduler } from '../http/pacing'
import type { TopicEntity } from '../core/entities'
import type { Snapshot } from '../core/snapshot'
import type { BuiltView, ScrapeReply, ScrapeRequest, ScrapeThreadData } from './thread'

/** Slices of scrape work between which this thread's pacer may make it wait (see ScrapeScheduler). */
const SLICE_MS = 10

if (parentPort === null) throw new Error('mq-metrics: lib/scrape/worker.js runs as a worker thread, started by the surface')
const port = parentPort
const data = workerData as ScrapeThreadData

const memory = new Memory(attachArena(data.arena), false)
const registry = new Registry(memory, data.config as ResolvedConfig)
/** Faults found while serving the current request: they go back with its answer. */
let faults: FaultRecord[] = []
// A row of its own: repairing an underflowed in_flight writes this thread's share (design §5).
const recorder = new Recorder(registry, memory.claimRow(), (...fault) => faults.push(faultRecord(...fault)))
const handles = new Handles(recorder)
// Between its tasks this thread is inside no recording call: it says so (lib/core/reclamation.ts).
keepAnnouncing(memory)
const observer = new Observer(handles, (fault) => faults.push(fault), true)
const renderer = new Renderer()
/** The memory the main thread lent for this scrape's plain body, until it is used or handed back. */
let lent: ArrayBuffer | undefined
/** Bodies whose whole ArrayBuffer is this thread's to move (owned() wrote them). */
const movable = new WeakSet<ArrayBufferLike>()
const scrapes = new ScrapeScheduler(new ScrapePacer(data.share, data.burstMs), SLICE_MS)

port.on('message', (request: ScrapeRequest) => {
  // Test hook (test/scrape-thread.test.js): a thread that dies in the middle of a scrape.
  if (process.env.MQ_METRICS_SCRAPE_THREAD_EXIT === '1') process.exit(1)
  faults = []
  lent = request.buffer
  if (request.stats !== undefined) return views(request, request.stats)
  let answer: Buffer | Promise<Buffer>
  try {
    answer = scrapes.run(
      () => (request.gzip ? renderer.beginGzip(observer.observeSliced(request.fields)) : renderer.begin(observer.observeSliced(request.fields))),
      (job) => {
        if (!('result' in job)) return owned(job.body(), true)
        const result = job.result()
        if (result.gzip !== undefined) return result.gzip
        // Most of the body changed: one pass of zlib over it, here, off the broker's thread.
        const compressed = gzipSync(result.plain, { level: GZIP_LEVEL })
        renderer.recycle(result.plain)
        return compressed
      },
    )
  } catch (error) {
    fail(request, error)
    return
  }
  if (Buffer.isBuffer(answer)) reply(request, answer)
  else answer.then((body) => reply(request, body), (error: unknown) => fail(request, error))
})

/**
 * /stats views from one read (the snapshot with ack floors and the conservation report, in slices
 * as a scrape reads), each distinct one written as JSON here once: the main thread only hands the
 * bytes to the socket. A conservation view is written without its topics that show a residual or
 * hold a suspect (HeldBack): this read may have caught a batch of the main thread's calls
 * half-way (a re-read that differs is no suspect, yet the view would show the first read), and
 * only the main thread, between its tasks, can tell that from a real imbalance. It reads those
 * topics again and puts them in.
 */
function views(request: ScrapeRequest, asked: StatsRequest[]): void {
  const keys = asked.map(({ view, narrow }) => JSON.stringify([view, narrow.topic ?? null, narrow.group ?? null]))
  const distinct = [...new Set(keys)]
  const of = keys.map((key) => distinct.indexOf(key))
  const wanted = distinct.map((key) => asked[keys.indexOf(key)])
  let suspects: Suspect[] = []
  let answer: BuiltView[] | Promise<BuiltView[]>
  try {
    answer = scrapes.run(
      () => {
        const [snapshot, conservation] = observer.observeReportSliced(request.fields)
        suspects = observer.takeSuspects()
        const context = { snapshot, conservation, config: data.config } as StatsContext // the views built here read nothing else
        const built: BuiltView[] = []
        return {
          built,
          step(deadline: number): boolean {
            do {
              const one = wanted[built.length]
              if (!THREAD_VIEWS.has(one.view)) throw new Error(`the scrape thread builds no ${one.view} view`)
              const view = materialize(statsPlanOf(one, context))
              const split = one.view === 'conservation' ? heldBack(view as ConservationView, snapshot, suspects) : undefined
              built.push(split === undefined ? { json: encoded(toJSON(view)) } : { json: encoded(split.text), back: split.back })
            } while (built.length < wanted.length && performance.now() < deadline)
            return built.length === wanted.length
          },
        }
      },
      (job) => job.built,
    )
  } catch (error) {
    fail(request, error, suspects)
    return
  }
  const send = (built: BuiltView[]): void => {
    const message: ScrapeReply = { id: request.id, ok: true, views: built, of, faults, suspects: [...suspects, ...observer.takeSuspects()], spare: unused() }
    faults = []
    port.postMessage(message, built.flatMap((view) => (view.back === undefined ? [view.json] : [view.json, view.back.cuts.buffer as ArrayBuffer, view.back.topics.buffer as ArrayBuffer])))
  }
  if (Array.isArray(answer)) send(answer)
  else answer.then(send, (error: unknown) => fail(request, error, suspects))
}

/** `view` without its topics that show a residual or hold a suspect, or undefined when it has none. */
function heldBack(view: ConservationView, snapshot: Snapshot, suspects: readonly Suspect[]): { text: string; back: HeldBack } | undefined {
  const suspected = new Set(suspects.map((suspect) => suspect.topicId))
  let ids: Map<string, number> | undefined
  const idOf = (name: string) => (ids ??= new Map(snapshot.topics.map((t) => [t.name, (t.key as TopicEntity).id]))).get(name)!
  return conservationHeldBack(view, (t) => t.groups.some((group) => Number(group.residual) !== 0) || (suspected.size !== 0 && suspected.has(idOf(t.topic))), idOf)
}

/** `text` in memory of its own, to be moved to the main thread. */
function encoded(text: string): ArrayBuffer {
  const memory = new ArrayBuffer(Buffer.byteLength(text, 'utf8'))
  Buffer.from(memory).write(text, 'utf8')
  return memory
}

/**
 * The body in memory this thread may move (transfer, not copy) to the main thread: the buffer the
 * main thread lent if it is large enough, else a new one with room to grow by 1/16, as the main
 * thread's own (a body a few bytes longer next time, a counter with one more digit, still fits it
 * when it is lent again). A render's body is a view of the renderer's output buffer: copied out,
 * and the buffer handed back to take the next render.
 */
function owned(body: Buffer, recycle: boolean): Buffer {
  const memory = lent !== undefined && lent.byteLength >= body.length ? lent : new ArrayBuffer(body.length + (body.length >>> 4))
  if (memory === lent) lent = undefined
  const copy = Buffer.from(memory, 0, body.length)
  body.copy(copy)
  movable.add(memory)
  if (recycle) renderer.recycle(body)
  return copy
}

/** The lent buffer if it was not used, to go back with the answer (and out of this thread). */
function unused(): ArrayBuffer | undefined {
  const spare = lent
  lent = undefined
  return spare
}

function reply(request: ScrapeRequest, body: Buffer): void {
  const mine = body.byteOffset === 0 && (movable.has(body.buffer) || (body.byteLength === body.buffer.byteLength && body.buffer instanceof ArrayBuffer))
  const whole = mine ? body : owned(body, false)
  const spare = unused()
  const message: ScrapeReply = { id: request.id, ok: true, body: whole.buffer as ArrayBuffer, length: whole.length, faults, suspects: observer.takeSuspects(), spare }
  faults = []
  port.postMessage(message, spare === undefined ? [message.body] : [message.body, spare])
}

function fail(request: ScrapeRequest, error: unknown, found: Suspect[] = []): void {
  const { name, message, code } = error as { name?: unknown; message?: unknown; code?: unknown }
  const answer: ScrapeReply = {
    id: request.id,
    ok: false,
    error: { name: String(name ?? 'Error'), message: String(message ?? error), code: typeof code === 'string' ? code : undefined },
    faults,
    suspects: [...found, ...observer.takeSuspects()],
    spare: unused(),
  }
  faults = []
  port.postMessage(answer, answer.spare === undefined ? [] : [answer.spare])
}
