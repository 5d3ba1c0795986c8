// The main thread's side of the scrape thread (docs/scrape-thread.md). A /metrics request becomes
// one message to a worker of the library's own (./worker.ts) and one message back with the body:
// the broker's thread does the hand-off and the socket write, nothing else. The large /stats views
// go the same way, those waiting built from one read. The worker maps the shared memory, so it
// needs no copy of the numbers, only the few that live in this thread's objects (ThreadFields),
// sent with each request.
//
// One job at a time, scrapes in order of arrival (views waiting go ahead of a scrape together, once):
// memory stays bounded (one snapshot, one body or batch of views under way however many clients
// wait), and a request whose client has gone is dropped before it costs anything. Faults the scrape found come back with its answer and reach this thread's log and
// listeners, once, before the body is handed over. If the thread dies, what it had (and what waits)
// is served in this thread, the fault log says so, and the thread is started again on a later
// scrape (after 1 s, doubling to a minute while it keeps failing).
import * as path from 'node:path'
import { Worker } from 'node:worker_threads'
import type { SharedArena } from '../core/backend'
import type { ResolvedConfig } from '../core/config'
import { ClosedError, MqMetricsError } from '../core/errors'
import type { FaultRecord } from '../core/faults'
import type { Suspect, ThreadFields } from '../core/observer'
import type { GzipBody } from '../exposition/gzip'
import type { HeldBack, StatsRequest } from '../exposition/stats'
import { ScrapeAbandoned } from '../http/pacing'

/** What the worker is started with. */
export interface ScrapeThreadData {
  arena: SharedArena
  config: ResolvedConfig
  /** The scrape pacing (lib/http/pacing.ts), applied to the scrape thread's own time. */
  share: number
  burstMs: number
}

export interface ScrapeRequest {
  id: number
  gzip: boolean
  fields: ThreadFields
  /** /stats views to build from one read (every one waiting shares it), instead of a /metrics body. */
  stats?: StatsRequest[]
  /** Memory this thread lends for a plain body (moved, not copied): a body sent earlier, or a new one. */
  buffer?: ArrayBuffer
}

/**
 * Either way the answer carries `spare`: the lent buffer, when the thread did not need it. A
 * /stats request's answer has `views` instead of `body`: each distinct view's JSON (a conservation
 * view's perhaps with topics held back for the main thread to read again: BuiltView); `of[i]` is
 * the index in `views` of the i-th view asked (the same view asked twice is built once).
 */
export type ScrapeReply =
  | { id: number; ok: true; body: ArrayBuffer; length: number; faults: FaultRecord[]; suspects: Suspect[]; spare?: ArrayBuffer }
  | { id: number; ok: true; views: BuiltView[]; of: number[]; faults: FaultRecord[]; suspects: Suspect[]; spare?: ArrayBuffer }
  | { id: number; ok: false; error: { name: string; message: string; code: string | undefined }; faults: FaultRecord[]; suspects: Suspect[]; spare?: ArrayBuffer }

/**
 * A /stats view the thread wrote: its JSON, and for a conservation view the topics it held back
 * (shown with a residual, or holding a suspect: only the main thread can tell a batch of its own
 * caught half-way), which the main thread reads again and puts in (ConservationFill). The JSON
 * crosses as an ArrayBuffer (moved, not copied); stats() hands it on as a Buffer over the same memory.
 */
export interface BuiltView<Json extends ArrayBuffer | Buffer = ArrayBuffer> {
  json: Json
  back?: HeldBack
}

/** What the scrape thread needs from its surface. */
export interface ScrapeThreadHost {
  /** Worker data: the arena to map, the configuration, the pacing. */
  data(): ScrapeThreadData
  /** The numbers of this thread for the snapshot, as of now. */
  fields(): ThreadFields
  /** A fault the scrape found (counted by the surface, emitted to its listeners). */
  fault(fault: FaultRecord): void
  /** Groups the scrape found quietly off balance: the main thread confirms them (lib/core/observer.ts). */
  confirm(suspects: Suspect[]): void
  /** A line for the fault log that is no broker fault: the thread failed. */
  note(fault: FaultRecord): void
  /** The same scrape, served in this thread (when the scrape thread cannot). */
  inThread(gzip: boolean, abandoned?: () => boolean): Buffer | GzipBody | Promise<Buffer | GzipBody>
}

