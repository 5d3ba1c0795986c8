// The surface a broker links in: recording API, quorum state, faults, and the three endpoints.
// It composes the parts; each part lives in the file its name says (STYLE: layout).
import { constants as bufferConstants } from 'node:buffer'
import { EventEmitter } from 'node:events'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { Arena, BackendName, backendReason, chooseBackend, createArena, loadAddon } from './core/backend'
import { Config, ResolvedConfig, resolveConfig } from './core/config'
import type { ConservationReport } from './core/conservation'
import { Observer, ThreadFields } from './core/observer'
import { ClosedError, UsageError } from './core/errors'
import { FaultLog, FaultRecord, faultRecord } from './core/faults'
import type { GzipBody } from './exposition/gzip'
import { HttpHost, createHandler, listen as listenHttp } from './http/server'
import { describe, isPlainObject, validateName } from './core/labels'
import { LATENCY_BUCKETS, LatencyEstimator, LatencyWindow, QuantilesFromCounts, latencyEstimator } from './core/latency'
import { C_NEXT_SLOT, C_SLOT_CHUNKS, C_SLOTS_RESERVED, MAIN_ROW, SLOTS_PER_CHUNK } from './core/layout'
import { Memory } from './core/memory'
import { Quorum, QuorumEvent, RUNBOOK_LEVELS, TIER_NAMES, WriteAnswer } from './core/quorum'
import { keepAnnouncing } from './core/reclamation'
import { Handles } from './core/handles'
import { Recorder } from './core/recording'
import type { Topic } from './core/topic'
import { ArenaUsage, Registry } from './core/registry'
import { Renderer } from './exposition/render'
import type { SharedSurface } from './worker'
import { QuorumState, Snapshot, SnapshotWithPartitions, withPartitions } from './core/snapshot'
import { ResolvedSurfaceOptions, SurfaceOptions, resolveSurfaceOptions } from './http/options'
import { ScrapePacer, ScrapeScheduler } from './http/pacing'
import { StatsContext, StatsRequest, StatsView, StatsViews, THREAD_VIEWS, ConservationFill, statsFromQueryLater, statsPlanOf, statsRequest, statsViewOf } from './exposition/stats'
import { WorkerFaultChannel } from './core/worker-faults'
import { ScrapeThread, ScrapeThreadState } from './scrape/thread'

/** Slots [0, LATENCY_SLOTS) of every row hold the latency estimator's cumulative buckets. */
const LATENCY_SLOTS = 4096
if (LATENCY_BUCKETS > LATENCY_SLOTS) throw new Error('latency buckets do not fit their reserved slots')
/** design §9: the window is 60 s. */
export const LATENCY_WINDOW_MS = 60_000
/** How often the main thread picks up faults raised in worker threads. */
const WORKER_FAULT_POLL_MS = 1000
/**
 * A render must not block the event loop for more than ~25 ms (bench row `render blocking`). GET /metrics renders in
 * slices of about this long (the first one includes the snapshot) with the event loop free between
 * them; a scrape that fits in one slice is answered without a yield.
 */
const RENDER_SLICE_MS = 10

export interface ListenOptions {
  port?: number
  host?: string
}

export interface Listening {
  port: number
  host: string
  url: string
  close(): Promise<void>
}

export class Surface extends EventEmitter {
  readonly backend: BackendName
  /** Where the native core came from, or why the TypeScript backend runs, in words a user can act on. */
  readonly backendReason: string
  readonly enabled: boolean
  readonly config: ResolvedConfig
  /** createSurface()'s second argument, checked, with its defaults (scrape pacing). */
  readonly options: ResolvedSurfaceOptions
  readonly latency: LatencyEstimator
  readonly #arena: Arena
  readonly #registry: Registry
  readonly #recorder: Recorder
  readonly #handles: Handles
  readonly #quorum: Quorum
  readonly #faults = new FaultLog()
  readonly #workerFaults: WorkerFaultChannel
  #pollingWorkerFaults = false
  readonly #observer: Observer
  readonly #renderer = new Renderer()
  readonly #scrapes: ScrapeScheduler
  /** Where /metrics is rendered unless `scrapeThread: false` (lib/scrape/). */
  readonly #scrapeThread: ScrapeThread | undefined
  readonly #window: LatencyWindow
  readonly #timers: NodeJS.Timeout[] = []
  readonly #host: HttpHost
  #handler: ((req: IncomingMessage, res: ServerResponse) => boolean) | undefined
  #server: Listening | undefined
  #starting: Promise<Listening> | undefined
  #connections = 0
  #leaderEpoch = 0
  #leader = false
  #closed = false
  #closing: Promise<void> | undefined

