// A topic handle: produced()/append() on its partitions, and the registry of its group handles.
import { FatalInvariantError } from './errors'
import { describe, isPlainObject, ownOption, validateName } from './labels'
import { MAX_IN_FLIGHT_LIMIT } from './config'
import { DEFAULT_SETTLE_WINDOW, GroupEntity, P_BASE, P_LOCK, TopicEntity } from './entities'
import { acquire, release } from './lock'
import { Chunk, Control, checkCount, checkPartition, goneError } from './checks'
import { Group } from './group'
import type { Recorder } from './recording'
import type { FaultNames } from './faults'
import type { Start } from './registry'

const MAX_SAFE = Number.MAX_SAFE_INTEGER

// isCount, areCounts and checkProduced are this module's own: produced() calls them, and each call of an
// imported function adds bytecode that takes produced() past V8's inlining budget (the check in
// bench/v8-guards.js fails).
/** design §5: the test the hot path runs inline; false ⇔ checkCount throws (group.ts has the same). */
function isCount(value: unknown): value is number {
  return typeof value === 'number' && value >= 0 && value <= MAX_SAFE && Math.floor(value) === value
}

/** isCount() of produced()'s three numbers: one call in its bytecode, not three (its budget: produced()). */
function areCounts(seq: unknown, bytes: unknown, count: unknown): boolean {
  return isCount(seq) && isCount(bytes) && isCount(count)
}

/** Throws the error for the first of produced()'s counts that is not one (the cold half of the check). */
function checkProduced(seq: unknown, bytes: unknown, count: unknown): void {
  checkCount('seq', seq)
  checkCount('bytes', bytes)
  checkCount('count', count)
}

/** The largest settle_window: its block (entities.ts windowSlots) must fit one chunk of the shared memory. */
export const MAX_SETTLE_WINDOW = 1 << 17
export interface GroupOptions {
  /** design §5: dispatch() refuses past it; dispatched() and send() count and raise a fault. */
  max_in_flight?: number
  /**
   * Where a new group starts: at each partition's start (`'earliest'`), at its last_seq
   * (`'latest'`), or at the floors it had committed (partition → seq: an object such as
   * `{ 0: 4200, 3: 120 }`; each from the partition's base to its last_seq, a partition left out
   * starts at its start). What a start passes over counts as settled before the group existed.
   */
  from?: GroupStart
  /** Seqs above the floor that settle()/send() can track per partition (a multiple of 32). */
  settle_window?: number
}

/** Where a new group starts (GroupOptions.from). `length?: never`: floors in an array (or a typed array) do not compile — which partitions would they be? */
export type GroupStart = 'earliest' | 'latest' | ({ readonly [partition: number]: number } & { readonly length?: never })

/** GroupOptions.from checked: a committed start's keys are partition numbers, its values floors. */
function checkStart(from: unknown): Start {
  if (from === 'earliest' || from === 'latest') return from
  const plain = from !== null && typeof from === 'object' && (Object.getPrototypeOf(from) === Object.prototype || Object.getPrototypeOf(from) === null)
  if (!plain) throw new TypeError(`from must be 'earliest', 'latest' or an object of partition → committed seq, got ${describe(from)}`)
  if (Object.getOwnPropertySymbols(from).length !== 0) throw new TypeError('from: a symbol is not a partition number')
  const floors = new Map<number, number>()
  // Every own key, enumerable or not: a floor the caller wrote is never passed over in silence.
  for (const key of Object.getOwnPropertyNames(from)) {
    const partition = Number(key)
    if (String(partition) !== key) throw new TypeError(`from: ${JSON.stringify(key)} is not a partition number`)
    checkPartition(partition)
    floors.set(partition, checkCount(`from[${key}]`, (from as Record<string, unknown>)[key]))
  }
  return floors
}

/** A topic handle finds its group handles by a linear search up to this many, by a Map past it. */
const MAX_LISTED_GROUPS = 16

