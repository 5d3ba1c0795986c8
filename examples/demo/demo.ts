#!/usr/bin/env node
// `npm start` / `mq-demo` (design §13): a simulated broker that links in this library exactly as a
// real one would — only the public API, from 'mq-metrics' — and serves /metrics, /healthz and /stats.
//
// Producers append to several topics × partitions and consult admitWrite() before every batch;
// two consumer groups per topic dispatch, retry up to max_attempts, drop and dead-letter (the DLQ
// write fails now and then); one worker thread owns some topics end to end through
// attachSurface(); replication rounds every 250 ms drive the quorum tier (`degraded` cycles
// healthy → soft → read_only → healthy). The books are honest (see broker.ts), so the
// conservation identity (design §4) holds in every quiet window and no fault is raised.
import * as path from 'node:path'
import { Worker } from 'node:worker_threads'
import { SimulatedTopic, SimulationTotals, addTotals, emptyTotals } from './broker'
import type { DemoWorkerData, FromWorker, ToWorker } from './worker'
import { clusterCli } from './cluster'
import { onStop } from './stop'
import { UsageError, scanFlags } from './flags'

export { UsageError }
import { createSurface } from 'mq-metrics'
import type { ConservationView, FaultRecord, Listening, QuorumEvent, Surface } from 'mq-metrics'

export const DEFAULT_PORT = 9464
export const DEFAULT_HOST = '127.0.0.1'
export const DEFAULT_TOPICS = 4
export const DEFAULT_RATE = 2000
export const SCENARIOS = ['steady', 'degraded'] as const
export type Scenario = (typeof SCENARIOS)[number]

/** EX_USAGE (sysexits.h), as mq-stats uses for its usage errors (design §10). */
export const EXIT_USAGE = 64

const PARTITIONS_PER_TOPIC = 4
const MAX_ATTEMPTS = 5
const TICK_MS = 10
const ROUND_MS = 250
/** `degraded`: each of healthy, soft and read_only lasts this long (seconds), then the cycle repeats. */
const DEFAULT_PHASE = 2
/** Bound on the drain at shutdown (consumers settle what was dispatched; producers are stopped). */
const DRAIN_MS = 2000
/** How long the main thread waits for the worker to confirm it stopped writing. */
const FENCE_TIMEOUT_MS = 1000
const MAX_TOPICS = 100
const MAX_RATE = 1_000_000

const TOPIC_NAMES = ['orders', 'payments', 'shipments', 'inventory', 'notifications', 'clickstream', 'audit', 'invoices']

export const USAGE = `usage: mq-demo [options]

Runs a simulated message broker that records through mq-metrics and serves
/metrics, /healthz and /stats.

options:
  --port PORT              port to listen on (default ${DEFAULT_PORT}; 0 picks a free port)
  --host HOST              address to listen on (default ${DEFAULT_HOST})
  --duration SECONDS       stop after this long (default: run until Ctrl-C)
  --topics N               number of topics, ${PARTITIONS_PER_TOPIC} partitions each (default ${DEFAULT_TOPICS}, at most ${MAX_TOPICS})
  --rate MSGS_PER_SECOND   total producer rate over all topics (default ${DEFAULT_RATE})
  --scenario NAME          steady: a healthy quorum with rare brief soft rounds (default)
                           degraded: cycles healthy -> soft -> read_only -> healthy
  --phase SECONDS          length of each degraded phase (default ${DEFAULT_PHASE}, at least 0.5)
  --nodes N                run a cluster of N nodes instead (mq-demo --nodes 3 --help)
  -h, --help               show this help
`

export interface DemoOptions {
  port?: number
  host?: string
  /** Seconds; undefined runs until stop() (or SIGINT/SIGTERM in the CLI). */
  duration?: number
  topics?: number
  rate?: number
  scenario?: Scenario
  /** Seconds each phase of the `degraded` cycle lasts (default 2). */
  phase?: number
  /** No output at all (tests). */
  quiet?: boolean
  /** Where the URLs, quorum changes and the live summary go (default process.stdout). */
  out?: NodeJS.WriteStream | NodeJS.WritableStream
  /** Where faults and errors go (default process.stderr). */
  err?: NodeJS.WritableStream
}

