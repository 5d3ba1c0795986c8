// One consistent view of every number and the conservation check over it (design §4, §7): what
// /metrics, /healthz, /stats and snapshot() read. The main thread observes for snapshot(), /stats
// and /healthz; the scrape thread (lib/scrape/) observes for /metrics, from its own view of the
// same shared memory. The few numbers only the main thread holds (connections, the leader epoch,
// the last replication round, the latency window) come in as `ThreadFields`.
import { ConservationChecker, ConservationReport, ConservationTopic, SharedEpisodes, SuspectEpisodes } from './conservation'
import { ClosedError } from './errors'
import type { FaultRecord } from './faults'
import { C_CLOSED, C_QUORUM } from './layout'
import { SnapshotReader } from './reader'
import type { Handles } from './handles'
import type { Recorder } from './recording'
import type { GroupEntity, TopicEntity } from './entities'
import { hasNoCollisions, LatencyQuantiles, Layout, QuorumState, Snapshot, TopicSnapshot } from './snapshot'

/** How long the scrape thread holds the registration lock at a time while it reads (observeSliced). */
export const SLICE_HOLD_MS = 1
/** How long it then waits, at most, for a thread waiting for the lock to take it (Memory.letWaiterIn). */
const SLICE_GAP_MS = 0.5

/** The numbers of a snapshot that live in the main thread's objects, not in shared memory. */
export interface ThreadFields {
  uptimeSeconds: number
  connections: number
  leaderEpoch: number
  replicas: number
  inSync: number
  lagging: readonly string[] | null
  latency: LatencyQuantiles | null
}

/** A group the scrape thread found quietly off balance, for the main thread to confirm (ids are never reused). */
export interface Suspect {
  topic: string
  topicId: number
  groupId: number
}

export class Observer {
  readonly #handles: Handles
  readonly #reader: SnapshotReader
  readonly #checker: ConservationChecker
  readonly #suspects: SuspectEpisodes | undefined
  /** The reader of checkSliced() (/healthz), made at its first use. */
  #probeReader: SnapshotReader | undefined
  /** The reader of observeReportSliced() (/stats on the scrape thread), made at its first use. */
  #statsReader: SnapshotReader | undefined
  /** The check checkSliced() has under way. */
  #probe: Promise<void> | undefined
  /** The check queued behind #probe for checkAfter() (shared by every call that comes meanwhile). */
  #probeNext: Promise<void> | undefined
  /** The read observeReport() has under way, and the one queued behind it (see observeReport). */
  #report: Promise<[Snapshot, ConservationReport]> | undefined
  #reportNext: Promise<[Snapshot, ConservationReport]> | undefined
  readonly #onFault: (fault: FaultRecord) => void
  /** Faults found while the registration lock is held, told once it is free (see #unlocked). */
  #held: FaultRecord[] | undefined

  /**
   * `handles` repairs in_flight underflows (in its thread's row); `onFault` hears CONSERVATION_BROKEN.
   * A quiet, confirmed imbalance is reported at once; with `suspects` (the scrape thread, whose
   * observe() reads while the main thread's batches may be half-way) it becomes a suspect for the
   * main thread to `confirm()` instead.
   */
  constructor(handles: Handles, onFault: (fault: FaultRecord) => void, suspects = false) {
    this.#handles = handles
    const recorder = handles.recorder
    this.#reader = new SnapshotReader(recorder.registry)
    const memory = recorder.registry.memory
    if (suspects) this.#suspects = new SuspectEpisodes(memory)
    this.#onFault = onFault
    this.#checker = new ConservationChecker((fault) => (this.#held !== undefined ? this.#held.push(fault) : onFault(fault)), this.#suspects ?? new SharedEpisodes(memory))
  }

  /**
   * Runs `read` under the registration lock and tells the faults it found once the lock is free:
   * a 'fault' listener may call the library (a group's call waits for the group's lock, whose
   * holder may be waiting for the registration lock: a sync, a fold), so no listener runs under it.
   */
  #unlocked<T>(memory: { lock(): void; unlock(): void }, read: () => T): T {
    memory.lock()
    const held: FaultRecord[] = (this.#held = [])
    let result: T
    try {
      result = read()
    } finally {
      this.#held = undefined
      memory.unlock()
    }
    for (const fault of held) this.#onFault(fault)
    return result
  }