  constructor(config?: Config, options?: SurfaceOptions) {
    super()
    this.config = resolveConfig(config)
    this.options = resolveSurfaceOptions(options)
    this.#scrapes = new ScrapeScheduler(new ScrapePacer(this.options.scrapeShare, this.options.scrapeBurstMs), RENDER_SLICE_MS)
    this.backend = chooseBackend()
    this.backendReason = backendReason(this.backend)
    this.enabled = this.config.metrics_enabled
    this.#arena = createArena(this.backend)
    const memory = new Memory(this.#arena, true)
    // The latency estimator's slots open the first slot chunk; blocks follow them (blocks.ts Blocks.allocate).
    memory.control[C_NEXT_SLOT] = LATENCY_SLOTS
    memory.control[C_SLOT_CHUNKS] = Math.ceil(LATENCY_SLOTS / SLOTS_PER_CHUNK)
    memory.control[C_SLOTS_RESERVED] = LATENCY_SLOTS
    memory.claimRow() // row 1: this (the main) thread
    this.#registry = new Registry(memory, this.config)
    this.#workerFaults = new WorkerFaultChannel(memory)
    this.#faults.countWorkers(() => this.#workerFaults.counts())
    this.#recorder = new Recorder(this.#registry, MAIN_ROW, (...fault) => this.#fault(faultRecord(...fault)))
    this.#handles = new Handles(this.#recorder)
    // Between its tasks this thread is inside no recording call: it says so (reclamation.ts).
    keepAnnouncing(memory)
    this.#quorum = new Quorum(memory.control)
    this.#observer = new Observer(this.#handles, (fault) => this.#fault(fault))
    this.#recorder.leaving = this.#observer.leavingHook(true)
    const native = this.backend === 'native' ? loadAddon() : null
    const nativeQuantiles = native?.latencyQuantiles as QuantilesFromCounts | undefined
    this.#window = new LatencyWindow((out) => this.#sumLatency(out), nativeQuantiles)
    this.latency = latencyEstimator(this.config.e2e_latency ? this.#recorder.cells(0)[0] : new Float64Array(LATENCY_BUCKETS), memory.control, this.config.e2e_latency, this.#window)
    // design §9: every 60 s, unless the broker rotates on its own clock (two clocks would cut windows of any length).
    if (this.config.e2e_latency && this.config.e2e_latency_timer) this.#every(LATENCY_WINDOW_MS, () => this.#window.rotate())
    if (this.options.scrapeThread && this.enabled) {
      this.#scrapeThread = new ScrapeThread({
        data: () => ({ arena: this.#arena.share(), config: { ...this.config }, share: this.options.scrapeShare, burstMs: this.options.scrapeBurstMs }),
        fields: () => this.#threadFields(),
        fault: (fault) => this.#fault(fault),
        confirm: (suspects) => this.#observer.confirm(suspects),
        note: (fault) => {
          this.#faults.note(fault)
          this.#tell('fault', fault)
        },
        inThread: (gzip, abandoned) => (gzip ? this.#metricsGzipHere(abandoned) : this.#metricsBodyHere(abandoned)),
      })
    }
    this.#host = {
      enabled: this.enabled,
      authToken: this.config.metrics_auth_token,
      metricsBody: (abandoned) => this.#metricsBody(abandoned),
      metricsGzip: (abandoned) => this.#metricsGzip(abandoned),
      metricsSent: (body) => {
        if (this.#scrapeThread?.recycle(body) !== true) this.#renderer.recycle(body)
      },
      healthz: () => this.#healthz().then((body) => ({ statusCode: body.quorum_state === 2 ? 503 : 200, body })),
      // A closed surface answers 503 whatever the query (a bad one included), as /metrics and /healthz do.
      stats: (query, abandoned) => (this.#assertOpen(), statsFromQueryLater(query, (request) => this.#statsAnswer(request, abandoned))),
      // A request answered 500 INTERNAL: a bug of ours. Told to 'error' listeners if there are
      // any; never thrown (an 'error' event without a listener would end the broker).
      reportError: (error) => {
        if (this.listenerCount('error') > 0) this.emit('error', error instanceof Error ? error : new Error(`internal error: ${describe(error)}`))
      },
      limits: { maxConnections: this.options.maxConnections, maxScrapeBytes: this.options.maxScrapeBytes },
    }
  }

  // ---- broker-wide ----

  get quorumState(): QuorumState {
    return this.#quorum.state
  }

  /**
   * Whether close() has been called (true from that call on, before it resolves): every recording,
   * registration and reading call then throws ClosedError. Glue whose hooks outlive the surface
   * checks it to stop counting (examples/aedes/instrument.js).
   */
  get closed(): boolean {
    return this.#closed
  }

  connectionOpened(): void {
    this.#assertOpen()
    this.#connections++
  }

  connectionClosed(): void {
    this.#assertOpen()
    if (this.#connections === 0) {
      this.#fault(faultRecord('CONNECTIONS_UNDERFLOW', 'mq_connections', {}, 0, -1))
      return
    }
    this.#connections--
  }

  /** design §5: the epoch only increases; a decrease is fault EPOCH_REGRESSION and is not stored. */
  setLeaderEpoch(epoch: number): boolean {
    this.#assertOpen()
    if (typeof epoch !== 'number') throw new TypeError(`epoch must be a non-negative integer, got ${describe(epoch)}`)
    if (!Number.isSafeInteger(epoch) || epoch < 0) throw new RangeError(`epoch must be a non-negative integer, got ${describe(epoch)}`)
    if (epoch < this.#leaderEpoch) {
      this.#fault(faultRecord('EPOCH_REGRESSION', 'mq_leader_epoch', {}, this.#leaderEpoch, epoch))
      return false
    }
    this.#leaderEpoch = epoch
    return true
  }

  /**
   * Whether this node thinks it leads (docs/cluster.md). Shown on /healthz as `leader`, where
   * `mq-stats` reads it to name a cluster's leader; not a metric (the allowlist is closed).
   */
  setLeader(leads: boolean): void {
    this.#assertOpen()
    if (typeof leads !== 'boolean') throw new TypeError(`leads must be a boolean, got ${describe(leads)}`)
    this.#leader = leads
  }

  /** design §6: re-evaluates the tier from this round; returns the new tier. */
  replicationRound(round: { replicas: number; inSync: number; lagging?: readonly string[] | null }): QuorumState {
    this.#assertOpen()
    const change = this.#quorum.round(round)
    if (change) this.#tell('quorum', change satisfies QuorumEvent)
    return this.#quorum.state
  }

  admitWrite(): WriteAnswer {
    this.#assertOpen()
    return this.#quorum.admitWrite()
  }

  // ---- topics ----

  topic(name: string): Topic {
    this.#assertOpen()
    return this.#handles.topic(name)
  }

  /** Its series leave the next scrape; a topic created again later starts from zero. */
  removeTopic(name: string): boolean {
    this.#assertOpen()
    validateName('topic name', name) // design §3.6, as for topic(): '' or 1,025 characters is a RangeError
    const tell = this.#recorder.leaving?.(name, undefined, undefined)
    try {
      const removed = this.#registry.removeTopic(name)
      this.#handles.forget(name)
      return removed
    } finally {
      tell?.() // once the removal is made (or refused): a listener may remove or register the topic itself
    }
  }

  // ---- reading ----

  /** One consistent view of every number (also runs the conservation check). */
  snapshot(): SnapshotWithPartitions {
    return withPartitions(this.#observe(true))
  }

  /** @internal The longest string render() makes (V8's limit); tests lower it. */
  maxRenderChars: number = bufferConstants.MAX_STRING_LENGTH

  render(): string {
    const body = this.#renderer.render(this.#observe())
    if (body.length > this.maxRenderChars) {
      // V8 would throw its own ERR_STRING_TOO_LONG from toString(): some 51,000 topics with
      // 1,000-character names and a short-named group each are past it. GET /metrics sends the bytes as they are.
      const length = body.length
      this.#renderer.recycle(body)
      throw new RangeError(
        `surface.render(): the /metrics body is ${length} bytes, longer than a JavaScript string can be (${this.maxRenderChars}); ` +
          'serve it with listen() (GET /metrics sends the bytes without making a string), or register fewer or shorter names',
      )
    }
    // The body is ASCII (label values are sanitized, help texts and numbers are ASCII), so latin1
    // decodes it exactly; Node makes a large latin1 string an external one (one copy), where utf8
    // decoding validates every byte: 30 ms of a 187k-sample render() here (bench/render.js).
    const text = body.toString('latin1')
    this.#renderer.recycle(body)
    return text
  }

  /**
   * design §7: one view of the numbers, typed per view (an unknown view is a StatsError). The view
   * and filter are checked before the read, as /stats does: a refused call reads nothing, so it
   * raises no fault (the conservation check runs with the read).
   */
  stats<V extends StatsView>(view: V, filter: { topic?: string; group?: string } = {}): StatsViews[V] {
    if (!isPlainObject(filter)) throw new TypeError(`stats filter must be an object, got ${describe(filter)}`)
    const request = statsRequest(view, filter)
    return statsViewOf(request, this.#statsContext()) as StatsViews[V]
  }

  /** Mounts into the broker's own node:http server: true when it handled the request. */
  handler(req: IncomingMessage, res: ServerResponse): boolean {
    this.#handler ??= createHandler(this.#host)
    return this.#handler(req, res)
  }

  async listen(options: ListenOptions = {}): Promise<Listening> {
    this.#assertOpen()
    // One server per surface, counting one still binding: two listen() calls in the same tick
    // would otherwise both bind, and close() would know only the second.
    if (this.#server || this.#starting) {
      const where = this.#server ? `listening on ${this.#server.url}` : 'starting its server'
      throw new UsageError('ALREADY_LISTENING', `mq-metrics is already ${where}: close the server listen() returned first (its close(); surface.close() ends the whole surface)`)
    }
    const attempt = this.#start(options)
    this.#starting = attempt
    try {
      return await attempt
    } finally {
      this.#starting = undefined
    }
  }

  async #start(options: ListenOptions): Promise<Listening> {
    const server = await listenHttp(this.#host, options)
    if (this.#closed) {
      // close() ran while the port was being bound: nothing may stay open after it.
      await server.close()
      throw new ClosedError('this mq-metrics surface')
    }
    const listening: Listening = {
      ...server,
      close: async () => {
        if (this.#server === listening) this.#server = undefined
        await server.close()
      },
    }
    this.#server = listening
    return listening
  }

  /** Idempotent: every call returns the one closing, done once the server and memory are gone. */
  close(): Promise<void> {
    this.#closing ??= this.#close()
    return this.#closing
  }

  async #close(): Promise<void> {
    this.#closed = true
    this.#registry.close() // every handle, in every thread, throws ClosedError from its next call
    // A scrape rendered here, under way or waiting: refused now (503 SURFACE_CLOSED), its timers cleared.
    this.#scrapes.close(new ClosedError('this mq-metrics surface'))
    for (const timer of this.#timers) clearInterval(timer)
    // A listen() under way finishes first (and, seeing the surface closed, closes its server).
    await this.#starting?.catch(() => {})
    await this.#scrapeThread?.close()
    const server = this.#server
    this.#server = undefined
    if (server) await server.close()
    this.#arena.release()
  }

  // ---- worker threads ----

  share(): SharedSurface {
    this.#assertOpen()
    if (!this.#pollingWorkerFaults) {
      this.#pollingWorkerFaults = true
      this.#every(WORKER_FAULT_POLL_MS, () => this.#drainWorkerFaults())
    }
    return { kind: 'mq-metrics/shared-surface', version: 1, arena: this.#arena.share(), config: { ...this.config } }
  }

  /** @internal Slot bookkeeping, for leak checks (tests; users read arenaUsage().slotsInUse). */
  slotsInUse(): number {
    return this.#registry.slotsInUse()
  }

  /** Diagnostics for leak checks: slots in use and ever reserved, freed blocks waiting for reuse, arena chunks, registration log bytes, thread rows in use. */
  arenaUsage(): ArenaUsage {
    return this.#registry.arenaUsage()
  }

  // ---- internals ----

  /**
   * GET /metrics: the snapshot in one go (under the lock, which is never held across a yield),
   * then the body in slices with the event loop free between them, one scrape at a time and paced
   * (lib/http/pacing.ts). The snapshot is immutable, so the body is exactly that one moment's numbers
   * however many slices it takes: never a torn scrape.
   */
  #metricsBodyHere(abandoned?: () => boolean): Buffer | Promise<Buffer> {
    return this.#scrapes.run(() => this.#renderer.begin(this.#observe()), (job) => job.body(), abandoned)
  }

  /** The same for a client that accepts gzip: only the chunks of topics that changed are compressed anew. */
  #metricsGzipHere(abandoned?: () => boolean): GzipBody | Promise<GzipBody> {
    return this.#scrapes.run(() => this.#renderer.beginGzip(this.#observe()), (job) => job.result(), abandoned)
  }

  /** GET /metrics: in the scrape thread (lib/scrape/), else here. */
  #metricsBody(abandoned?: () => boolean): Buffer | Promise<Buffer> {
    if (this.#scrapeThread === undefined) return this.#metricsBodyHere(abandoned)
    this.#assertOpen()
    return this.#scrapeThread.request(false, abandoned).then((body) => this.#scraped(body) as Buffer)
  }

  #metricsGzip(abandoned?: () => boolean): GzipBody | Promise<GzipBody> {
    if (this.#scrapeThread === undefined) return this.#metricsGzipHere(abandoned)
    this.#assertOpen()
    return this.#scrapeThread.request(true, abandoned).then((body) => this.#scraped(body) as GzipBody)
  }

  /** A scrape came back from the scrape thread: the worker threads' faults are picked up as an in-thread scrape does. */
  #scraped<T>(body: T): T {
    this.#drainWorkerFaults()
    return body
  }

  /** Where GET /metrics is rendered and how the scrape thread has fared (docs/scrape-thread.md). */
  get scrapeThread(): ScrapeThreadState {
    return this.#scrapeThread?.state ?? { mode: 'main', scrapes: 0, views: 0, reread: 0, failures: 0, lastFailure: undefined }
  }

  /** The snapshot and the conservation check (lib/core/observer.ts), and the worker threads' faults. */
  #observe(ackFloors?: boolean): Snapshot
  #observe(ackFloors: boolean, report: true): [Snapshot, ConservationReport]
  #observe(ackFloors = false, report = false): Snapshot | [Snapshot, ConservationReport] {
    this.#assertOpen()
    const observed = this.#observer.observe(this.#threadFields(), ackFloors, report as true)
    this.#drainWorkerFaults()
    return observed
  }

  /** What only this thread knows of a snapshot's numbers. */
  #threadFields(): ThreadFields {
    return {
      uptimeSeconds: process.uptime(),
      connections: this.#connections,
      leaderEpoch: this.#leaderEpoch,
      replicas: this.#quorum.replicas,
      inSync: this.#quorum.inSync,
      lagging: this.#quorum.lagging,
      latency: this.config.e2e_latency ? this.#window.quantiles() : null,
    }
  }

  /**
   * A /stats view over HTTP: its JSON built in the scrape thread (the large views, docs/scrape-thread.md),
   * else the view as planned here, from a read in slices (#statsContextLater). The small views read
   * no topic: quorum, latency and config none at all, faults the conservation check's faults (the
   * check alone, as /healthz runs it, begun after the request).
   */
  async #statsAnswer(request: StatsRequest, abandoned?: () => boolean): Promise<unknown> {
    if (!THREAD_VIEWS.has(request.view)) {
      if (request.view === 'faults') await this.#observer.checkAfter()
      this.#assertOpen() // closed meanwhile (as #statsContextLater)
      this.#drainWorkerFaults()
      return statsPlanOf(request, this.#contextOf({ ...this.#threadFields(), quorumState: this.quorumState, topics: [] }, { topics: [] }))
    }
    if (this.#scrapeThread !== undefined) {
      const built = await this.#scrapeThread.stats(request, abandoned)
      this.#assertOpen() // closed meanwhile (as #statsContextLater)
      if (built?.back !== undefined) {
        // Topics of a conservation view the thread could not judge: read again here, between this thread's tasks.
        const fill = new ConservationFill(built.json, built.back, request.narrow)
        await this.#observer.reportTopics(built.back.topics, (topic) => fill.add(topic))
        this.#assertOpen()
        return this.#scraped(fill.finish())
      }
      if (built !== undefined) return this.#scraped(built.json)
    }
    return statsPlanOf(request, await this.#statsContextLater())
  }

  /**
   * #statsContext() for /stats over HTTP: the same snapshot and report, read in slices with the
   * event loop free between them, so a request (mq-stats --watch polls) never holds the broker's
   * thread for a whole read.
   */
  async #statsContextLater(): Promise<StatsContext> {
    this.#assertOpen()
    const [snapshot, conservation] = await this.#observer.observeReport(() => this.#threadFields())
    this.#assertOpen() // closed while it read: a request under way is answered 503, not with a closed surface's numbers
    this.#drainWorkerFaults()
    return this.#contextOf(snapshot, conservation)
  }

  #statsContext(): StatsContext {
    const [snapshot, conservation] = this.#observe(true, true)
    return this.#contextOf(snapshot, conservation)
  }

  #contextOf(snapshot: Snapshot, conservation: ConservationReport): StatsContext {
    return { snapshot, faults: this.#faults.view(), config: this.config, conservation, backend: this.backend, backendReason: this.backendReason }
  }

  /**
   * /healthz: the conservation check first (its faults are in `faults`), read in slices with the
   * event loop free between them, so a probe of a large surface never holds the broker's thread
   * for the whole read (docs/endpoints.md).
   */
  async #healthz() {
    this.#assertOpen()
    await this.#observer.checkSliced()
    this.#assertOpen() // closed while it read (as #statsContextLater)
    this.#drainWorkerFaults()
    const state = this.#quorum.state
    return {
      status: TIER_NAMES[state],
      quorum_state: state,
      runbook_level: RUNBOOK_LEVELS[state],
      leader_epoch: this.#leaderEpoch,
      leader: this.#leader,
      replicas: this.#quorum.replicas,
      in_sync: this.#quorum.inSync,
      lagging: this.#quorum.lagging,
      uptime_seconds: process.uptime(),
      faults: this.#faults.total,
    }
  }

  // ---- events: 'fault', 'quorum' and 'error' (a request answered 500); a listener for any other name would never be called ----

  override on(event: 'fault', listener: (fault: FaultRecord) => void): this
  override on(event: 'quorum', listener: (change: QuorumEvent) => void): this
  override on(event: 'error', listener: (error: Error) => void): this
  override on(event: 'newListener' | 'removeListener', listener: (event: string | symbol, listener: (...args: any[]) => void) => void): this
  override on(event: symbol, listener: (...args: any[]) => void): this // events.errorMonitor
  override on(event: string | symbol, listener: (...args: any[]) => void): this {
    return super.on(knownEvent(event), listener)
  }

  override once(event: 'fault', listener: (fault: FaultRecord) => void): this
  override once(event: 'quorum', listener: (change: QuorumEvent) => void): this
  override once(event: 'error', listener: (error: Error) => void): this
  override once(event: 'newListener' | 'removeListener', listener: (event: string | symbol, listener: (...args: any[]) => void) => void): this
  override once(event: symbol, listener: (...args: any[]) => void): this // events.errorMonitor
  override once(event: string | symbol, listener: (...args: any[]) => void): this {
    return super.once(knownEvent(event), listener)
  }

  override addListener(event: 'fault', listener: (fault: FaultRecord) => void): this
  override addListener(event: 'quorum', listener: (change: QuorumEvent) => void): this
  override addListener(event: 'error', listener: (error: Error) => void): this
  override addListener(event: 'newListener' | 'removeListener', listener: (event: string | symbol, listener: (...args: any[]) => void) => void): this
  override addListener(event: symbol, listener: (...args: any[]) => void): this // events.errorMonitor
  override addListener(event: string | symbol, listener: (...args: any[]) => void): this {
    return super.addListener(knownEvent(event), listener)
  }

  override prependListener(event: 'fault', listener: (fault: FaultRecord) => void): this
  override prependListener(event: 'quorum', listener: (change: QuorumEvent) => void): this
  override prependListener(event: 'error', listener: (error: Error) => void): this
  override prependListener(event: 'newListener' | 'removeListener', listener: (event: string | symbol, listener: (...args: any[]) => void) => void): this
  override prependListener(event: symbol, listener: (...args: any[]) => void): this // events.errorMonitor
  override prependListener(event: string | symbol, listener: (...args: any[]) => void): this {
    return super.prependListener(knownEvent(event), listener)
  }

  override prependOnceListener(event: 'fault', listener: (fault: FaultRecord) => void): this
  override prependOnceListener(event: 'quorum', listener: (change: QuorumEvent) => void): this
  override prependOnceListener(event: 'error', listener: (error: Error) => void): this
  override prependOnceListener(event: 'newListener' | 'removeListener', listener: (event: string | symbol, listener: (...args: any[]) => void) => void): this
  override prependOnceListener(event: symbol, listener: (...args: any[]) => void): this // events.errorMonitor
  override prependOnceListener(event: string | symbol, listener: (...args: any[]) => void): this {
    return super.prependOnceListener(knownEvent(event), listener)
  }

  override off(event: 'fault', listener: (fault: FaultRecord) => void): this
  override off(event: 'quorum', listener: (change: QuorumEvent) => void): this
  override off(event: 'error', listener: (error: Error) => void): this
  override off(event: 'newListener' | 'removeListener', listener: (event: string | symbol, listener: (...args: any[]) => void) => void): this
  override off(event: symbol, listener: (...args: any[]) => void): this // events.errorMonitor
  override off(event: string | symbol, listener: (...args: any[]) => void): this {
    return super.off(knownEvent(event), listener)
  }

  override removeListener(event: 'fault', listener: (fault: FaultRecord) => void): this
  override removeListener(event: 'quorum', listener: (change: QuorumEvent) => void): this
  override removeListener(event: 'error', listener: (error: Error) => void): this
  override removeListener(event: 'newListener' | 'removeListener', listener: (event: string | symbol, listener: (...args: any[]) => void) => void): this
  override removeListener(event: symbol, listener: (...args: any[]) => void): this // events.errorMonitor
  override removeListener(event: string | symbol, listener: (...args: any[]) => void): this {
    return super.removeListener(knownEvent(event), listener)
  }

  override emit(event: 'fault', fault: FaultRecord): boolean
  override emit(event: 'quorum', change: QuorumEvent): boolean
  override emit(event: 'error', error: Error): boolean
  override emit(event: 'newListener' | 'removeListener', name: string | symbol, listener: (...args: any[]) => void): boolean
  override emit(event: symbol, ...args: any[]): boolean
  override emit(event: string | symbol, ...args: any[]): boolean {
    const name = knownEvent(event)
    // A listener of 'fault', 'quorum' or 'error' reads the payload as the surface sends it: one of
    // another shape, emitted by hand (a test, a bridge), is refused here, not met in the listener.
    const payload: unknown = args[0]
    const record = payload !== null && typeof payload === 'object' ? (payload as Record<string, unknown>) : undefined
    if (name === 'fault' && !(record !== undefined && typeof record.code === 'string' && typeof record.metric === 'string' && record.labels !== null && typeof record.labels === 'object')) {
      throw new TypeError(`emit('fault', …) takes a fault record ({ code, metric, labels, previous, attempted, at }), got ${describe(payload)}`)
    }
    if (name === 'quorum' && !(record !== undefined && [0, 1, 2].includes(record.from as number) && [0, 1, 2].includes(record.to as number))) {
      throw new TypeError(`emit('quorum', …) takes a quorum change ({ from, to, replicas, inSync, lagging, at }, from and to 0, 1 or 2), got ${describe(payload)}`)
    }
    if (name === 'error' && !(payload instanceof Error)) {
      throw new TypeError(`emit('error', …) takes an Error, got ${describe(payload)}`)
    }
    return super.emit(name, ...args)
  }

  #fault(fault: FaultRecord): void {
    this.#faults.add(fault)
    this.#tell('fault', fault)
  }