interface ResolvedOptions {
  port: number
  host: string
  duration: number | undefined
  topics: number
  rate: number
  scenario: Scenario
  phase: number
}

export interface DemoResult {
  /** What stopped the demo: 'duration', a signal name, 'stop', or 'error'. */
  reason: string
  /** Every group settled every message before the drain bound. */
  drained: boolean
  /** The demo's own books (main thread and worker), for comparison with the library's numbers. */
  totals: SimulationTotals
  /** Faults by code over the whole run (design §7 `faults` view `counts`). */
  faults: Record<string, number>
  /** `surface.stats('conservation')` after the drain, before the surface closed. */
  conservation: ConservationView
  /** A worker or tick error that ended the run; the CLI exits 1 when set. */
  error?: Error
}

export interface Demo {
  readonly surface: Surface
  readonly url: string
  readonly port: number
  readonly host: string
  readonly topics: { main: string[]; worker: string[] }
  /** Stops producing, drains, joins the worker, closes the server and the surface. Idempotent. */
  stop(reason?: string): Promise<DemoResult>
  /** Settles when the demo has stopped (after --duration, or stop()). */
  readonly done: Promise<DemoResult>
}

// ---- options ----

function integerIn(flag: string, value: unknown, min: number, max: number): number {
  const n = typeof value === 'string' && value.trim() !== '' ? Number(value) : value
  if (typeof n !== 'number' || !Number.isInteger(n) || n < min || n > max) {
    throw new UsageError(`${flag} must be an integer from ${min} to ${max}, got ${JSON.stringify(value)}`)
  }
  return n
}

function positiveNumber(flag: string, value: unknown, max: number): number {
  const n = typeof value === 'string' && value.trim() !== '' ? Number(value) : value
  if (typeof n !== 'number' || !Number.isFinite(n) || n <= 0 || n > max) {
    throw new UsageError(`${flag} must be a number greater than 0 and at most ${max}, got ${JSON.stringify(value)}`)
  }
  return n
}

function resolveOptions(options: DemoOptions & Record<string, unknown>): ResolvedOptions {
  const known = new Set(['port', 'host', 'duration', 'topics', 'rate', 'scenario', 'phase', 'quiet', 'out', 'err'])
  for (const key of Object.keys(options)) if (!known.has(key)) throw new UsageError(`unknown option ${JSON.stringify(key)}`)
  const host = options.host ?? DEFAULT_HOST
  if (typeof host !== 'string' || host === '') throw new UsageError(`--host must be a non-empty address, got ${JSON.stringify(host)}`)
  const scenario = options.scenario ?? 'steady'
  if (!SCENARIOS.includes(scenario)) throw new UsageError(`--scenario must be one of ${SCENARIOS.join(', ')}, got ${JSON.stringify(scenario)}`)
  return {
    port: integerIn('--port', options.port ?? DEFAULT_PORT, 0, 65535),
    host,
    duration: options.duration === undefined ? undefined : positiveNumber('--duration', options.duration, 366 * 86400),
    topics: integerIn('--topics', options.topics ?? DEFAULT_TOPICS, 1, MAX_TOPICS),
    rate: positiveNumber('--rate', options.rate ?? DEFAULT_RATE, MAX_RATE),
    scenario,
    phase: phaseOf(options.phase ?? DEFAULT_PHASE),
  }
}

/** A degraded phase holds at least two replication rounds (every ROUND_MS), so each tier is seen. */
function phaseOf(value: unknown): number {
  const phase = positiveNumber('--phase', value, 3600)
  if (phase * 1000 < 2 * ROUND_MS) throw new UsageError(`--phase must be at least ${(2 * ROUND_MS) / 1000} (two replication rounds), got ${JSON.stringify(value)}`)
  return phase
}