export class Topic {
  readonly name: string
  /** @internal */
  readonly entity: TopicEntity
  readonly #recorder: Recorder
  readonly #row: Float64Array
  readonly #index: number
  readonly #tag: Float64Array
  readonly #id: number // entity.id, one hop closer: the liveness check runs on every call
  readonly #control: Int32Array // for the read_only check without a call through the recorder
  readonly #slot: number
  /**
   * By partition number: the slot of its last_seq cell, once resolved in this thread. The cell
   * is rowChunks[slot >>> Chunk.Shift][slot & Chunk.Mask] (this thread's last_seq); the same
   * place in sharedChunks is the hint: the highest last_seq any thread wrote.
   */
  readonly #lastSeqSlots: number[] = []
  readonly #rowChunks: Float64Array[]
  readonly #sharedChunks: Float64Array[]
  /** Int32 views of the shared row's chunks, by chunk: the append() locks. */
  readonly #locks: Int32Array[] = []
  /**
   * The partitions whose base was read after taking the registration lock (baseOf): bit p for
   * partition p < 31, an array made on first use above (a Set or an array per handle costs
   * ~130 B a topic, ~3 B a sample).
   */
  #baseRead = 0
  #baseReadAbove: boolean[] | undefined
  /**
   * Group handles by raw name: an array while there are few (a Map per topic cost ~150 B, 3.5 B per
   * sample at the workload), a Map past MAX_LISTED_GROUPS.
   */
  #groups: readonly Group[] | Map<string, Group> = []