/** What `surface.scrapeThread` tells: where /metrics is rendered, and how the thread has fared. */
export interface ScrapeThreadState {
  /** 'thread': scrapes go to the scrape thread; 'main': this surface renders on the main thread (option or fallback). */
  readonly mode: 'thread' | 'main'
  /** Scrapes the thread answered. */
  readonly scrapes: number
  /** /stats views the thread built. */
  readonly views: number
  /** Topics the thread held back from the conservation views it built, read again on the main thread. */
  readonly reread: number
  /** Times the thread failed (it died, or could not start). */
  readonly failures: number
  /** Why it last failed, if it did. */
  readonly lastFailure: string | undefined
}

/** A /metrics scrape, or (`stats`) a /stats view: its JSON, or undefined for the main thread to build it. */
type Job =
  | { gzip: boolean; stats?: undefined; abandoned: (() => boolean) | undefined; resolve: (body: Buffer | GzipBody | Promise<Buffer | GzipBody>) => void; reject: (error: unknown) => void }
  | { gzip: false; stats: StatsRequest; abandoned: (() => boolean) | undefined; resolve: (view: BuiltView<Buffer> | undefined) => void; reject: (error: unknown) => void }

const FIRST_BACKOFF_MS = 1000
const MAX_BACKOFF_MS = 60_000
const WORKER_FILE = path.join(__dirname, 'worker.js')

export class ScrapeThread {
  readonly #host: ScrapeThreadHost
  #worker: Worker | undefined
  #nextId = 1
  /** What the thread has under way: one scrape, or the /stats views of one read. */
  #current: { id: number; jobs: Job[] } | undefined
  readonly #queue: Job[] = []
  /** While the thread failed lately: no new thread before this time (ms since the epoch); scrapes are served in this thread. */
  #retryAt = 0
  #backoff = FIRST_BACKOFF_MS
  #closed = false
  #scrapes = 0
  #views = 0
  #reread = 0
  #failures = 0
  #lastFailure: string | undefined
  /**
   * Plain bodies are written into memory this thread allocates and lends to the scrape thread, and
   * takes back once nothing reads a body any more (recycle()): the next scrape reuses it instead of
   * allocating 10+ MB, and memory is not left for a garbage collection that a quiet main thread
   * may not run for a long time (docs/scrape-thread.md).
   */
  #spare: ArrayBuffer | undefined
  /** The plain bodies the thread sent that are still out: only these are taken back. */
  readonly #out = new WeakSet<ArrayBuffer>()
  /** The size to lend: the last plain body's, with room for it to grow a little. */
  #expected = 0

  constructor(host: ScrapeThreadHost) {
    this.#host = host
  }