/** Parses the command line; `help` is true for -h/--help. Throws UsageError. */
export function parseArgs(argv: readonly string[]): { help: boolean; options: DemoOptions } {
  const takesValue: Record<string, keyof DemoOptions> = {
    '--port': 'port',
    '--host': 'host',
    '--duration': 'duration',
    '--topics': 'topics',
    '--rate': 'rate',
    '--scenario': 'scenario',
    '--phase': 'phase',
  }
  const { help, values } = scanFlags(argv, Object.keys(takesValue))
  const raw: Record<string, string> = {}
  for (const [flag, value] of values) raw[takesValue[flag]] = value
  if (help) return { help, options: {} }
  const options: DemoOptions = {}
  if (raw.port !== undefined) options.port = integerIn('--port', raw.port, 0, 65535)
  if (raw.host !== undefined) options.host = raw.host
  if (raw.duration !== undefined) options.duration = positiveNumber('--duration', raw.duration, 366 * 86400)
  if (raw.topics !== undefined) options.topics = integerIn('--topics', raw.topics, 1, MAX_TOPICS)
  if (raw.rate !== undefined) options.rate = positiveNumber('--rate', raw.rate, MAX_RATE)
  if (raw.scenario !== undefined) options.scenario = raw.scenario as Scenario
  if (raw.phase !== undefined) options.phase = phaseOf(raw.phase)
  resolveOptions(options as DemoOptions & Record<string, unknown>) // validate the combination now
  return { help, options }
}

// ---- replication rounds ----

interface Round {
  replicas: number
  inSync: number
  /** The followers out of sync, by name: /healthz and `mq-stats quorum` show them. */
  lagging: string[]
}

/** design §6: no majority in sync → read_only. The broker knows its round before it reports it. */
function isReadOnly(round: Round): boolean {
  return round.inSync * 2 <= round.replicas
}

/** The replication round the scenario produces at `elapsedMs`. */
function roundSource(scenario: Scenario, phaseSeconds: number): (elapsedMs: number) => Round {
  if (scenario === 'degraded') {
    const phases: Round[] = [
      { replicas: 3, inSync: 3, lagging: [] }, // healthy
      { replicas: 3, inSync: 2, lagging: ['follower-2'] }, // soft: a follower lags
      { replicas: 3, inSync: 1, lagging: ['follower-1', 'follower-2'] }, // read_only: no majority
    ]
    return (elapsedMs) => phases[Math.floor(elapsedMs / (phaseSeconds * 1000)) % phases.length]
  }
  // steady: all in sync; now and then (about every 30 s) a follower lags for a few rounds.
  let lagging = 0
  return () => {
    if (lagging > 0) lagging--
    else if (Math.random() < 1 / 120) lagging = 2 + Math.floor(Math.random() * 4)
    return lagging > 0 ? { replicas: 3, inSync: 2, lagging: ['follower-2'] } : { replicas: 3, inSync: 3, lagging: [] }
  }
}

// ---- output ----

const TIERS = ['healthy', 'soft', 'read_only'] as const

class Console {
  readonly #out: NodeJS.WritableStream | undefined
  readonly #err: NodeJS.WritableStream | undefined
  readonly tty: boolean
  #liveShown = false

  constructor(quiet: boolean, out: NodeJS.WritableStream, err: NodeJS.WritableStream) {
    this.#out = quiet ? undefined : out
    this.#err = quiet ? undefined : err
    this.tty = !quiet && (out as NodeJS.WriteStream).isTTY === true
  }

  line(text: string): void {
    this.#clearLive()
    this.#out?.write(`${text}\n`)
  }

  error(text: string): void {
    this.#clearLive()
    this.#err?.write(`${text}\n`)
  }

  /** The one-line live summary: rewritten in place on a TTY, else printed as a line. */
  live(text: string): void {
    if (this.tty) {
      this.#out?.write(`\r\x1b[K${text}`)
      this.#liveShown = true
    } else {
      this.#out?.write(`${text}\n`)
    }
  }

  #clearLive(): void {
    if (this.#liveShown) this.#out?.write('\r\x1b[K')
    this.#liveShown = false
  }
}