  /** @internal */
  constructor(recorder: Recorder, entity: TopicEntity) {
    this.name = entity.name
    this.entity = entity
    this.#recorder = recorder
    this.#slot = entity.slot
    this.#id = entity.id
    this.#control = recorder.registry.memory.control
    this.#rowChunks = recorder.rowChunks
    this.#sharedChunks = recorder.sharedChunks
    ;[this.#row, this.#index] = recorder.cells(entity.slot)
    ;[this.#tag] = recorder.sharedCells(entity.slot)
  }

  /**
   * Throws when the topic was removed (its slots may already belong to another topic).
   * @internal
   */
  alive(): void {
    if (this.#tag[this.#index] !== this.#id) throw this.#gone()
  }

  /**
   * The error for a handle whose liveness tag no longer names its topic: the topic was removed,
   * or the surface was closed (Registry.close clears every tag).
   */
  #gone(): Error {
    return goneError(this.#control, this.name)
  }

  /**
   * design §12: `count` messages were durably appended to `partition`; the last has `seq`.
   * Returns false (fault WRITE_WHILE_READ_ONLY, nothing changes) while the quorum is read_only.
   * Measured cost: see bench/ (target ≤ 15 ns).
   */
  produced(partition: number, seq: number, bytes: number, count = 1): boolean {
    // One flat body with a single fast path (the `produced()` row of `npm run bench`): the checks are inline
    // tests whose throwing halves live in cold functions, the liveness and read_only cells are
    // read straight from fields (a plain Int32Array read of the quorum cell: a tier change a
    // moment old is tolerated), and both counters are written only once they are
    // known to stay below 2^53 — else the folding path below. Keep this body under V8's 460
    // bytes of bytecode (bench/v8-guards.js checks it, CI step 20-v8-guards): past it the
    // caller's loop can no longer inline it (the `produced()` row of `npm run bench` shows it).
    if (!areCounts(seq, bytes, count)) checkProduced(seq, bytes, count)
    const index = this.#index
    if (this.#tag[index] !== this.#id) throw this.#gone()
    // A non-number never indexes the cache (a string '3' would find partition 3's cells).
    const known = typeof partition === 'number' ? this.#lastSeqSlots[partition] : undefined
    if (this.#control[Control.Quorum] === 2) return this.#refuseReadOnly(partition, seq)
    // design §4: the n-th message of a partition has seq n, so a batch of `count` ending at `seq`
    // is seqs before + 1 … seq, all above last_seq: a decrease, a repeated seq and an overlapping
    // batch are all refused (a repeated append would count its messages twice). `seq − count` is
    // written out each time: a local for it took produced() past 16 registers and its bytecode
    // budget (below).
    const slot = known ?? this.#resolvePartition(partition, seq, count)
    const row = this.#rowChunks[slot >>> Chunk.Shift]
    const hints = this.#sharedChunks[slot >>> Chunk.Shift]
    const at = slot & Chunk.Mask
    const own = row[at]
    const hint = hints[at]
    const counters = this.#row
    // Both are ≥ 0, so one test covers both (a sum past 2^53 just makes room: #room, before any
    // write). 2^53 − 1 is written out: MAX_SAFE, a module binding, costs a hole check of 4 more
    // bytes of bytecode here.
    if (counters[index] + count + counters[index + 1] + bytes > 9007199254740991) this.#room(count, bytes)
    // The batch must continue last_seq exactly: this thread's own, or the shared hint when another
    // thread wrote since (a NaN hint, owned by this thread, is never the larger). #checkSeq made
    // the append itself when it is a resumed log's first batch.
    if (seq - count !== (hint > own ? hint : own) && this.#checkSeq(partition, seq, seq - count, bytes)) return true
    // Writing marker (cell 2): a reader that finds it set knows this thread is between the
    // counter and last_seq writes, so it never takes such a torn moment for a quiet one.
    counters[index + 2] = 1
    counters[index] += count
    counters[index + 1] += bytes
    row[at] = seq
    if (seq > hint) hints[at] = seq
    counters[index + 2] = 0
    return true
  }

  /**
   * The batch does not continue this thread's last_seq nor the shared hint: contiguous with what
   * other threads appended (fine: false, the caller writes it), a regression (fatal), the
   * partition's first append starting above seq 1 (appended here, its base set: design §4; true),
   * or a gap (fatal: SEQ_GAP, nothing changes).
   */
  #checkSeq(partition: number, seq: number, before: number, bytes: number): boolean {
    const slot = this.#lastSeqSlots[partition]
    let highest = this.#recorder.highest(slot)
    if (highest === 0 && before > 0) {
      if (this.#recorder.registry.firstAppend(this.entity, slot, () => this.#resumed(slot, seq, before, bytes))) return true
      highest = this.#recorder.highest(slot) // another thread's first batch came first (while this one waited for the lock)
    }
    if (before === highest) return false
    if (before < highest) this.#regression(partition, seq, before)
    const labels = this.#labels(partition)
    const message = `would skip seqs ${highest + 1}…${before}: a batch of ${seq - before} ending at seq ${seq} must start at ${highest + 1} (the n-th message of a partition has seq n; topic.append() assigns seqs)`
    this.#recorder.fault('SEQ_GAP', 'mq_partition_last_seq', labels, highest, before + 1, this.#names())
    throw new FatalInvariantError('SEQ_GAP', 'mq_partition_last_seq', labels, this.#names(), highest, before + 1, message)
  }

  /**
   * A resumed log's first batch (seqs before + 1 … seq), written under the registration lock
   * (registry.ts firstAppend): its base, the counts and last_seq, with no call between them. A
   * thread stopped before them leaves the partition as it was (the broker's retry appends the
   * batch), and no scrape (it reads under that lock) sees a base without its batch. The caller
   * has made room in the counts.
   */
  #resumed(slot: number, seq: number, before: number, bytes: number): void {
    const c = slot >>> Chunk.Shift
    const at = slot & Chunk.Mask
    const shared = this.#sharedChunks[c]
    const counters = this.#row
    const index = this.#index
    shared[at + P_BASE] = before
    counters[index] += seq - before
    counters[index + 1] += bytes
    this.#rowChunks[c][at] = seq
    if (seq > shared[at]) shared[at] = seq
  }

  /**
   * Appends `count` messages to `partition` with seqs the library assigns (the next after
   * last_seq) and returns the last one's seq, or 0 when the write is refused (read_only). Several
   * threads may append to one partition: each gets its own seqs. (Do not mix it with explicit
   * seqs from another thread on the same partition: docs/integration.md.)
   */
  append(partition: number, bytes: number, count = 1): number {
    if (!(isCount(bytes) && isCount(count)) || count === 0) {
      checkCount('bytes', bytes)
      if (checkCount('count', count) === 0) throw new RangeError('count must be at least 1 for append(), got 0')
    }
    const known = typeof partition === 'number' ? this.#lastSeqSlots[partition] : undefined
    this.alive()
    // A refused write changes nothing, not even a new partition's first appearance (design §6).
    if (this.#control[Control.Quorum] === 2) {
      const number = checkPartition(partition)
      this.#refuseReadOnly(number, (known === undefined ? this.lastSeqKnown(number) : this.#recorder.highest(known)) + count, known)
      return 0
    }
    const seq = this.#appendLocked(known ?? this.#resolvePartition(partition, 0, 0), bytes, count)
    if (seq === 0) throw new RangeError(`append() of ${count} message(s) to partition ${String(partition)} would number seqs past 2^53 - 1 (last_seq ${this.lastSeq(partition)}): seqs are safe integers; nothing was appended`)
    return seq
  }

  /**
   * append()'s seqs are numbered under the partition's append lock (any number of threads may
   * append to one partition): last_seq is the shared hint, which every append raises, or (the
   * first time: a fresh hint, or one a produced() writer owns, Recorder.claimLastSeq) the highest
   * any thread holds. An unlocked owner's write, as produced() makes, could overlap another
   * thread's claim of the hint and the two would number the same message. The lock costs two
   * compare-and-swaps of an Int32 (a BigInt64 compare-and-swap on the hint itself cost 5× that).
   * Its writes follow its last call with no loop between: a terminated thread leaves none half made.
   * 0: the last seq would pass 2^53 − 1 (nothing written).
   */
  #appendLocked(slot: number, bytes: number, count: number): number {
    const c = slot >>> Chunk.Shift
    const at = slot & Chunk.Mask
    const memory = this.#recorder.registry.memory
    const locks = this.#locks[c] ?? (this.#locks[c] = memory.sharedI32(c))
    const lock = (at + P_LOCK) * 2
    const hints = this.#sharedChunks[c]
    const counters = this.#row
    const index = this.#index
    const tag = memory.lockTag
    let seq: number
    acquire(locks, lock, tag, memory)
    try {
      const hint = hints[at]
      seq = (hint > 0 ? hint : this.#recorder.highest(slot)) + count
      this.alive() // a removal that landed while this thread waited for the lock
      if (seq > MAX_SAFE) return 0 // past 2^53 − 1 seqs are no longer distinct: refused, nothing written (append() throws)
      if (counters[index] + count + counters[index + 1] + bytes > MAX_SAFE) this.#room(count, bytes)
      // Writing marker (cell 2): a reader that finds it set knows the counters and last_seq may disagree.
      counters[index + 2] = 1
      counters[index] += count
      counters[index + 1] += bytes
      this.#rowChunks[c][at] = seq
      hints[at] = seq
      counters[index + 2] = 0
    } finally {
      release(locks, lock, tag)
    }
    return seq
  }

  /** design §4: the partition's last_seq across every thread (0 before any append). */
  lastSeq(partition: number): number {
    checkPartition(partition)
    return this.lastSeqKnown(partition)
  }

  /**
   * The partitions seen so far (appended to, or given an ack floor), by any thread, ascending: the
   * ones whose series /metrics shows, and whose last_seq, floors and backlog a broker may ask for.
   */
  partitions(): number[] {
    this.alive()
    this.#recorder.registry.sync()
    this.alive() // the sync may have replayed this topic's removal
    return [...this.entity.partitionNumbers]
  }

  /**
   * The partition's base: the seq before its first message (0 unless its log started later). A
   * resumed log's first batch writes it, then last_seq, under the registration lock; a thread that
   * read that last_seq without the lock might, on hardware that reorders stores (ARM), still read
   * the base as 0. So a base read as 0 once the partition has a message is read again after taking
   * the lock (once per partition and topic handle: the base never changes after its first batch),
   * which orders the first batch's writes before it. `partition` is the one whose last_seq is at
   * `slot`. (The registration lock may be taken under a group's lock, as folds do; its holder
   * never waits for a group's lock.)
   * @internal
   */
  baseOf(slot: number, partition: number): number {
    const base = this.baseHeld(slot)
    if (base !== 0) return base
    const low = partition < 31
    if ((low ? (this.#baseRead & (1 << partition)) !== 0 : this.#baseReadAbove?.[partition] === true) || this.#recorder.highest(slot) === 0) return 0
    const memory = this.#recorder.registry.memory
    memory.lock()
    memory.unlock()
    if (low) this.#baseRead |= 1 << partition
    else (this.#baseReadAbove ??= [])[partition] = true
    return this.baseHeld(slot)
  }

  /**
   * baseOf() without its check, for a caller under a group's lock that has made or learnt the
   * group's window on the partition: both happen under the registration lock, and only once some
   * thread saw last_seq above 0, after the first batch (docs/design.md §11), so the base it reads
   * is the one written; and the per-message path saves baseOf()'s lookups.
   * @internal
   */
  baseHeld(slot: number): number {
    this.#recorder.resolveChunk(slot)
    return this.#sharedChunks[slot >>> Chunk.Shift][(slot & Chunk.Mask) + P_BASE]
  }

  /**
   * produced or bytes nears 2^53: room made in each (a fold, whole; totals unchanged) before the
   * call's first write, which then follow with no call between them (design §11).
   */
  #room(count: number, bytes: number): void {
    this.#recorder.room(this.#row, this.#index, this.#slot, count, this.entity)
    this.#recorder.room(this.#row, this.#index + 1, this.#slot + 1, bytes, this.entity)
  }

  /**
   * design §6: in read_only the consumer-visible ceiling freezes; the write is refused and
   * changes nothing — not even a partition's first appearance.
   */
  #refuseReadOnly(partition: number, seq: number, slot?: number): false {
    checkPartition(partition)
    const previous = slot === undefined ? this.lastSeqKnown(partition) : this.#recorder.highest(slot)
    this.#recorder.fault('WRITE_WHILE_READ_ONLY', 'mq_partition_last_seq', this.#labels(partition), previous, seq, this.#names())
    return false
  }

  /**
   * design §5: a last_seq decrease is fatal (fault, then throw; the stored value is kept), and so is
   * an append of `seq − before` messages whose first seq (`attempted`) is not above last_seq.
   */
  #regression(partition: number, seq: number, before: number): never {
    const slot = this.#lastSeqSlots[partition]
    let previous: number
    if (slot === undefined) {
      previous = this.lastSeqKnown(partition) // refused before this thread resolved it (#resolvePartition)
    } else {
      const own = this.#rowChunks[slot >>> Chunk.Shift][slot & Chunk.Mask]
      const hint = this.#sharedChunks[slot >>> Chunk.Shift][slot & Chunk.Mask]
      previous = hint > own ? hint : own // a NaN hint (owned: see claimLastSeq) is never the larger
    }
    const labels = this.#labels(partition)
    const first = seq === before ? seq : before + 1 // count 0 appends nothing: seq itself
    const batch = `a batch of ${seq - before} ending at seq ${seq}`
    const message = seq < previous
      ? undefined // a plain decrease: the standard message
      : first < 1
        ? `would not increase: ${batch} would start at seq ${first}, and a partition's seqs start at 1`
        : `would not increase: ${batch} starts at ${first}, not above last_seq ${previous} (the n-th message of a partition has seq n)`
    this.#recorder.fault('SEQ_REGRESSION', 'mq_partition_last_seq', labels, previous, first, this.#names())
    throw new FatalInvariantError('SEQ_REGRESSION', 'mq_partition_last_seq', labels, this.#names(), previous, first, message)
  }

  /**
   * design §12: resolve a consumer group (same name → same handle). Options apply when the group
   * is created; `max_in_flight` and `settle_window` given for an existing group must match it.
   */
  group(name: string, options?: GroupOptions): Group {
    validateName('group name', name)
    const config = this.#recorder.registry.config
    let maxInFlight = config.max_in_flight
    let window = DEFAULT_SETTLE_WINDOW
    let start: Start = 'earliest'
    let maxInFlightGiven = false
    let windowGiven = false
    if (options !== undefined) {
      if (!isPlainObject(options)) throw new TypeError(`group options must be an object, got ${describe(options)}`)
      for (const key of Object.keys(options)) {
        if (key !== 'max_in_flight' && key !== 'from' && key !== 'settle_window') {
          throw new TypeError(`unknown group option ${JSON.stringify(key)} (known: max_in_flight, from, settle_window)`)
        }
      }
      const own = (key: keyof GroupOptions): unknown => ownOption(options, key)
      const override = own('max_in_flight')
      if (override !== undefined) {
        if (typeof override !== 'number' || !Number.isInteger(override) || override < 1 || override > MAX_IN_FLIGHT_LIMIT) {
          throw new (typeof override === 'number' ? RangeError : TypeError)(`max_in_flight must be an integer from 1 to ${MAX_IN_FLIGHT_LIMIT}, got ${describe(override)}`)
        }
        maxInFlight = override
        maxInFlightGiven = true
      }
      const from = own('from')
      if (from !== undefined) start = checkStart(from)
      const w = own('settle_window')
      if (w !== undefined) {
        if (typeof w !== 'number' || !Number.isInteger(w) || w < 32 || w > MAX_SETTLE_WINDOW || w % 32 !== 0) {
          throw new (typeof w === 'number' ? RangeError : TypeError)(`settle_window must be a multiple of 32 from 32 to ${MAX_SETTLE_WINDOW}, got ${describe(w)}`)
        }
        window = w
        windowGiven = true
      }
    }
    this.alive()
    let handle = this.#groupHandle(name)
    if (handle !== undefined && !this.#recorder.registry.isGroupLive(handle.entity)) {
      // Removed (by this or another thread): a group created again under the name starts afresh.
      this.dropGroupHandle(handle.entity)
      handle = undefined
    }
    if (handle === undefined) {
      const entity = this.#recorder.registry.group(this.entity, name, maxInFlight, window, start)
      handle = new Group(this.#recorder, this, entity)
      this.#addGroupHandle(handle)
    }
    if (maxInFlightGiven && handle.entity.maxInFlight !== maxInFlight) {
      throw new RangeError(`group ${JSON.stringify(name)} of topic ${JSON.stringify(this.name)} is registered with max_in_flight ${handle.entity.maxInFlight}, not ${maxInFlight}`)
    }
    if (windowGiven && handle.entity.window !== window) {
      throw new RangeError(`group ${JSON.stringify(name)} of topic ${JSON.stringify(this.name)} is registered with settle_window ${handle.entity.window}, not ${window}`)
    }
    return handle
  }

  /**
   * Removes the group (from any thread): its series leave the next scrape (and for 5 minutes the
   * topic's groups show no retries series: docs/metrics.md, "A group that left"), its delivered,
   * dropped and dlq stay in the topic's counters, its handles throw RemovedGroupError (GROUP_REMOVED),
   * and a group created again under the name starts from zero. false: no such group.
   */
  removeGroup(name: string): boolean {
    validateName('group name', name)
    this.alive()
    const handle = this.#groupHandle(name)
    const tell = this.#recorder.leaving?.(this.name, this.entity.id, name)
    try {
      const removed = this.#recorder.registry.removeGroup(this.entity, name)
      if (handle !== undefined) this.dropGroupHandle(handle.entity)
      return removed
    } finally {
      tell?.() // once the removal is made (or refused): a listener may remove or register the group itself
    }
  }

  /**
   * Lets this topic's handle for `group` go (the group was removed).
   * @internal
   */
  dropGroupHandle(group: GroupEntity): void {
    const groups = this.#groups
    if (groups instanceof Map) {
      if (groups.get(group.name)?.entity === group) groups.delete(group.name)
    } else {
      this.#groups = groups.filter((handle) => handle.entity !== group)
    }
  }

  #groupHandle(name: string): Group | undefined {
    const groups = this.#groups
    if (groups instanceof Map) return groups.get(name)
    for (let g = 0; g < groups.length; g++) if (groups[g].name === name) return groups[g]
    return undefined
  }

  #addGroupHandle(handle: Group): void {
    const groups = this.#groups
    if (groups instanceof Map) {
      groups.set(handle.name, handle)
    } else if (groups.length < MAX_LISTED_GROUPS) {
      const grown: Group[] = new Array(groups.length + 1) // sized exactly
      for (let g = 0; g < groups.length; g++) grown[g] = groups[g]
      grown[groups.length] = handle
      this.#groups = grown
    } else {
      this.#groups = new Map([...groups, handle].map((group) => [group.name, group]))
    }
  }

  /**
   * Highest last_seq of a partition across every thread, without registering it.
   * @internal
   */
  lastSeqKnown(partition: number): number {
    this.alive() // a removed topic's slots may already be another's
    const slot = this.knownPartition(partition)
    return slot === undefined ? 0 : this.#recorder.highest(slot)
  }

  /**
   * produced()'s first call on a partition in this thread: registers the partition if it is new,
   * claims its last_seq hint (see Recorder.claimLastSeq) and caches the slot. Only writers pass
   * here: #lastSeqSlots holds exactly the partitions this thread has claimed or joined. `seq` is the
   * batch's last, `count` its length (append() passes 0, 0: it numbers after last_seq).
   */
  #resolvePartition(partition: unknown, seq: number, count: number): number {
    const number = checkPartition(partition)
    const before = seq - count
    this.alive()
    // A batch that starts at or below seq 0 is refused before the partition is registered: a
    // refused call must not make a new partition's series appear.
    if (before < 0) this.#regression(number, seq, before)
    const slot = this.#recorder.registry.partition(this.entity, number)
    this.#recorder.resolveChunk(slot)
    // Each step may have waited for the registration lock: checked again before each write —
    // the hint claim, then the caller's (a call that waits checks again: docs/reclamation.md).
    this.alive()
    this.#recorder.claimLastSeq(slot)
    this.alive()
    this.#lastSeqSlots[number] = slot
    return slot
  }

  /**
   * The partition's last_seq slot if the partition is known (in any thread), else undefined. A
   * reader: it neither claims the hint nor caches the slot (a later produced() must still claim).
   * @internal
   */
  knownPartition(partition: number): number | undefined {
    const slot = this.#lastSeqSlots[partition]
    if (slot !== undefined) return slot
    this.#recorder.registry.sync()
    const known = this.entity.partitionSlot(partition)
    if (known !== undefined) this.#recorder.resolveChunk(known)
    return known
  }

  /**
   * Registers the partition (its series appear) without writing to it.
   * @internal
   */
  ensurePartition(partition: number): number {
    const known = this.#lastSeqSlots[partition]
    if (known !== undefined) return known
    this.alive()
    const slot = this.#recorder.registry.partition(this.entity, checkPartition(partition))
    this.#recorder.resolveChunk(slot)
    return slot
  }

  /** @internal */
  lastSeqOf(slot: number): number {
    return this.#recorder.highest(slot)
  }

  /** The raw name a fault's labels were sanitized from. */
  #names(): FaultNames {
    return { topic: this.name }
  }

  #labels(partition: number): Record<string, string> {
    return { topic: this.entity.label, partition: String(partition) }
  }
}