  get state(): ScrapeThreadState {
    return { mode: this.#available() ? 'thread' : 'main', scrapes: this.#scrapes, views: this.#views, reread: this.#reread, failures: this.#failures, lastFailure: this.#lastFailure }
  }

  /** The body of one scrape: plain, or (`gzip`) a gzip member. */
  request(gzip: boolean, abandoned?: () => boolean): Promise<Buffer | GzipBody> {
    if (this.#closed) return Promise.reject(new ClosedError('this mq-metrics surface'))
    return new Promise((resolve, reject) => {
      this.#queue.push({ gzip, abandoned, resolve, reject })
      this.#pump()
    })
  }

  /**
   * One /stats view (THREAD_VIEWS), built in the thread: its JSON (with the topics a conservation
   * view held back for the main thread to read again: BuiltView), or undefined when the main thread
   * is to build it (the thread is down or failed the batch: docs/scrape-thread.md). Views asked while one read is under way
   * share the next; one whose client has gone (`abandoned`) by then is not built (ScrapeAbandoned).
   */
  stats(request: StatsRequest, abandoned?: () => boolean): Promise<BuiltView<Buffer> | undefined> {
    if (this.#closed) return Promise.reject(new ClosedError('this mq-metrics surface'))
    return new Promise((resolve, reject) => {
      this.#queue.push({ gzip: false, stats: request, abandoned, resolve, reject })
      this.#pump()
    })
  }

  /** Stops the thread; scrapes under way or waiting fail with ClosedError. */
  async close(): Promise<void> {
    this.#closed = true
    const pending = this.#pending()
    const worker = this.#worker
    this.#worker = undefined
    for (const job of pending) job.reject(new ClosedError('this mq-metrics surface'))
    if (worker !== undefined) await worker.terminate()
  }

  /**
   * Nothing reads `body` (a plain body this surface handed out) any more. True if it came from
   * the thread, whose memory is then lent again; false if it is not the thread's.
   */
  recycle(body: Buffer): boolean {
    const memory = body.buffer
    if (body.byteOffset !== 0 || !(memory instanceof ArrayBuffer) || !this.#out.delete(memory)) return false
    this.#keep(memory)
    return true
  }

  /**
   * One spare is kept to lend: the larger — unless it is more than twice what the next body is
   * expected to need (the series have shrunk since a spike): that one is left to the garbage
   * collector, and the next scrape lends memory of the expected size.
   */
  #keep(memory: ArrayBuffer): void {
    if (this.#expected > 0 && memory.byteLength > 2 * this.#expected) return
    if (this.#spare === undefined || this.#spare.byteLength < memory.byteLength) this.#spare = memory
  }

  #available(): boolean {
    return Date.now() >= this.#retryAt
  }

  /** Sends the next waiting scrape, if none is under way. */
  #pump(): void {
    while (this.#current === undefined && this.#queue.length > 0) {
      const job = this.#queue.shift()!
      if (job.abandoned?.() === true) {
        job.reject(new ScrapeAbandoned())
        continue
      }
      if (!this.#available()) {
        this.#serveHere(job)
        continue
      }
      let worker = this.#worker
      if (worker === undefined) {
        try {
          worker = this.#start()
        } catch (error) {
          // The thread cannot start (a limit on threads, a permission model without workers): as
          // if it had died — this scrape and those waiting are served here, after the back-off a
          // start is tried again.
          if (this.#closed) {
            job.reject(new ClosedError('this mq-metrics surface'))
            continue
          }
          this.#queue.unshift(job)
          this.#failed(error instanceof Error ? error.message.split('\n')[0] : String(error))
          continue
        }
      }
      // Every /stats view waiting is built from this one read (a burst of them costs one), but
      // those whose client has gone.
      const jobs: Job[] = [job]
      if (job.stats !== undefined) {
        for (const other of this.#take((waiting) => waiting.stats !== undefined)) {
          if (other.abandoned?.() === true) other.reject(new ScrapeAbandoned())
          else jobs.push(other)
        }
      }
      let request: ScrapeRequest
      try {
        request = { id: this.#nextId++, gzip: job.gzip, fields: this.#host.fields() }
      } catch (error) {
        for (const one of jobs) one.reject(error)
        continue
      }
      if (job.stats !== undefined) request.stats = jobs.map((one) => one.stats!)
      this.#current = { id: request.id, jobs }
      if (!job.gzip && job.stats === undefined && this.#expected > 0) {
        // A spare too small for this body comes back unused with the answer (the thread allocates).
        request.buffer = this.#spare ?? new ArrayBuffer(this.#expected)
        this.#spare = undefined
      }
      worker.postMessage(request, request.buffer === undefined ? [] : [request.buffer])
    }
  }

  #start(): Worker {
    // No execArgv of the broker's (loaders, inspectors): the worker is plain JavaScript of this package.
    const worker = new Worker(WORKER_FILE, { workerData: this.#host.data(), execArgv: [] })
    worker.unref() // a scrape thread never keeps the broker's process alive
    worker.on('message', (reply: ScrapeReply) => this.#answer(worker, reply))
    let error: unknown
    worker.on('error', (thrown) => {
      error = thrown
    })
    worker.on('exit', (code) => {
      if (this.#worker !== worker) return
      this.#worker = undefined
      const reason = error instanceof Error ? error.message.split('\n')[0] : `it exited with code ${code}`
      this.#failed(reason)
    })
    this.#worker = worker
    return worker
  }

  /** The waiting jobs that `which` picks, out of the queue, in order. */
  #take(which: (job: Job) => boolean): Job[] {
    const taken = this.#queue.filter(which)
    if (taken.length > 0) this.#queue.splice(0, this.#queue.length, ...this.#queue.filter((job) => !which(job)))
    return taken
  }

  #answer(worker: Worker, reply: ScrapeReply): void {
    const current = this.#current
    if (reply.spare !== undefined) this.#keep(reply.spare)
    if (worker !== this.#worker || current === undefined || current.id !== reply.id) return
    this.#current = undefined
    try {
      for (const fault of reply.faults) this.#host.fault(fault)
      if (reply.suspects.length > 0) this.#host.confirm(reply.suspects)
    } catch (error) {
      // A 'fault' listener that threw: the scrape fails as it does when rendered on this thread.
      for (const job of current.jobs) job.reject(error)
      this.#pump()
      return
    }
    if (reply.ok && 'views' in reply) {
      this.#backoff = FIRST_BACKOFF_MS
      current.jobs.forEach((job, i) => {
        const { json, back } = reply.views[reply.of[i]]
        this.#views++
        this.#reread += back?.topics.length ?? 0
        ;(job.resolve as (view: BuiltView<Buffer> | undefined) => void)({ json: Buffer.from(json), back })
      })
      this.#pump()
      return
    }
    if (!reply.ok && current.jobs[0].stats !== undefined) {
      // Every view of the batch: 503 once closed, else built on the main thread (as when the thread is down).
      const closed = reply.error.code === 'SURFACE_CLOSED'
      for (const job of current.jobs) {
        if (closed) job.reject(new ClosedError('this mq-metrics surface'))
        else (job.resolve as (view: BuiltView<Buffer> | undefined) => void)(undefined)
      }
      this.#pump()
      return
    }
    const job = current.jobs[0] as Extract<Job, { stats?: undefined }>
    if (reply.ok) {
      this.#scrapes++
      this.#backoff = FIRST_BACKOFF_MS
      const body = Buffer.from(reply.body, 0, reply.length)
      if (!job.gzip) {
        this.#out.add(reply.body)
        this.#expected = reply.length + (reply.length >>> 4)
      }
      job.resolve(job.gzip ? { gzip: body } : body)
    } else {
      job.reject(reply.error.code === 'SURFACE_CLOSED' ? new ClosedError('this mq-metrics surface') : new ScrapeThreadError(reply.error.message))
    }
    this.#pump()
  }

  /** The thread is gone: said in the fault log; what it had and what waits is served in this thread. */
  #failed(reason: string): void {
    if (this.#closed) return
    this.#failures++
    this.#lastFailure = reason
    this.#retryAt = Date.now() + this.#backoff
    this.#host.note({
      code: 'SCRAPE_THREAD_FAILED',
      metric: '',
      labels: { reason: reason.slice(0, 200) },
      previous: null,
      attempted: this.#backoff, // ms before the thread is started again
      at: new Date().toISOString(),
    })
    this.#backoff = Math.min(MAX_BACKOFF_MS, this.#backoff * 2)
    for (const job of this.#pending()) this.#serveHere(job)
  }

  #serveHere(job: Job): void {
    if (job.stats !== undefined) {
      job.resolve(undefined) // the main thread builds it
      return
    }
    if (job.abandoned?.() === true) {
      job.reject(new ScrapeAbandoned())
      return
    }
    try {
      job.resolve(this.#host.inThread(job.gzip, job.abandoned))
    } catch (error) {
      job.reject(error)
    }
  }

  #pending(): Job[] {
    const pending: Job[] = this.#current === undefined ? [] : [...this.#current.jobs]
    this.#current = undefined
    pending.push(...this.#queue.splice(0))
    return pending
  }
}

/** A scrape the scrape thread could not render (an internal error there): answered 500. */
export class ScrapeThreadError extends MqMetricsError {
  declare readonly code: 'SCRAPE_THREAD_ERROR'
  constructor(message: string) {
    super('SCRAPE_THREAD_ERROR', `the scrape thread failed this scrape: ${message}`)
    this.name = 'ScrapeThreadError'
  }
}