function topicNames(count: number): string[] {
  return Array.from({ length: count }, (_, i) => (i < TOPIC_NAMES.length ? TOPIC_NAMES[i] : `topic-${i + 1}`))
}

// ---- the demo ----

/**
 * Starts the simulated broker and resolves once it is serving. `demo.done` settles with the
 * final books (including the conservation view after the drain) when it stops.
 */
export async function runDemo(input: DemoOptions = {}): Promise<Demo> {
  const options = resolveOptions(input as DemoOptions & Record<string, unknown>)
  const io = new Console(input.quiet === true, input.out ?? process.stdout, input.err ?? process.stderr)

  const surface = createSurface({ e2e_latency: true, max_attempts: MAX_ATTEMPTS, max_in_flight: 1000 })
  let listening: Listening
  try {
    listening = await surface.listen({ port: options.port, host: options.host })
  } catch (error) {
    await surface.close()
    throw listenError(error, options)
  }

  // A worker owns every other topic (all of them when there is only one); the main thread the rest.
  const names = topicNames(options.topics)
  const workerTopics = names.length === 1 ? names : names.filter((_, i) => i % 2 === 1)
  const mainTopics = names.filter((name) => !workerTopics.includes(name))
  const topicRate = options.rate / names.length
  const simulation = { partitions: PARTITIONS_PER_TOPIC, maxAttempts: MAX_ATTEMPTS, tickMs: TICK_MS }
  const mainSims = mainTopics.map((name) => new SimulatedTopic(surface, name, simulation))

  const faults: FaultRecord[] = []
  surface.on('fault', (fault: FaultRecord) => {
    faults.push(fault)
    io.error(`fault: ${fault.code} ${fault.metric}${JSON.stringify(fault.labels)} previous=${fault.previous} attempted=${fault.attempted}`)
  })
  let epoch = 1
  surface.setLeaderEpoch(epoch)
  surface.on('quorum', (event: QuorumEvent) => {
    let note = event.to === 2 ? '; producers back off (READ_ONLY_DEGRADED)' : event.to === 1 ? '; writes admitted with FOLLOWER_LAG' : ''
    if (event.from === 2) {
      // Leaving read_only means a new leader was elected with a majority behind it.
      surface.setLeaderEpoch(++epoch)
      note += `; new leader, epoch ${epoch}`
    }
    const lagging = event.lagging === null || event.lagging.length === 0 ? '' : `; lagging: ${event.lagging.join(', ')}`
    io.line(`quorum: ${TIERS[event.from]} -> ${TIERS[event.to]} (${event.replicas} replicas, ${event.inSync} in sync${lagging})${note}`)
  })
  const clients = names.length * 3 // per topic: one producer, one consumer per group
  for (let i = 0; i < clients; i++) surface.connectionOpened()

  // ---- the worker thread ----
  const workerData: DemoWorkerData = {
    shared: surface.share(),
    topics: workerTopics,
    topicRate,
    partitions: PARTITIONS_PER_TOPIC,
    maxAttempts: MAX_ATTEMPTS,
    tickMs: TICK_MS,
    drainMs: DRAIN_MS,
  }
  const worker = new Worker(path.join(__dirname, 'worker.js'), { workerData })
  let workerTotals = emptyTotals()
  let workerDrained = false
  let workerError: Error | undefined
  let onFenced: (() => void) | undefined
  let onReady: (() => void) | undefined
  let stopRequested: ((reason: string) => void) | undefined
  const workerExited = new Promise<void>((resolve) => worker.once('exit', () => resolve()))
  worker.on('message', (message: FromWorker) => {
    if (message.type === 'ready') onReady?.()
    else if (message.type === 'fenced') onFenced?.()
    else if (message.type === 'totals') workerTotals = message.totals
    else if (message.type === 'drained') {
      workerTotals = message.totals
      workerDrained = message.drained
    }
  })
  worker.on('error', (error) => {
    workerError = error
    io.error(`mq-demo: worker thread failed: ${error.stack ?? error.message}`)
    stopRequested?.('error')
  })
  const post = (message: ToWorker) => worker.postMessage(message)
  const ready = await Promise.race([
    new Promise<boolean>((resolve) => (onReady = () => resolve(true))),
    workerExited.then(() => false),
  ])
  if (!ready) {
    await listening.close()
    await surface.close()
    throw workerError ?? new Error('the demo worker thread exited before it was ready')
  }
  // Every topic, group and partition is registered now and nothing has moved: this first look
  // takes the conservation baselines from settled books (design §4).
  surface.stats('conservation')

  // ---- running ----
  const serving = listening.url.replace(/\/$/, '')
  io.line(`mq-demo: simulated broker, scenario ${options.scenario}, ${names.length} topics x ${PARTITIONS_PER_TOPIC} partitions, 2 consumer groups each, ${options.rate} msg/s`)
  io.line(`mq-demo: ${surface.backendReason}`)
  if (mainTopics.length > 0) io.line(`  main thread topics: ${mainTopics.join(', ')}`)
  io.line(`  worker thread topics: ${workerTopics.join(', ')}`)
  io.line('serving:')
  for (const route of ['/metrics', '/healthz', '/stats?filter=topics']) io.line(`  ${serving}${route}`)
  io.line(options.duration === undefined ? 'press Ctrl-C to stop' : `stopping after ${options.duration} s (Ctrl-C stops earlier)`)

  const started = performance.now()
  let producing = true
  let stopping = false
  let tickError: Error | undefined
  let onMainDrained: (() => void) | undefined
  const admitWrite = () => surface.admitWrite().ok // design §6: producers ask before every batch
  const tick = setInterval(() => {
    try {
      const now = performance.now()
      for (const sim of mainSims) sim.tick(now, topicRate, producing, admitWrite)
      if (!producing && onMainDrained && mainSims.every((sim) => sim.drained())) onMainDrained()
    } catch (error) {
      tickError = error as Error
      io.error(`mq-demo: ${(error as Error).stack ?? error}`)
      clearInterval(tick)
      stopRequested?.('error')
    }
  }, TICK_MS)
  post({ type: 'start' })

  // Replication rounds. Before a round that takes the quorum read_only the worker is fenced
  // (its producers stop and it confirms), so it never attempts a write the quorum refuses.
  const nextRound = roundSource(options.scenario, options.phase)
  let workerWritable = true
  let roundTimer: NodeJS.Timeout | undefined
  const fenceWorker = () =>
    new Promise<void>((resolve) => {
      const timeout = setTimeout(() => {
        io.error(`mq-demo: the worker did not confirm the write fence within ${FENCE_TIMEOUT_MS} ms`)
        resolve()
      }, FENCE_TIMEOUT_MS)
      onFenced = () => {
        clearTimeout(timeout)
        onFenced = undefined
        resolve()
      }
      post({ type: 'writable', value: false })
    })
  const runRound = async () => {
    roundTimer = undefined
    const round = nextRound(performance.now() - started)
    if (isReadOnly(round) && workerWritable) {
      workerWritable = false
      await fenceWorker()
    }
    if (stopping) return
    surface.replicationRound(round)
    if (!isReadOnly(round) && !workerWritable) {
      workerWritable = true
      post({ type: 'writable', value: true })
    }
    roundTimer = setTimeout(runRound, ROUND_MS)
  }
  await runRound()

  // ---- the live summary ----
  // Read back through /stats views — the numbers an operator sees, not the demo's own books.
  let lastProduced = 0
  let lastAt = started
  let seconds = 0
  const summary = setInterval(() => {
    // A terminal gets the live line every second; a log file a line every 5 s.
    if (!io.tty && ++seconds % 5 !== 0) return
    const { totals } = surface.stats('topics') as { totals: Record<'produced' | 'delivered' | 'dropped' | 'dlq', number | bigint> }
    const { groups } = surface.stats('groups') as { groups: { in_flight: number }[] }
    const quorum = surface.stats('quorum') as { status: string; leader_epoch: number }
    const latency = surface.stats('latency') as { p99: number | null }
    const produced = Number(totals.produced)
    const now = performance.now()
    const rate = Math.round(((produced - lastProduced) * 1000) / (now - lastAt))
    lastProduced = produced
    lastAt = now
    const inFlight = groups.reduce((sum, group) => sum + group.in_flight, 0)
    const p99 = latency.p99 === null ? '-' : `${latency.p99.toFixed(1)} ms`
    const elapsed = Math.round((now - started) / 1000)
    io.live(
      `[${String(elapsed).padStart(4)}s] ${quorum.status.padEnd(9)} epoch ${quorum.leader_epoch}  produced ${produced} (${rate}/s)  ` +
        `delivered ${totals.delivered}  dropped ${totals.dropped}  dlq ${totals.dlq}  in-flight ${inFlight}  p99 ${p99}  faults ${faults.length}`,
    )
  }, 1000)

  // ---- stopping ----
  let durationTimer: NodeJS.Timeout | undefined
  let finish!: (result: DemoResult) => void
  const done = new Promise<DemoResult>((resolve) => (finish = resolve))

  const shutdown = async (reason: string): Promise<DemoResult> => {
    clearTimeout(durationTimer)
    clearTimeout(roundTimer)
    clearInterval(summary)
    producing = false
    io.line(`stopping (${reason}): producers stopped, draining consumers...`)
    const drainStart = performance.now()

    // Consumers settle what is outstanding; bounded (a stuck consumer must not hang shutdown).
    post({ type: 'stop' })
    const mainDrained =
      tickError !== undefined
        ? false
        : await new Promise<boolean>((resolve) => {
            const timeout = setTimeout(() => resolve(false), DRAIN_MS)
            onMainDrained = () => {
              clearTimeout(timeout)
              onMainDrained = undefined
              resolve(true)
            }
          })
    clearInterval(tick)
    // The worker drains on its own (bounded by the same DRAIN_MS) and exits; if it does not, it is
    // terminated — what it recorded is kept (design §11).
    if (!(await within(workerExited, DRAIN_MS + 1000))) await worker.terminate()

    for (let i = 0; i < clients; i++) surface.connectionClosed()
    const conservation = surface.stats('conservation')
    const faultCounts = (surface.stats('faults') as { counts: Record<string, number> }).counts
    await listening.close()
    await surface.close()

    const totals = mainSims.reduce((sum, sim) => addTotals(sum, sim.totals), emptyTotals())
    addTotals(totals, workerTotals)
    const drained = mainDrained && workerDrained
    const error = tickError ?? workerError
    const ms = Math.round(performance.now() - drainStart)
    io.line(`${drained ? `drained in ${ms} ms` : `drain incomplete after ${ms} ms`}; worker joined; server closed`)
    // A null residual means no quiet, stable moment was seen yet to take a baseline: not "0".
    const broken = conservation.topics.flatMap((t) => t.groups.filter((g) => g.residual === null || Number(g.residual) !== 0).map((g) => `${t.topic}/${g.group}`))
    io.line(
      `final: produced ${totals.produced}, delivered ${totals.delivered}, dropped ${totals.dropped}, dlq ${totals.dlq} ` +
        `(${totals.dlqFailures} DLQ writes failed), retries ${totals.retries}, writes refused ${totals.refused}, faults ${faults.length}; ` +
        (broken.length === 0 ? 'conservation: residual 0 in every group' : `conservation not confirmed (residual non-zero or no baseline) in ${broken.join(', ')}`),
    )
    return { reason, drained, totals, faults: faultCounts, conservation, ...(error ? { error } : {}) }
  }

  let stopped: Promise<DemoResult> | undefined
  const stop = (reason = 'stop'): Promise<DemoResult> => {
    if (stopped === undefined) {
      stopping = true
      stopped = shutdown(reason)
      stopped.then(finish, (error: Error) => finish({ reason: 'error', drained: false, totals: emptyTotals(), faults: {}, conservation: { filter: 'conservation', topics: [] }, error }))
    }
    return done
  }
  stopRequested = (reason) => void stop(reason)
  if (workerError !== undefined) void stop('error')
  if (options.duration !== undefined) durationTimer = setTimeout(() => void stop('duration'), options.duration * 1000)

  return { surface, url: serving, port: listening.port, host: listening.host, topics: { main: mainTopics, worker: workerTopics }, stop, done }
}