  /** The suspects the last observe() found (not on the main thread), as plain data. */
  takeSuspects(): Suspect[] {
    const found = this.#suspects?.suspects ?? []
    if (this.#suspects !== undefined) this.#suspects.suspects = []
    return found.map((group) => {
      const entity = group.key as GroupEntity
      return { topic: entity.topic.name, topicId: entity.topic.id, groupId: entity.id }
    })
  }

  /**
   * The main thread, between its tasks (so none of its own recording calls is half-way): each
   * suspect topic still alive is read again and checked, which reports what is really broken, once.
   */
  confirm(suspects: readonly Suspect[]): void {
    if (suspects.length === 0) return
    const registry = this.#handles.recorder.registry
    const memory = registry.memory
    if (memory.control[C_CLOSED] === 1) return
    this.#unlocked(memory, () => {
      registry.sync()
      const seen = new Set<number>()
      for (const suspect of suspects) {
        const topic = registry.topics.get(suspect.topic)
        if (topic === undefined || topic.id !== suspect.topicId || seen.has(topic.id) || !registry.isLive(topic)) continue
        seen.add(topic.id)
        const fresh = this.#reader.topic(topic)
        this.#checker.check({ topics: [fresh] } as Snapshot, (again) => this.#reader.topic(again.key as TopicEntity))
      }
    })
  }

  /**
   * The conservation report of each topic of `wanted` (by id), read again here between this thread's tasks
   * (topics a conservation view of the scrape thread held back: docs/scrape-thread.md), with the
   * check a scrape makes (a broken identity the re-read confirms is reported, once per episode).
   * Read in slices of about `holdMs` with the event loop free between them, each topic whole
   * within one. `each` hears each topic as it is read (undefined for a topic removed since, or
   * registered again: another id), within the slice's time, so what it does with it (the JSON of
   * a view) counts in the slice too; it runs under the registration lock and must not call the
   * library.
   */
  async reportTopics(wanted: Float64Array, each: (topic: ConservationTopic | undefined) => void, holdMs = SLICE_HOLD_MS): Promise<void> {
    const registry = this.#handles.recorder.registry
    const memory = registry.memory
    const reread = (topic: TopicSnapshot) => this.#reader.topic(topic.key as TopicEntity)
    for (let at = 0; at < wanted.length; ) {
      if (at > 0) await new Promise((resolve) => setImmediate(resolve))
      this.#unlocked(memory, () => {
        if (memory.control[C_CLOSED] === 1) throw new ClosedError('this mq-metrics surface')
        registry.sync()
        const deadline = performance.now() + holdMs
        do {
          const topic = registry.topicById(wanted[at++])
          const live = topic !== undefined && registry.isLive(topic)
          each(live ? this.#checker.report({ topics: [this.#reader.topic(topic)] } as unknown as Snapshot, reread).topics[0] : undefined)
        } while (at < wanted.length && performance.now() < deadline)
      })
    }
  }

  /**
   * design §4: a group judged as it leaves, so a mistake on a group (or topic) removed before the
   * next scrape is reported too. Called before the removal of `group` of `topic` (every group of
   * `topic`, without `group`; `topicId`, when the caller knows it, the incarnation meant), with the
   * same rules as a scrape's check, on numbers a re-read confirms; reads the leaving group alone.
   * A group kept by floor is judged only from the main thread (`floorLevelToo`): from another, it
   * can be caught between a settlement's two calls made on the main thread (its floor moved, its
   * count not yet), which only that thread can tell (confirm()). The scrape's own episodes
   * (shared): a mistake reported already is not reported again. Returns what it found, to be told
   * once the removal is made: a 'fault' listener may remove or register that very group. Not on an
   * observer of suspects (its groups leave: none could be confirmed later).
   */
  #checkLeaving(topicName: string, topicId: number | undefined, groupName: string | undefined, floorLevelToo: boolean): FaultRecord[] {
    const registry = this.#handles.recorder.registry
    const memory = registry.memory
    const found: FaultRecord[] = []
    if (memory.control[C_CLOSED] === 1) return found
    memory.lock()
    const held = this.#held
    this.#held = found
    try {
      registry.sync()
      const topic = registry.topics.get(topicName)
      if (topic === undefined || !registry.isLive(topic) || (topicId !== undefined && topic.id !== topicId)) return found
      // One group's numbers for a group leaving; the whole topic, read once, for a topic leaving.
      const only = groupName === undefined ? undefined : topic.group(groupName)
      if (groupName !== undefined && only === undefined) return found
      const read = this.#reader.topic(topic, only)
      const judged = floorLevelToo ? read : { ...read, groups: read.groups.filter((g) => g.settledPerMessage) }
      if (judged.groups.length !== 0) this.#checker.check({ topics: [judged] } as unknown as Snapshot, (again) => this.#reader.topic(again.key as TopicEntity, only))
    } finally {
      this.#held = held
      memory.unlock()
    }
    return found
  }

  /**
   * A Recorder's `leaving` hook: the groups leaving judged (#checkLeaving), what it found told
   * by the function it returns, which the removal calls once it is made.
   */
  leavingHook(floorLevelToo: boolean): NonNullable<Recorder['leaving']> {
    return (topic, topicId, group) => {
      const found = this.#checkLeaving(topic, topicId, group, floorLevelToo)
      return () => {
        for (const fault of found) this.#onFault(fault)
      }
    }
  }

  /**
   * observe() for /metrics on the scrape thread, whose read must not keep the broker's own
   * registrations waiting (a new topic, partition, group or window takes the registration lock):
   * read in slices (#slices); between holds, a thread waiting for the lock gets it first
   * (docs/scrape-thread.md). `between` (tests) replaces that wait: called with the lock free and
   * how many topics of the read's list have been read.
   */
  observeSliced(fields: ThreadFields, holdMs = SLICE_HOLD_MS, between?: (read: number) => void): Snapshot {
    const memory = this.#handles.recorder.registry.memory
    const read = this.#slices(this.#reader, holdMs, false, undefined, true)
    for (let at = read.step(); at !== undefined; at = read.step()) {
      if (between !== undefined) between(at)
      else memory.letWaiterIn(SLICE_GAP_MS)
    }
    const [topics, layout] = read.finish()
    return snapshotOf(fields, memory.control, topics, layout)
  }

  /**
   * observe(fields, true, true) for /stats on the scrape thread: the snapshot with every ack floor
   * and the conservation report, read in slices as observeSliced() reads. A reader of its own, so
   * /metrics' reads keep their caches and layout.
   */
  observeReportSliced(fields: ThreadFields, holdMs = SLICE_HOLD_MS): [Snapshot, ConservationReport] {
    const registry = this.#handles.recorder.registry
    const report: ConservationTopic[] = []
    const read = this.#slices((this.#statsReader ??= new SnapshotReader(registry)), holdMs, true, report, true)
    for (let at = read.step(); at !== undefined; at = read.step()) registry.memory.letWaiterIn(SLICE_GAP_MS)
    const [topics, layout] = read.finish()
    return [snapshotOf(fields, registry.memory.control, topics, layout), { topics: report }]
  }

  /**
   * The conservation check alone, for /healthz on the main thread: in slices with the event loop
   * free between them, so a probe never holds the broker's thread for a whole read (and the
   * thread's own batches are complete at every slice: it is between its tasks). Its own reader,
   * so a snapshot() or /stats meanwhile reads with caches of its own; probes that come while one
   * check is under way share it.
   */
  checkSliced(): Promise<void> {
    return (this.#probe ??= this.#checkSliced().finally(() => (this.#probe = undefined)))
  }

  /**
   * checkSliced(), begun after this call (the faults view: what was recorded before the request is
   * checked): a check under way began before it, so the one queued behind it is shared instead.
   */
  checkAfter(): Promise<void> {
    if (this.#probeNext !== undefined) return this.#probeNext
    const under = this.#probe
    if (under === undefined) return this.checkSliced()
    const after = () => {
      this.#probeNext = undefined
      return this.checkSliced()
    }
    return (this.#probeNext = under.then(after, after))
  }

  /**
   * observe(fields, true, true) for /stats over HTTP: the snapshot with every ack floor and the
   * conservation report, read in slices with the event loop free between them, as checkSliced().
   * Every answer is read after its request came (a broker that recorded, then asked, sees what it
   * recorded), and however many requests come at once at most two reads exist: one under way, and
   * one queued behind it that every request coming meanwhile shares (it starts when the first
   * ends). The views (stats.ts) copy what they sort, so sharing a snapshot is safe. `fields` is
   * asked for once a read is done.
   */
  observeReport(fields: () => ThreadFields): Promise<[Snapshot, ConservationReport]> {
    if (this.#reportNext !== undefined) return this.#reportNext
    if (this.#report === undefined) return this.#startReport(fields)
    const after = () => {
      this.#reportNext = undefined
      return this.#startReport(fields)
    }
    return (this.#reportNext = this.#report.then(after, after))
  }

  #startReport(fields: () => ThreadFields): Promise<[Snapshot, ConservationReport]> {
    const read = this.#readReport(fields)
    this.#report = read
    const done = () => {
      if (this.#report === read) this.#report = undefined
    }
    read.then(done, done)
    return read
  }

  async #readReport(fields: () => ThreadFields): Promise<[Snapshot, ConservationReport]> {
    const report: ConservationTopic[] = []
    const read = this.#slices(new SnapshotReader(this.#handles.recorder.registry), SLICE_HOLD_MS, true, report)
    await stepsApart(read)
    const [topics, layout] = read.finish()
    return [snapshotOf(fields(), this.#handles.recorder.registry.memory.control, topics, layout), { topics: report }]
  }

  async #checkSliced(): Promise<void> {
    const read = this.#slices((this.#probeReader ??= new SnapshotReader(this.#handles.recorder.registry, true)), SLICE_HOLD_MS, false, undefined, false, false)
    await stepsApart(read)
    read.finish()
  }

  /**
   * A read in slices: each step() holds the registration lock for about `holdMs` of reading,
   * syncs first and reads on from where the last one stopped; undefined once every topic is read,
   * else how many of the read's list are. Each topic is read and checked whole within one hold,
   * so no series of it is torn; a topic removed meanwhile is left out (its id, never reused, no
   * longer in its block's tag: registry.isLive), one registered meanwhile is in the next read.
   * On the scrape thread a block removed meanwhile is not even reused before the read ends (it
   * announces between its tasks only: docs/reclamation.md); checkSliced() yields between steps,
   * so there a removed topic's block may be reused, and the tag check is what leaves it out.
   * finish() gives the topics read and their layout, and repairs the underflows found.
   * `catchUpInParts` (the scrape thread, which runs nothing else between its steps): the first
   * steps catch up with the log a hold at a time (registry.syncUntil), and the topics are sorted
   * with the lock free, so a thread started on a large surface does not keep registrations
   * waiting for its whole replay and sort (docs/scrape-thread.md).
   * `keep` false (/healthz: the check alone): each slice's topics are let go once checked, so they
   * die young instead of being copied by every young-generation collection until the read ends
   * (finish() then gives none).
   */
  #slices(reader: SnapshotReader, holdMs: number, ackFloors = false, report?: ConservationTopic[], catchUpInParts = false, keep = true): { step(): number | undefined; finish(): [TopicSnapshot[], Layout] } {
    const registry = this.#handles.recorder.registry
    const memory = registry.memory
    const topics: TopicSnapshot[] = []
    const reread = (topic: TopicSnapshot) => reader.topic(topic.key as TopicEntity)
    let sorted: readonly TopicEntity[] | undefined
    let generation = 0
    let at = 0
    let caughtUp = !catchUpInParts
    const step = (): number | undefined => {
      if (!caughtUp) {
        caughtUp = this.#unlocked(memory, () => {
          if (memory.control[C_CLOSED] === 1) throw new ClosedError('this mq-metrics surface')
          memory.clearWanted()
          return registry.syncUntil(performance.now() + holdMs)
        })
        // Sorted here, with the lock free (the picture changes only when this thread syncs), and
        // read in that order: what registers from now on is in the next read, as what registers
        // between two slices is. The layout is checked against the generation sorted (finish()).
        if (caughtUp) {
          reader.sortAhead()
          generation = registry.generation
        }
        return at
      }
      this.#unlocked(memory, () => {
        if (memory.control[C_CLOSED] === 1) throw new ClosedError('this mq-metrics surface')
        memory.clearWanted()
        const deadline = performance.now() + holdMs
        registry.sync()
        if (sorted === undefined) {
          // Caught up in parts, the list was sorted then (above); else here.
          sorted = reader.beginSliced(!catchUpInParts)
          if (!catchUpInParts) generation = registry.generation
        }
        if (at === sorted.length) return
        const first = topics.length
        at = reader.slice(sorted, at, topics, deadline, ackFloors)
        const read = { topics: topics.slice(first) } as unknown as Snapshot
        if (report === undefined) this.#checker.check(read, reread)
        else report.push(...this.#checker.report(read, reread).topics)
        if (!keep) topics.length = first
      })
      return at < sorted!.length ? at : undefined
    }
    const finish = (): [TopicSnapshot[], Layout] => {
      reader.endSliced()
      for (const group of reader.underflows) this.#handles.repairInFlight(group)
      // The layout describes the topics of the first hold. A registration or removal since (a
      // group joining a topic read later, a colliding name) changed what the read holds: a layout
      // of its own, a new object, so the renderer neither reuses the last scrape's texts nor
      // skips the merge of colliding series.
      return [topics, registry.generation === generation ? reader.layout : { collisionFree: hasNoCollisions(topics) }]
    }
    return { step, finish }
  }

  /**
   * The snapshot, taken under the registration lock (never held across a yield), checked. With
   * `ackFloors`, each group's ack floor per partition too (/stats and snapshot() show them;
   * /metrics and /healthz only need depth and lag). With `report`, the check's /stats report too.
   */
  observe(fields: ThreadFields, ackFloors?: boolean): Snapshot
  observe(fields: ThreadFields, ackFloors: boolean, report: true): [Snapshot, ConservationReport]
  observe(fields: ThreadFields, ackFloors = false, report = false): Snapshot | [Snapshot, ConservationReport] {
    const registry = this.#handles.recorder.registry
    const memory = registry.memory
    if (memory.control[C_CLOSED] === 1) throw new ClosedError('this mq-metrics surface')
    let snapshot!: Snapshot
    let conservation: ConservationReport | undefined
    this.#unlocked(memory, () => {
      registry.sync()
      snapshot = snapshotOf(fields, memory.control, this.#reader.topics(ackFloors), this.#reader.layout)
      const reread = (topic: TopicSnapshot) => this.#reader.topic(topic.key as TopicEntity)
      // Only /stats shows the report; the scrape path checks (and raises faults) without one.
      if (report) conservation = this.#checker.report(snapshot, reread)
      else this.#checker.check(snapshot, reread)
    })
    // Groups the read found with in_flight below 0 (more settled than dispatched, by threads that
    // raced past their own shares): back to 0, with IN_FLIGHT_UNDERFLOW (design §5).
    for (const group of this.#reader.underflows) this.#handles.repairInFlight(group)
    return report ? [snapshot, conservation!] : snapshot
  }
}

/** A snapshot of `topics`, with the numbers only the main thread holds and the quorum tier now. */
function snapshotOf(fields: ThreadFields, control: Int32Array, topics: TopicSnapshot[], layout: Layout): Snapshot {
  return {
    uptimeSeconds: fields.uptimeSeconds,
    connections: fields.connections,
    leaderEpoch: fields.leaderEpoch,
    quorumState: Atomics.load(control, C_QUORUM) as QuorumState,
    replicas: fields.replicas,
    inSync: fields.inSync,
    lagging: fields.lagging,
    latency: fields.latency,
    topics,
    layout,
  }
}

/** Every step of a read in slices, with the event loop free between two steps. */
async function stepsApart(read: { step(): number | undefined }): Promise<void> {
  while (read.step() !== undefined) await new Promise((resolve) => setImmediate(resolve))
}
