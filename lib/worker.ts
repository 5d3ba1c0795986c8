// What a worker thread records with: attachSurface() maps the memory surface.share() describes
// and hands back topic handles and the latency estimator (design §11).
import { BackendName, SharedArena, attachArena } from './core/backend'
import { ResolvedConfig, resolveConfig } from './core/config'
import { ClosedError } from './core/errors'
import { describe } from './core/labels'
import { LATENCY_BUCKETS, LatencyEstimator, LatencyWindow, latencyEstimator } from './core/latency'
import { C_CLOSED } from './core/layout'
import { Memory } from './core/memory'
import { keepAnnouncing } from './core/reclamation'
import { Handles } from './core/handles'
import { Observer } from './core/observer'
import { Quorum, WriteAnswer } from './core/quorum'
import { Recorder } from './core/recording'
import { Registry } from './core/registry'
import type { QuorumState } from './core/snapshot'
import type { Topic } from './core/topic'
import { WorkerFaultChannel } from './core/worker-faults'
import { faultRecord } from './core/faults'

/** What `surface.share()` returns: post it to a worker and call `attachSurface()` there. */
export interface SharedSurface {
  readonly kind: 'mq-metrics/shared-surface'
  readonly version: 1
  readonly arena: SharedArena
  readonly config: ResolvedConfig
}

/** attachSurface()'s argument is what surface.share() returned, whole: else a TypeError saying what is wrong. */
function checkShared(shared: unknown): asserts shared is SharedSurface {
  const expected = 'attachSurface expects the object surface.share() returned'
  if (shared === null || typeof shared !== 'object' || (shared as SharedSurface).kind !== 'mq-metrics/shared-surface') {
    throw new TypeError(`${expected}, got ${describe(shared)}`)
  }
  const { version, arena, config } = shared as SharedSurface
  if (version !== 1) throw new TypeError(`${expected}: version ${describe(version)} is not 1 (a share() of another mq-metrics version?)`)
  if (arena === null || typeof arena !== 'object') throw new TypeError(`${expected}: its arena is ${describe(arena)}`)
  if (arena.backend === 'js') {
    if (!(arena.buffer instanceof SharedArrayBuffer)) throw new TypeError(`${expected}: its js arena holds ${describe(arena.buffer)}, not a SharedArrayBuffer`)
    if (!(arena.buffer as SharedArrayBuffer & { growable?: boolean }).growable) throw new TypeError(`${expected}: its js arena's SharedArrayBuffer is not growable (share() gives the surface's own)`)
  } else if (arena.backend === 'native') {
    if (!Number.isSafeInteger(arena.id) || arena.id <= 0) throw new TypeError(`${expected}: its native arena id is ${describe(arena.id)}`)
  } else {
    throw new TypeError(`${expected}: its arena backend is ${describe((arena as { backend?: unknown }).backend)}, not 'js' or 'native'`)
  }
  if (!(arena.doorbell instanceof SharedArrayBuffer) || arena.doorbell.byteLength < 4) throw new TypeError(`${expected}: its arena's doorbell is ${describe(arena.doorbell)}, not a SharedArrayBuffer of 4 bytes`)
  if (config === null || typeof config !== 'object') throw new TypeError(`${expected}: its config is ${describe(config)}`)
  // The surface's resolved configuration, every key: a worker keeps the same caps as the main thread.
  let resolved: ResolvedConfig
  try {
    resolved = resolveConfig(config)
  } catch (error) {
    throw new TypeError(`${expected}: its config is not a surface's (${(error as Error).message})`)
  }
  const missing = Object.keys(resolved).filter((key) => !Object.prototype.hasOwnProperty.call(config, key))
  if (missing.length > 0) throw new TypeError(`${expected}: its config lacks ${missing.join(', ')}`)
}

/** design §11: what a worker thread records with. */
export class WorkerRecorder {
  readonly backend: BackendName
  readonly latency: Pick<LatencyEstimator, 'record'>
  readonly #recorder: Recorder
  readonly #handles: Handles
  readonly #quorum: Quorum

  constructor(shared: SharedSurface) {
    checkShared(shared)
    const arena = attachArena(shared.arena)
    this.backend = arena.backend
    const memory = new Memory(arena, false)
    // Closed before this worker attached (the native backend throws ClosedError in Memory itself).
    if (memory.control[C_CLOSED] === 1) throw new ClosedError('this mq-metrics surface')
    this.#quorum = new Quorum(memory.control)
    const row = memory.claimRow()
    const registry = new Registry(memory, shared.config)
    const faults = new WorkerFaultChannel(memory)
    this.#recorder = new Recorder(registry, row, (...fault) => faults.send(faultRecord(...fault)))
    // removeTopic() runs on the main thread; this worker learns of it when it next replays the
    // log (on its next registration) and lets its handle go.
    this.#handles = new Handles(this.#recorder)
    // A group removed from this thread is judged as it leaves: one settled per message only (Observer.leavingHook).
    const observer = new Observer(this.#handles, (fault) => this.#recorder.fault(fault.code, fault.metric, fault.labels, fault.previous, fault.attempted, fault.names))
    this.#recorder.leaving = observer.leavingHook(false)
    // Between its tasks this thread is inside no recording call: it says so, and that it is
    // gone when it exits (reclamation.ts).
    keepAnnouncing(memory)
    // With latency off, nothing is recorded: no chunk of this thread's row is taken for it.
    const enabled = shared.config.e2e_latency
    const buckets = enabled ? this.#recorder.cells(0)[0] : new Float64Array(LATENCY_BUCKETS)
    this.latency = { record: latencyEstimator(buckets, memory.control, enabled, new LatencyWindow(() => {})).record }
  }

  topic(name: string): Topic {
    if (this.#recorder.registry.closed) throw new ClosedError('this mq-metrics surface')
    return this.#handles.topic(name)
  }

  /**
   * What a producer in this thread is told, as the main thread's surface.admitWrite(): both read
   * the tier's one shared cell, so a worker sees read_only the moment replicationRound() sets it.
   */
  admitWrite(): WriteAnswer {
    if (this.#recorder.registry.closed) throw new ClosedError('this mq-metrics surface')
    return this.#quorum.admitWrite()
  }

  /** The quorum tier, 0 healthy, 1 soft, 2 read_only (as surface.quorumState). */
  get quorumState(): QuorumState {
    return this.#quorum.state
  }
}