/** True if `promise` settles within `ms` (the timer never outlives the race). */
async function within(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), ms)))
  try {
    return await Promise.race([promise.then(() => true), timeout])
  } finally {
    clearTimeout(timer)
  }
}

/** A listen failure as one clear line (the CLI prints it and exits 1). */
function listenError(error: unknown, options: ResolvedOptions): Error {
  const code = (error as NodeJS.ErrnoException)?.code
  const where = `${options.host}:${options.port}`
  const message =
    code === 'EADDRINUSE'
      ? `cannot listen on ${where}: address already in use (pick another --port, or --port 0 for a free one)`
      : code === 'EACCES'
        ? `cannot listen on ${where}: permission denied (ports below 1024 need privileges)`
        : code === 'EADDRNOTAVAIL' || code === 'ENOTFOUND'
          ? `cannot listen on ${where}: no such local address`
          : `cannot listen on ${where}: ${(error as Error)?.message ?? String(error)}`
  return Object.assign(new Error(message), { code: code ?? 'LISTEN_FAILED', cause: error })
}

// ---- the command line ----

async function cli(argv: readonly string[]): Promise<number> {
  // `--nodes N` (N > 1): the cluster demo (cluster.ts); `--nodes 1` is this single node.
  const nodesAt = argv.findIndex((arg) => arg === '--nodes' || arg.startsWith('--nodes='))
  if (nodesAt !== -1) {
    const value = argv[nodesAt].includes('=') ? argv[nodesAt].split('=')[1] : argv[nodesAt + 1]
    if (value !== '1') return clusterCli(argv)
    argv = argv.filter((_, i) => i !== nodesAt && (argv[nodesAt].includes('=') || i !== nodesAt + 1))
  }
  let parsed: ReturnType<typeof parseArgs>
  try {
    parsed = parseArgs(argv)
  } catch (error) {
    if (!(error instanceof UsageError)) throw error
    process.stderr.write(`mq-demo: ${error.message}\n\n${USAGE}`)
    return EXIT_USAGE
  }
  if (parsed.help) {
    process.stdout.write(USAGE)
    return 0
  }
  // Listening before the demo starts, so before it prints "press Ctrl-C to stop": a Ctrl-C that
  // came between that line and a listener would take Node's default action (killed by the signal,
  // nothing closed). One during start-up stops the demo once it has started.
  let demo: Demo | undefined
  let pending: NodeJS.Signals | undefined
  let signals = 0
  const onSignal = (signal: NodeJS.Signals) => {
    // A second Ctrl-C while draining: leave at once.
    if (++signals > 1) process.exit(130)
    if (demo === undefined) pending = signal
    else void demo.stop(signal)
  }
  const undo = onStop(onSignal)
  try {
    demo = await runDemo(parsed.options)
  } catch (error) {
    undo()
    process.stderr.write(`mq-demo: ${(error as Error).message}\n`)
    return 1
  }
  if (pending !== undefined) void demo.stop(pending)
  const result = await demo.done
  undo()
  return result.error === undefined ? 0 : 1
}

if (require.main === module) {
  // The reader went away (`mq-demo | head`): nothing more can be shown, so the demo ends, quietly
  // and with 0, as mq-stats does; any other write error (a full disk) is 74, as sysexits' EX_IOERR.
  process.stdout.on('error', (error: NodeJS.ErrnoException) => {
    if (error.code === 'EPIPE') process.exit(0)
    process.stderr.write(`mq-demo: cannot write its output: ${error.message}\n`)
    process.exit(74)
  })
  cli(process.argv.slice(2)).then(
    (code) => {
      process.exitCode = code
    },
    (error: Error) => {
      process.stderr.write(`mq-demo: ${error.stack ?? error.message}\n`)
      process.exitCode = 1
    },
  )
}