  /**
   * Emits `'fault'` or `'quorum'` to each listener in turn. The call that raised it has made its
   * writes already and must return what it returns: a listener that throws does not end it, nor
   * keep the next listener from hearing; its error is thrown again on the next tick, where it is
   * an uncaught exception as it would be in a timer (node:diagnostics_channel does the same).
   */
  #tell(event: 'fault' | 'quorum', value: FaultRecord | QuorumEvent): void {
    for (const listener of this.rawListeners(event)) {
      try {
        listener.call(this, value)
      } catch (error) {
        process.nextTick(() => {
          throw error
        })
      }
    }
  }

  /** Faults workers raised since the last drain (counted already, in shared memory): logged and emitted once. */
  #drainWorkerFaults(): void {
    for (const fault of this.#workerFaults.drain()) {
      this.#faults.note(fault)
      this.#tell('fault', fault)
    }
  }

  #sumLatency(out: Float64Array): void {
    out.fill(0)
    const memory = this.#registry.memory
    for (let row = 1; row < memory.rowCount(); row++) {
      const chunk = memory.rowChunk(row, 0, false)
      if (chunk === undefined) continue
      for (let b = 0; b < LATENCY_BUCKETS; b++) out[b] += chunk[b]
    }
  }

  #every(ms: number, fn: () => void): void {
    const timer = setInterval(fn, ms)
    timer.unref()
    this.#timers.push(timer)
  }

  #assertOpen(): void {
    if (this.#closed) throw new ClosedError('this mq-metrics surface')
  }
}

/**
 * The events a surface emits, and EventEmitter's own. 'error' only when one of the surface's own
 * HTTP answers failed (500 INTERNAL), and only to listeners: a bad call throws, a broken invariant
 * is a 'fault'. Symbols (events.errorMonitor) pass.
 */
const EVENTS: ReadonlySet<string> = new Set(['fault', 'quorum', 'newListener', 'removeListener', 'error'])

function knownEvent(event: string | symbol): string | symbol {
  if (typeof event === 'string' && !EVENTS.has(event)) {
    throw new TypeError(`unknown event ${JSON.stringify(event)}: a surface emits 'fault', 'quorum' and 'error'`)
  }
  return event
}

