// The hot path: topic and group handles, resolved once, then recorded on millions of times a
// second. Each method validates its arguments, checks what design §5 needs, and only then writes —
// a rejected call leaves every number as it was. Counters go to this thread's own row (a plain
// Float64Array add: no lock, no atomic, no N-API call); the few cells that need an exact bound
// across threads (in_flight, the dlq credit) use Atomics on the shared row.
import { ClosedError, FatalInvariantError, RemovedGroupError, RemovedTopicError, UsageError } from './errors'
import { describe, validateName } from './labels'
import { C_CLOSED, C_NEXT_ROW, C_QUORUM, MAX_ROWS, SHARED_ROW, SLOTS_PER_CHUNK } from './layout'
import { acquire, release } from './lock'
import { Memory } from './memory'
import { MAX_IN_FLIGHT_LIMIT } from './config'
import { DEFAULT_SETTLE_WINDOW, G_DELIVERED, G_DLQ, G_DROPPED, G_IN_FLIGHT, G_LOCK, G_RETRIES, GroupEntity, P_BASE, TopicEntity, W_BASE, W_HEADER, W_SETTLED } from './entities'
import { Registry } from './registry'

export const MAX_SETTLE_WINDOW = 1 << 20
export type Outcome = 'delivered' | 'dropped'
export interface GroupOptions {
  /** design §5: dispatch() refuses past it; dispatched() and send() count and raise a fault. */
  max_in_flight?: number
  /** Where a new group starts: at each partition's start (`'earliest'`) or its last_seq (`'latest'`). */
  from?: 'earliest' | 'latest'
  /** Seqs above the floor that settle()/send() can track per partition (a multiple of 32). */
  settle_window?: number
}

/** A handle's topic is gone: ClosedError once the surface is closed, else RemovedTopicError. */
function goneError(control: Int32Array, topic: string): Error {
  return control[C_CLOSED] === 1 ? new ClosedError('this mq-metrics surface') : new RemovedTopicError(topic)
}

export type FaultSink = (code: string, metric: string, labels: Record<string, string>, previous: number | null, attempted: number | null) => void

const MAX_SAFE = Number.MAX_SAFE_INTEGER
const MAX_PARTITION = 0x7fffffff
/** A last_seq hint that names its only writer: a quiet NaN whose payload is the thread's row. */
const OWNED = 0x7ff8000000000000n
const bitsView = new Float64Array(1)
const bitsView64 = new BigInt64Array(bitsView.buffer)
/** A topic handle finds its group handles by a linear search up to this many, by a Map past it. */
const MAX_LISTED_GROUPS = 16
// A slot's chunk and its index in it, as a shift and a mask (slots are < 2^31). A const enum, so
// the compiler writes the numbers in place: produced() must stay under V8's 460-byte inlining
// limit for bytecode, and each module-level const costs a context load and a hole check there.
const enum Chunk {
  Shift = 13,
  Mask = (1 << 13) - 1,
}
/** layout.ts C_QUORUM, as a literal for the same reason (an imported const cost produced() 12 bytes). */
const enum Control {
  Quorum = 4,
}
if ((Control.Quorum as number) !== C_QUORUM) throw new Error('internal: Control.Quorum does not match C_QUORUM')
if (1 << Chunk.Shift !== SLOTS_PER_CHUNK) throw new Error('internal: Chunk.Shift does not match SLOTS_PER_CHUNK')

// A group's cells, as offsets from its slot: registry.ts's G_* written in place. Read through the
// import, each offset is a load from the other module's exports object (TypeScript assigns each
// export twice, so V8 cannot treat it as a constant); the `delivered()` row of `npm run bench`
// shows the difference.
const enum GroupCell {
  Delivered = 0,
  Dropped = 1,
  Dlq = 2,
  Retries = 3,
  InFlight = 4,
}
if (
  GroupCell.Delivered !== G_DELIVERED || GroupCell.Dropped !== G_DROPPED || GroupCell.Dlq !== G_DLQ ||
  GroupCell.Retries !== G_RETRIES || GroupCell.InFlight !== G_IN_FLIGHT
) {
  throw new Error('internal: the group cell offsets differ from registry.ts')
}

/**
 * design §5: the test the hot path runs inline; false ⇔ checkCount throws. Measured the same as
 * `Number.isSafeInteger(value) && value >= 0` in a delivered()-shaped loop (3.4 ns both); what
 * pays is keeping the throwing half (checkCount, with its messages) out of the inlined body.
 */
function isCount(value: unknown): value is number {
  return typeof value === 'number' && value >= 0 && value <= MAX_SAFE && Math.floor(value) === value
}

/** design §5: counter increments and sequence numbers are non-negative safe integers. */
function checkCount(what: string, value: unknown): number {
  if (typeof value !== 'number') throw new TypeError(`${what} must be a non-negative integer, got ${describe(value)}`)
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new RangeError(`${what} must be a non-negative integer no larger than 2^53 - 1, got ${describe(value)}`)
  }
  return value
}

/** Throws the error for the first of produced()'s counts that is not one (the cold half of the check). */
function checkProduced(seq: unknown, bytes: unknown, count: unknown): void {
  checkCount('seq', seq)
  checkCount('bytes', bytes)
  checkCount('count', count)
}

function checkPartition(value: unknown): number {
  if (typeof value !== 'number') throw new TypeError(`partition must be an integer, got ${describe(value)}`)
  if (!Number.isInteger(value) || value < 0 || value > MAX_PARTITION) {
    throw new RangeError(`partition must be an integer from 0 to ${MAX_PARTITION}, got ${describe(value)}`)
  }
  return value
}

/** Per-thread context shared by every handle of one surface (or one worker's recorder). */
export class Recorder {
  readonly registry: Registry
  readonly row: number
  readonly fault: FaultSink
  readonly #topics = new Map<string, Topic>()
  readonly #control: Int32Array
  /**
   * By chunk number: this thread's row chunk and the shared row's, filled in as handles resolve
   * their slots. Handles keep a slot number per partition and per ack floor and find the cells
   * here, rather than one small object per cell: 8 bytes instead of ~56 per partition and ~48
   * per floor (measured at 4,348 topics × 16 partitions × 2 groups: 10.6 MB of cell objects,
   * 57 B per sample, gone).
   */
  readonly rowChunks: Float64Array[] = []
  readonly sharedChunks: Float64Array[] = []
  /**
   * By chunk number: every thread row's chunk (index = row), filled in as rows appear — what
   * dispatch() sums in_flight over. Shared by all the groups of a chunk (an array per group was
   * 64 B of the ~120 B per sample at 4,348 topics × 16 partitions × 2 groups).
   */
  readonly #allRows: (Float64Array | undefined)[][] = []

  constructor(registry: Registry, row: number, fault: FaultSink) {
    this.registry = registry
    this.row = row
    this.fault = fault
    this.#control = registry.memory.control
  }

  /** design §12: same name → same handle (until the topic is removed). */
  topic(name: string): Topic {
    validateName('topic name', name)
    const known = this.#topics.get(name)
    if (known !== undefined && this.registry.isLive(known.entity)) return known
    const handle = new Topic(this, this.registry.topic(name))
    this.#topics.set(name, handle)
    return handle
  }

  /** Lets the handle of a removed topic go (only that topic's: the name may be registered again). */
  forget(name: string, topic?: TopicEntity): void {
    if (topic === undefined || this.#topics.get(name)?.entity === topic) this.#topics.delete(name)
  }

  /**
   * In_flight of a live group repaired to 0 if it is below 0 (see Group.repairInFlight), through
   * a handle made for the purpose: nothing is registered, whatever happened to the names since.
   */
  repairInFlight(group: GroupEntity): boolean {
    if (!this.registry.isGroupLive(group)) return false
    return new Group(this, new Topic(this, group.topic), group).repairInFlight()
  }

  /** A group was removed (by any thread): its topic's handle lets the group's handle go. */
  forgetGroup(group: GroupEntity): void {
    const topic = this.#topics.get(group.topic.name)
    if (topic !== undefined && topic.entity === group.topic) topic.dropGroupHandle(group)
  }

  readOnly(): boolean {
    return this.#control[C_QUORUM] === 2
  }

  /** Makes `rowChunks` and `sharedChunks` hold the chunk of `slot` (allocating it if need be). */
  resolveChunk(slot: number): void {
    const c = slot >>> Chunk.Shift
    if (this.rowChunks[c] === undefined) this.rowChunks[c] = this.registry.memory.rowChunk(this.row, c, true)!
    if (this.sharedChunks[c] === undefined) this.sharedChunks[c] = this.registry.memory.rowChunk(SHARED_ROW, c, true)!
  }

  /**
   * The last_seq hint protocol (design §5's regression check across threads without a shared write
   * per call). A partition's hint cell in the shared row is, as 64 bits:
   *   0 (+0.0)       fresh: no thread has written the partition yet;
   *   OWNED | row    a NaN: thread `row` is its only writer. produced() compares seq with the hint
   *                  and raises it only when `seq > hint`, both false against NaN, so the owner
   *                  never touches the shared cache line — two threads writing their own
   *                  partitions no longer ping-pong one line (measured: 2 workers went from
   *                  1.1–1.5× one thread to 1.8–1.9×);
   *   any number     shared: the highest last_seq any thread wrote (−0.0 stands for 0, so the
   *                  cell never reads as fresh again), checked and raised on every call.
   * Called once per thread and partition, before the thread's first write to it: a fresh cell is
   * claimed; a cell another thread owns turns shared, seeded with the highest last_seq any row
   * holds. Only the owner's calls already under way while that happens can land unseen by the
   * hint (they overlap the other thread's first write, so either order is a valid history).
   */
  claimLastSeq(slot: number): void {
    const memory = this.registry.memory
    const c = slot >>> Chunk.Shift
    const at = slot & Chunk.Mask
    const cells = memory.sharedI64(c)
    const mine = OWNED | BigInt(this.row)
    for (;;) {
      const bits = Atomics.load(cells, at)
      if (bits === 0n) {
        if (Atomics.compareExchange(cells, at, 0n, mine) === 0n) return
        continue
      }
      if (bits === mine || (bits & OWNED) !== OWNED) return // ours, or shared already
      const highest = this.highest(slot)
      bitsView[0] = highest > 0 ? highest : -0
      if (Atomics.compareExchange(cells, at, bits, bitsView64[0]) === bits) return
    }
  }

  /**
   * The highest value any thread holds in `slot` (a last_seq, an ack floor): the shared row's
   * cell and every thread row's. A last_seq hint that is a NaN (owned) or −0 adds nothing.
   */
  highest(slot: number): number {
    this.resolveChunk(slot)
    const memory = this.registry.memory
    const c = slot >>> Chunk.Shift
    const at = slot & Chunk.Mask
    const hint = this.sharedChunks[c][at]
    let max = hint > 0 ? hint : 0
    for (let row = 1; row < memory.rowCount(); row++) {
      const chunk = memory.rowChunk(row, c, false)
      if (chunk !== undefined && chunk[at] > max) max = chunk[at]
    }
    return max
  }

  /** Every thread row's chunk `c` known so far (index = row; see #allRows), this thread's included. */
  allRowsOf(c: number): (Float64Array | undefined)[] {
    let rows = this.#allRows[c]
    if (rows === undefined) {
      this.resolveChunk(c << Chunk.Shift)
      rows = new Array(this.row + 1)
      rows[this.row] = this.rowChunks[c]
      this.#allRows[c] = rows
    }
    return rows
  }

  /** This thread's row cells for a block, and the block's index in them. */
  cells(slot: number): [Float64Array, number] {
    this.resolveChunk(slot)
    return [this.rowChunks[slot >>> Chunk.Shift], slot & Chunk.Mask]
  }

  sharedCells(slot: number): [Float64Array, number] {
    this.resolveChunk(slot)
    return [this.sharedChunks[slot >>> Chunk.Shift], slot & Chunk.Mask]
  }

  /**
   * Adds to a row cell of `topic` (of `group`, for a group's cell); past 2^53 the excess moves to
   * the log so the total stays exact (under the registration lock, which checks again that the
   * topic or group was not removed meanwhile).
   */
  add(row: Float64Array, index: number, slot: number, n: number, topic: TopicEntity, group?: GroupEntity): void {
    const value = row[index] + n
    if (value <= MAX_SAFE) row[index] = value
    else this.registry.fold(row, index, slot, row[index], topic, group), (row[index] = n)
  }

  /**
   * Σ over every thread row of a cell, and its folds: a number while that is exact, else a
   * bigint. The registry is synced first (another thread's folds are log entries).
   */
  exactTotal(rows: readonly (Float64Array | undefined)[], rowCount: number, index: number, slot: number): number | bigint {
    this.registry.sync()
    let sum = 0
    for (let row = 1; row < rowCount; row++) sum += rows[row]?.[index] ?? 0
    if (sum <= MAX_SAFE && !this.registry.folds.has(slot)) return sum
    return this.registry.exactSum(slot)
  }
}

export class Topic {
  readonly name: string
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
  /**
   * Group handles by raw name: an array while there are few (a Map per topic cost ~150 B, 3.5 B per
   * sample at the workload), a Map past MAX_LISTED_GROUPS.
   */
  #groups: readonly Group[] | Map<string, Group> = []

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

  /** Throws when the topic was removed (its slots may already belong to another topic). */
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
    if (!(isCount(seq) && isCount(bytes) && isCount(count))) checkProduced(seq, bytes, count)
    const index = this.#index
    if (this.#tag[index] !== this.#id) throw this.#gone()
    // A non-number never indexes the cache (a string '3' would find partition 3's cells).
    const known = typeof partition === 'number' ? this.#lastSeqSlots[partition] : undefined
    if (this.#control[Control.Quorum] === 2) return this.#refuseReadOnly(partition, seq, known)
    // design §4: the n-th message of a partition has seq n, so a batch of `count` ending at `seq`
    // is seqs before + 1 … seq, all above last_seq: a decrease, a repeated seq and an overlapping
    // batch are all refused (a repeated append would count its messages twice). `seq − count` is
    // written out each time: a local for it took produced() past 16 registers and its bytecode
    // budget (below).
    const slot = known ?? this.#resolvePartition(partition, seq - count)
    const row = this.#rowChunks[slot >>> Chunk.Shift]
    const hints = this.#sharedChunks[slot >>> Chunk.Shift]
    const at = slot & Chunk.Mask
    const own = row[at]
    const hint = hints[at]
    // The batch must continue last_seq exactly: this thread's own, or the shared hint when another
    // thread wrote since (a NaN hint, owned by this thread, is never the larger).
    if (seq - count !== (hint > own ? hint : own)) this.#checkSeq(partition, seq, seq - count)
    const counters = this.#row
    // Writing marker (cell 2): a reader that finds it set knows this thread stopped between the
    // counter and last_seq writes, so it never takes such a torn moment for a quiet one.
    counters[index + 2] = 1
    const produced = counters[index] + count
    const total = counters[index + 1] + bytes
    // Both are ≥ 0, so one test covers both (a sum past 2^53 just takes the exact path).
    if (produced + total <= MAX_SAFE) {
      counters[index] = produced
      counters[index + 1] = total
    } else {
      this.#addFolding(count, bytes)
    }
    row[at] = seq
    if (seq > hint) hints[at] = seq
    counters[index + 2] = 0
    return true
  }

  /**
   * The batch does not continue this thread's last_seq nor the shared hint: contiguous with what
   * other threads appended (fine), a regression (fatal), the partition's first append starting
   * above seq 1 (its base is set: design §4), or a gap (fatal: SEQ_GAP, nothing changes).
   */
  #checkSeq(partition: number, seq: number, before: number): void {
    const slot = this.#lastSeqSlots[partition]
    const highest = this.#recorder.highest(slot)
    if (before === highest) return
    if (before < highest) this.#regression(partition, seq, before)
    if (highest === 0 && this.#recorder.registry.setBase(this.entity, slot, before)) return
    const labels = this.#labels(partition)
    const message = `would skip seqs ${highest + 1}…${before}: a batch of ${seq - before} ending at seq ${seq} must start at ${highest + 1} (the n-th message of a partition has seq n; topic.append() assigns seqs)`
    this.#recorder.fault('SEQ_GAP', 'mq_partition_last_seq', labels, highest, before + 1)
    throw new FatalInvariantError('SEQ_GAP', 'mq_partition_last_seq', labels, highest, before + 1, message)
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
    const slot = known ?? this.#resolvePartition(partition, 0)
    const c = slot >>> Chunk.Shift
    const at = slot & Chunk.Mask
    const hint = this.#sharedChunks[c][at]
    // A NaN hint names this thread as the partition's only writer (Recorder.claimLastSeq).
    if (Number.isNaN(hint)) {
      const seq = this.#rowChunks[c][at] + count
      return this.produced(partition, seq, bytes, count) ? seq : 0
    }
    return this.#appendShared(partition, slot, bytes, count)
  }

  /** append() on a partition several threads write: the seqs are reserved on the shared hint with a CAS. */
  #appendShared(partition: number, slot: number, bytes: number, count: number): number {
    if (this.#control[Control.Quorum] === 2) {
      this.#refuseReadOnly(partition, this.#recorder.highest(slot) + count, slot)
      return 0
    }
    const c = slot >>> Chunk.Shift
    const at = slot & Chunk.Mask
    const cells = this.#recorder.registry.memory.sharedI64(c)
    const counters = this.#row
    const index = this.#index
    counters[index + 2] = 1
    let seq: number
    for (;;) {
      const bits = Atomics.load(cells, at)
      bitsView64[0] = bits
      const last = bitsView[0] > 0 ? bitsView[0] : 0
      seq = last + count
      bitsView[0] = seq
      if (Atomics.compareExchange(cells, at, bits, bitsView64[0]) === bits) break
    }
    if (counters[index] + count + counters[index + 1] + bytes <= MAX_SAFE) {
      counters[index] += count
      counters[index + 1] += bytes
    } else {
      this.#addFolding(count, bytes)
    }
    const row = this.#rowChunks[c]
    if (seq > row[at]) row[at] = seq
    counters[index + 2] = 0
    return seq
  }

  /** design §4: the partition's last_seq across every thread (0 before any append). */
  lastSeq(partition: number): number {
    checkPartition(partition)
    return this.lastSeqKnown(partition)
  }

  /** The partition's base: the seq before its first message (0 unless its log started later). */
  baseOf(slot: number): number {
    this.#recorder.resolveChunk(slot)
    return this.#sharedChunks[slot >>> Chunk.Shift][(slot & Chunk.Mask) + P_BASE]
  }

  /** produced and bytes, one of which nears 2^53: the exact (folding) adds. */
  #addFolding(count: number, bytes: number): void {
    this.#recorder.add(this.#row, this.#index, this.#slot, count, this.entity)
    this.#recorder.add(this.#row, this.#index + 1, this.#slot + 1, bytes, this.entity)
  }

  /**
   * design §6: in read_only the consumer-visible ceiling freezes; the write is refused and
   * changes nothing — not even a partition's first appearance.
   */
  #refuseReadOnly(partition: number, seq: number, slot: number | undefined): false {
    checkPartition(partition)
    const previous = slot === undefined ? this.lastSeqKnown(partition) : this.#recorder.highest(slot)
    this.#recorder.fault('WRITE_WHILE_READ_ONLY', 'mq_partition_last_seq', this.#labels(partition), previous, seq)
    return false
  }

  /**
   * design §5: a last_seq decrease is fatal (fault, then throw; the stored value is kept), and so is
   * an append of `seq − before` messages whose first seq (`attempted`) is not above last_seq. `seq`
   * is NaN when the caller knows only `before` (#resolvePartition).
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
    const batch = Number.isNaN(seq) ? 'a batch' : `a batch of ${seq - before} ending at seq ${seq}`
    const message = seq < previous
      ? undefined // a plain decrease: the standard message
      : `would not increase: ${batch} starts at ${first}, not above last_seq ${previous} (the n-th message of a partition has seq n)`
    this.#recorder.fault('SEQ_REGRESSION', 'mq_partition_last_seq', labels, previous, first)
    throw new FatalInvariantError('SEQ_REGRESSION', 'mq_partition_last_seq', labels, previous, first, message)
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
    let latest = false
    if (options !== undefined) {
      if (options === null || typeof options !== 'object') throw new TypeError(`group options must be an object, got ${describe(options)}`)
      for (const key of Object.keys(options)) {
        if (key !== 'max_in_flight' && key !== 'from' && key !== 'settle_window') {
          throw new TypeError(`unknown group option ${JSON.stringify(key)} (known: max_in_flight, from, settle_window)`)
        }
      }
      const override = options.max_in_flight
      if (override !== undefined) {
        if (typeof override !== 'number' || !Number.isInteger(override) || override < 1 || override > MAX_IN_FLIGHT_LIMIT) {
          throw new RangeError(`max_in_flight must be an integer from 1 to ${MAX_IN_FLIGHT_LIMIT}, got ${describe(override)}`)
        }
        maxInFlight = override
      }
      if (options.from !== undefined) {
        if (options.from !== 'earliest' && options.from !== 'latest') throw new TypeError(`from must be 'earliest' or 'latest', got ${describe(options.from)}`)
        latest = options.from === 'latest'
      }
      if (options.settle_window !== undefined) {
        const w = options.settle_window
        if (typeof w !== 'number' || !Number.isInteger(w) || w < 32 || w > MAX_SETTLE_WINDOW || w % 32 !== 0) {
          throw new RangeError(`settle_window must be a multiple of 32 from 32 to ${MAX_SETTLE_WINDOW}, got ${describe(w)}`)
        }
        window = w
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
      const entity = this.#recorder.registry.group(this.entity, name, maxInFlight, window, latest)
      handle = new Group(this.#recorder, this, entity)
      this.#addGroupHandle(handle)
    }
    if (options?.max_in_flight !== undefined && handle.entity.maxInFlight !== maxInFlight) {
      throw new RangeError(`group ${JSON.stringify(name)} of topic ${JSON.stringify(this.name)} is registered with max_in_flight ${handle.entity.maxInFlight}, not ${maxInFlight}`)
    }
    if (options?.settle_window !== undefined && handle.entity.window !== window) {
      throw new RangeError(`group ${JSON.stringify(name)} of topic ${JSON.stringify(this.name)} is registered with settle_window ${handle.entity.window}, not ${window}`)
    }
    return handle
  }

  /**
   * Removes the group (from any thread): its series leave the next scrape, its delivered, dropped
   * and dlq stay in the topic's counters, its handles throw RemovedGroupError (GROUP_REMOVED),
   * and a group created again under the name starts from zero. false: no such group.
   */
  removeGroup(name: string): boolean {
    validateName('group name', name)
    this.alive()
    const handle = this.#groupHandle(name)
    const removed = this.#recorder.registry.removeGroup(this.entity, name)
    if (handle !== undefined) this.dropGroupHandle(handle.entity)
    return removed
  }

  /** Lets this topic's handle for `group` go (the group was removed). */
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

  /** Highest last_seq of a partition across every thread, without registering it. */
  lastSeqKnown(partition: number): number {
    this.alive() // a removed topic's slots may already be another's
    const slot = this.knownPartition(partition)
    return slot === undefined ? 0 : this.#recorder.highest(slot)
  }

  /**
   * produced()'s first call on a partition in this thread: registers the partition if it is new,
   * claims its last_seq hint (see Recorder.claimLastSeq) and caches the slot. Only writers pass
   * here: #lastSeqSlots holds exactly the partitions this thread has claimed or joined.
   */
  #resolvePartition(partition: unknown, before: number): number {
    const number = checkPartition(partition)
    this.alive()
    // A batch that starts at or below seq 0 is refused before the partition is registered: a
    // refused call must not make a new partition's series appear.
    if (before < 0) this.#regression(number, NaN, before)
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
   */
  knownPartition(partition: number): number | undefined {
    const slot = this.#lastSeqSlots[partition]
    if (slot !== undefined) return slot
    this.#recorder.registry.sync()
    const known = this.entity.partitionSlot(partition)
    if (known !== undefined) this.#recorder.resolveChunk(known)
    return known
  }

  /** Registers the partition (its series appear) without writing to it. */
  ensurePartition(partition: number): number {
    const known = this.#lastSeqSlots[partition]
    if (known !== undefined) return known
    this.alive()
    const slot = this.#recorder.registry.partition(this.entity, checkPartition(partition))
    this.#recorder.resolveChunk(slot)
    return slot
  }

  lastSeqOf(slot: number): number {
    return this.#recorder.highest(slot)
  }

  #labels(partition: number): Record<string, string> {
    return { topic: this.entity.label, partition: String(partition) }
  }
}

/** A partition's cells for the per-message calls of one group (Group.#lane). */
interface Lane {
  readonly lastSeqSlot: number
  /** The highest last_seq seen so far: a seq at or below it is appended (last_seq never decreases). */
  seen: number
  readonly floorSlot: number
  /** The shared row's chunk holding the floor's hint, and its index. */
  readonly hints: Float64Array
  readonly hintAt: number
  /** The window's header cells (W_BASE, W_SETTLED) and its bits (registry.ts windowSlots). */
  readonly headers: Float64Array
  readonly header: number
  readonly bits: Int32Array
  readonly first: number
}

/** What a per-message call does (Group.#perMessage). */
const enum Op {
  Send,
  Redeliver,
  Delivered,
  Dropped,
  DeliveredUpTo,
  DroppedUpTo,
  Query,
}

export class Group {
  readonly name: string
  readonly entity: GroupEntity
  readonly topic: Topic
  readonly #recorder: Recorder
  readonly #row: Float64Array
  readonly #index: number
  readonly #slot: number
  /**
   * The shared row's cells of this group's block: at #index its liveness tag (the group's id while
   * it lives; removing the group or its topic, or closing the surface, clears it). One check covers
   * all three, and it reads this handle's own fields only.
   */
  readonly #tag: Float64Array
  readonly #id: number
  readonly #memory: Memory
  /** Each thread row's chunk holding this group's cells (index = row; Recorder.allRowsOf, shared). */
  readonly #rowChunks: (Float64Array | undefined)[]
  readonly #lock: Int32Array
  readonly #lockIndex: number
  readonly #maxInFlight: number
  /** What the last settleUpTo() settled, or isInFlight()'s answer (1/0): a second result of #perMessage. */
  #settledUpTo = 0
  /** By partition: the per-message calls' cells (#lane). */
  readonly #lanes: (Lane | undefined)[] = []

  constructor(recorder: Recorder, topic: Topic, entity: GroupEntity) {
    this.name = entity.name
    this.entity = entity
    this.topic = topic
    this.#recorder = recorder
    this.#slot = entity.slot
    this.#maxInFlight = entity.maxInFlight
    ;[this.#row, this.#index] = recorder.cells(entity.slot)
    ;[this.#tag] = recorder.sharedCells(entity.slot)
    this.#id = entity.id
    this.#memory = recorder.registry.memory
    this.#rowChunks = recorder.allRowsOf(entity.slot >>> Chunk.Shift)
    this.#lock = recorder.registry.memory.sharedI32(Math.floor(entity.slot / SLOTS_PER_CHUNK))
    this.#lockIndex = (this.#index + G_LOCK) * 2
  }

  // in_flight is kept as per-thread shares (dispatched here − settled here), summed at scrape.
  // Settling — delivered()/dropped(), as frequent as publishing — then costs a plain store while
  // this thread's share covers it; an atomic would cost 8–15 ns here (measured on this machine:
  // Atomics.add ~8 ns, load + compareExchange ~15 ns, a Float64Array add ~3.4 ns). dispatch()
  // takes the group's lock so that the design §5 bound is exact across threads; settlements only
  // lower in_flight, so a dispatch that reads a share a moment old can only be stricter.

  /**
   * Design §invariants: in_flight += n, or false (nothing changes) if that would pass
   * max_in_flight. Checked against every thread's share under the group's lock; an in_flight
   * found below 0 (more settled than dispatched, by threads that raced) is repaired to 0 with
   * IN_FLIGHT_UNDERFLOW first, so the bound holds whatever happened before.
   */
  dispatch(n = 1): boolean {
    if (!isCount(n)) checkCount('n', n)
    if (this.#tag[this.#index] !== this.#id) throw this.#gone()
    const tag = this.#memory.lockTag
    let below = 0
    acquire(this.#lock, this.#lockIndex, tag, this.#memory)
    try {
      let inFlight = this.#inFlightAll()
      // Checked again before any write: the wait for the lock (and a first look at another
      // thread's row in #sumAll) may have let a removal land; a call that waits checks again.
      if (this.#tag[this.#index] !== this.#id) throw this.#gone()
      if (inFlight < 0) {
        below = inFlight
        this.#row[this.#index + GroupCell.InFlight] -= inFlight
        inFlight = 0
      }
      if (inFlight + n > this.#maxInFlight) return false
      this.#row[this.#index + GroupCell.InFlight] += n
      return true
    } finally {
      release(this.#lock, this.#lockIndex, tag)
      if (below < 0) this.#underflow(0, below)
    }
  }

  /**
   * in_flight was found at `attempted` < 0 (more settled than dispatched) and is 0 again: the
   * fault, raised after the call's last write (faults are always raised last: docs/reclamation.md).
   */
  #underflow(previous: number, attempted: number): void {
    this.#recorder.fault('IN_FLIGHT_UNDERFLOW', 'mq_group_in_flight', this.#labels(), previous, attempted)
  }

  /**
   * An in_flight below 0 that no dispatch or settlement has met yet (a scrape found it): repaired
   * to 0 in this thread's share, with IN_FLIGHT_UNDERFLOW. Returns whether there was one.
   */
  repairInFlight(): boolean {
    if (this.#tag[this.#index] !== this.#id) return false
    const tag = this.#memory.lockTag
    let below = 0
    acquire(this.#lock, this.#lockIndex, tag, this.#memory)
    try {
      const inFlight = this.#inFlightAll()
      if (inFlight < 0 && this.#tag[this.#index] === this.#id) {
        below = inFlight
        this.#row[this.#index + GroupCell.InFlight] -= inFlight
      }
    } finally {
      release(this.#lock, this.#lockIndex, tag)
    }
    if (below < 0) this.#underflow(0, below)
    return below < 0
  }

  /** delivered += n (group and topic), in_flight −= n (design §5: never below 0). */
  delivered(n = 1): void {
    // Flat fast path (the `delivered()` row of `npm run bench`): inline count test, the topic's liveness
    // cell read from this handle, and both cells written only when the counter stays below 2^53
    // and this thread's in_flight share covers n; anything else takes #settle (the exact path).
    if (!isCount(n)) checkCount('n', n)
    if (this.#tag[this.#index] !== this.#id) throw this.#gone()
    const row = this.#row
    const at = this.#index
    const delivered = row[at + GroupCell.Delivered] + n
    const share = row[at + GroupCell.InFlight]
    if (delivered <= MAX_SAFE && share >= n) {
      row[at + GroupCell.Delivered] = delivered
      row[at + GroupCell.InFlight] = share - n
    } else {
      this.#settle(GroupCell.Delivered, n)
    }
  }

  /** dropped += n (group and topic), in_flight −= n; each drop is credit for one DLQ success. */
  dropped(n = 1): void {
    if (!isCount(n)) checkCount('n', n)
    if (this.#tag[this.#index] !== this.#id) throw this.#gone()
    const row = this.#row
    const at = this.#index
    const dropped = row[at + GroupCell.Dropped] + n
    const share = row[at + GroupCell.InFlight]
    if (dropped <= MAX_SAFE && share >= n) {
      row[at + GroupCell.Dropped] = dropped
      row[at + GroupCell.InFlight] = share - n
    } else {
      this.#settle(GroupCell.Dropped, n)
    }
  }

  /** retries += n. */
  redelivered(n = 1): void {
    if (!isCount(n)) checkCount('n', n)
    if (this.#tag[this.#index] !== this.#id) throw this.#gone()
    const row = this.#row
    const at = this.#index + GroupCell.Retries
    const retries = row[at] + n
    if (retries <= MAX_SAFE) row[at] = retries
    else this.#recorder.add(row, at, this.#slot + GroupCell.Retries, n, this.topic.entity, this.entity)
  }

  /** Throws when the group (or its topic) was removed, or the surface closed. */
  #alive(): void {
    if (this.#tag[this.#index] !== this.#id) throw this.#gone()
  }

  /** Which of the three cleared the tag: the surface closed, the topic removed, or the group. */
  #gone(): Error {
    const registry = this.#recorder.registry
    if (this.#memory.control[C_CLOSED] === 1 || !registry.isLive(this.topic.entity)) return goneError(this.#memory.control, this.topic.name)
    return new RemovedGroupError(this.topic.name, this.name)
  }

  /** The slow half of delivered()/dropped(): a counter nearing 2^53, or a share that does not cover n. */
  #settle(offset: number, n: number): void {
    const row = this.#row
    const index = this.#index
    this.#recorder.add(row, index + offset, this.#slot + offset, n, this.topic.entity, this.entity)
    const share = row[index + GroupCell.InFlight]
    if (share >= n) row[index + GroupCell.InFlight] = share - n
    else this.#settleAcrossThreads(n)
  }

  /**
   * Design §counters: dlq += n, never beyond dropped (fault DLQ_WITHOUT_DROP, nothing counted).
   * Always checked against every thread's drops and DLQ successes, folds past 2^53 included,
   * under the group's lock: a thread's own drops are no credit of their own (another thread may
   * have dead-lettered them already). DLQ writes are rare next to deliveries.
   */
  deadLettered(n = 1): boolean {
    checkCount('n', n)
    this.#alive()
    const row = this.#row
    const index = this.#index
    const memory = this.#memory
    const tag = memory.lockTag
    let credit: number | bigint
    acquire(this.#lock, this.#lockIndex, tag, memory)
    try {
      credit = this.#creditAll()
      this.#alive() // again, right before the write (see dispatch)
      if (credit >= n) this.#recorder.add(row, index + GroupCell.Dlq, this.#slot + GroupCell.Dlq, n, this.topic.entity, this.entity)
    } finally {
      release(this.#lock, this.#lockIndex, tag)
    }
    if (credit < n) {
      this.#recorder.fault('DLQ_WITHOUT_DROP', 'mq_topic_messages_dlq_total', this.#labels(), Number(credit), n)
      return false
    }
    return true
  }

  /** Σ dropped − Σ dlq over every thread, folds included, exactly. Caller holds the group's lock. */
  #creditAll(): number | bigint {
    const rows = this.#rowsAll()
    const count = Math.min(this.#memory.control[C_NEXT_ROW], MAX_ROWS)
    const dropped = this.#recorder.exactTotal(rows, count, this.#index + GroupCell.Dropped, this.#slot + GroupCell.Dropped)
    const dlq = this.#recorder.exactTotal(rows, count, this.#index + GroupCell.Dlq, this.#slot + GroupCell.Dlq)
    if (typeof dropped === 'number' && typeof dlq === 'number') return dropped - dlq
    const credit = BigInt(dropped) - BigInt(dlq)
    return credit <= BigInt(MAX_SAFE) && credit >= -BigInt(MAX_SAFE) ? Number(credit) : credit
  }

  /** design §5: the ack floor only rises and never passes last_seq (fault ACK_FLOOR_INVALID). */
  ackFloor(partition: number, floor: number): boolean {
    checkPartition(partition)
    checkCount('floor', floor)
    this.#alive()
    if (this.entity.windowSlot(partition) !== undefined || (this.#recorder.registry.sync(), this.entity.windowSlot(partition) !== undefined)) {
      throw new UsageError('FLOOR_KEPT_BY_SETTLE', `group ${JSON.stringify(this.name)} of topic ${JSON.stringify(this.topic.name)} settles partition ${partition} per message (settle/send): its floor follows the settlements and ackFloor() cannot move it`)
    }
    const lastSeqSlot = this.topic.knownPartition(partition)
    const lastSeq = lastSeqSlot === undefined ? 0 : this.topic.lastSeqOf(lastSeqSlot)
    // The registry's sorted floor arrays, not a cache of our own (8 B per floor saved: ~1.6 MB at
    // 4,348 topics × 16 partitions × 2 groups); a floor whose cells this thread has not mapped yet
    // is read across every row first.
    const rowChunks = this.#recorder.rowChunks
    const sharedChunks = this.#recorder.sharedChunks
    let slot: number | undefined = this.entity.floorSlot(partition)
    if (slot !== undefined && (rowChunks[slot >>> Chunk.Shift] === undefined || sharedChunks[slot >>> Chunk.Shift] === undefined)) slot = undefined
    const current = slot === undefined
      ? this.#knownFloor(partition)
      : Math.max(rowChunks[slot >>> Chunk.Shift][slot & Chunk.Mask], sharedChunks[slot >>> Chunk.Shift][slot & Chunk.Mask])
    if (floor < current || floor > lastSeq) {
      const labels = { topic: this.topic.entity.label, group: this.entity.label, partition: String(partition) }
      this.#recorder.fault('ACK_FLOOR_INVALID', 'mq_group_lag', labels, current, floor)
      return false
    }
    // design §4: an ack floor makes the partition seen (its series appear) — only once accepted.
    if (lastSeqSlot === undefined) this.topic.ensurePartition(partition)
    if (slot === undefined) slot = this.#resolveFloor(partition)
    // The reads above may have waited for the registration lock: checked again before the writes.
    this.#alive()
    const hints = sharedChunks[slot >>> Chunk.Shift]
    const at = slot & Chunk.Mask
    rowChunks[slot >>> Chunk.Shift][at] = floor
    if (floor > hints[at]) hints[at] = floor
    return true
  }

  /**
   * in_flight += n, always (a broker that cannot refuse a delivery): passing max_in_flight is the
   * fault IN_FLIGHT_LIMIT_PASSED, not a refusal. Returns whether the bound still held.
   */
  dispatched(n = 1): boolean {
    if (!isCount(n)) checkCount('n', n)
    this.#alive()
    const tag = this.#memory.lockTag
    let total: number
    acquire(this.#lock, this.#lockIndex, tag, this.#memory)
    try {
      this.#alive()
      this.#row[this.#index + GroupCell.InFlight] += n
      total = this.#inFlightAll()
    } finally {
      release(this.#lock, this.#lockIndex, tag)
    }
    if (total > this.#maxInFlight) {
      this.#recorder.fault('IN_FLIGHT_LIMIT_PASSED', 'mq_group_in_flight', this.#labels(), this.#maxInFlight, total)
      return false
    }
    return true
  }

  /**
   * Message `seq` of `partition` was sent to a consumer: it is in flight until settled (counted
   * always, as dispatched(); passing max_in_flight is IN_FLIGHT_LIMIT_PASSED). false, with a
   * fault and nothing counted: not appended yet, settled already, in flight already (use
   * redeliver()), or beyond the settlement window.
   */
  send(partition: number, seq: number): boolean {
    return this.#perMessage(partition, seq, Op.Send)
  }

  /** Message `seq`, in flight, was sent again: retries += 1, in_flight unchanged (fault NOT_IN_FLIGHT otherwise). */
  redeliver(partition: number, seq: number): boolean {
    return this.#perMessage(partition, seq, Op.Redeliver)
  }

  /**
   * Message `seq` of `partition` is settled, `'delivered'` or `'dropped'` — in flight or never
   * sent (expired, a discarded backlog). Counts it, ends it in flight if it was, and raises the
   * floor over every settled seq (so depth and lag follow), in one call. false, with a fault and
   * nothing counted: settled already (ALREADY_SETTLED), above last_seq (SEQ_NOT_APPENDED), or
   * beyond the window (SETTLE_WINDOW_EXCEEDED).
   */
  settle(partition: number, seq: number, outcome: Outcome): boolean {
    if (outcome !== 'delivered' && outcome !== 'dropped') throw new TypeError(`outcome must be 'delivered' or 'dropped', got ${describe(outcome)}`)
    return this.#perMessage(partition, seq, outcome === 'delivered' ? Op.Delivered : Op.Dropped)
  }

  /**
   * Settles every message of `partition` up to `seq` that is not settled yet with `outcome` — a
   * discarded session's backlog, an expired range — ending in flight those that were. Returns how
   * many it settled (0, with ALREADY_SETTLED, when the floor is at `seq` already).
   */
  settleUpTo(partition: number, seq: number, outcome: Outcome): number {
    if (outcome !== 'delivered' && outcome !== 'dropped') throw new TypeError(`outcome must be 'delivered' or 'dropped', got ${describe(outcome)}`)
    this.#perMessage(partition, seq, outcome === 'delivered' ? Op.DeliveredUpTo : Op.DroppedUpTo)
    return this.#settledUpTo
  }

  /** Whether message `seq` of `partition` is in flight in this group (sent, not settled). */
  isInFlight(partition: number, seq: number): boolean {
    this.#perMessage(partition, seq, Op.Query)
    return this.#settledUpTo === 1
  }

  /** design §4: this group's ack floor on `partition` (its base when higher: the partition started later). */
  floor(partition: number): number {
    checkPartition(partition)
    this.#alive()
    const lastSeqSlot = this.topic.knownPartition(partition)
    const base = lastSeqSlot === undefined ? 0 : this.topic.baseOf(lastSeqSlot)
    const slot = this.entity.floorSlot(partition)
    return Math.max(base, slot === undefined ? this.#knownFloor(partition) : this.#recorder.highest(slot))
  }

  /**
   * The per-message calls. The window (registry.ts windowSlots) holds two bits per seq above its
   * base — in flight, settled — at bit `seq mod window`, and is read and written only under the
   * group's lock: any thread may send, redeliver or settle any message.
   */
  #perMessage(partition: number, seq: number, op: Op): boolean {
    if (!isCount(seq) || seq === 0) {
      if (checkCount('seq', seq) === 0) throw new RangeError('seq must be at least 1 (the first message of a partition has seq 1), got 0')
    }
    let lane = this.#lanes[partition]
    if (lane === undefined || typeof partition !== 'number') lane = this.#lane(partition)
    if (lane === undefined || (seq > lane.seen && seq > this.#lastSeqNow(lane))) {
      this.#alive()
      const lastSeq = lane === undefined ? 0 : lane.seen
      this.#recorder.fault('SEQ_NOT_APPENDED', 'mq_partition_last_seq', this.#partitionLabels(partition), lastSeq, seq)
      return false
    }
    let lastSeq = lane.seen
    const headers = lane.headers
    const header = lane.header
    const bits = lane.bits
    const first = lane.first
    const window = this.entity.window
    const words = window >>> 5
    const position = seq % window
    const word = first + (position >>> 5)
    const bit = 1 << (position & 31)
    const row = this.#row
    const index = this.#index
    const tag = this.#memory.lockTag
    let fault = ''
    let previous = 0
    let total = 0
    acquire(this.#lock, this.#lockIndex, tag, this.#memory)
    try {
      this.#alive()
      if (headers[header + W_BASE] === 0) headers[header + W_BASE] = Math.max(this.#recorder.highest(lane.floorSlot), this.topic.baseOf(lane.lastSeqSlot)) + 1
      let floor = headers[header + W_BASE] - 1
      const inFlight = (bits[word] & bit) !== 0
      this.#settledUpTo = 0
      if (op === Op.Query) {
        this.#settledUpTo = seq > floor && seq <= floor + window && inFlight ? 1 : 0
      } else if (op === Op.DeliveredUpTo || op === Op.DroppedUpTo) {
        if (seq <= floor) {
          fault = 'ALREADY_SETTLED'
          previous = floor
        } else {
          // Within the window: each seq not settled yet counts (in flight ones end); beyond it
          // nothing can be settled or in flight, so every seq there counts.
          let count = 0
          let above = headers[header + W_SETTLED]
          for (let s = floor + 1; s <= seq && s <= floor + window; s++) {
            const at = s % window
            const w = first + (at >>> 5)
            const b = 1 << (at & 31)
            if ((bits[w + words] & b) !== 0) {
              bits[w + words] &= ~b
              above--
              continue
            }
            if ((bits[w] & b) !== 0) {
              bits[w] &= ~b
              row[index + GroupCell.InFlight] -= 1
            }
            count++
          }
          if (seq > floor + window) count += seq - (floor + window)
          floor = seq
          // Seqs settled above the new floor now continue it: the floor rises over them too.
          for (;;) {
            const next = (floor + 1) % window
            const w = first + words + (next >>> 5)
            const b = 1 << (next & 31)
            if ((bits[w] & b) === 0 || (floor + 1 > lastSeq && floor + 1 > (lastSeq = this.#lastSeqNow(lane)))) break
            bits[w] &= ~b
            floor++
            above--
          }
          const cell = op === Op.DeliveredUpTo ? GroupCell.Delivered : GroupCell.Dropped
          this.#recorder.add(row, index + cell, this.#slot + cell, count, this.topic.entity, this.entity)
          headers[header + W_SETTLED] = above
          headers[header + W_BASE] = floor + 1
          if (floor > lane.hints[lane.hintAt]) lane.hints[lane.hintAt] = floor
          this.#settledUpTo = count
        }
      } else if (seq <= floor || (bits[word + words] & bit) !== 0) {
        fault = 'ALREADY_SETTLED'
        previous = floor
      } else if (seq > floor + window) {
        fault = 'SETTLE_WINDOW_EXCEEDED'
        previous = floor + window
      } else if (op === Op.Send) {
        if (inFlight) {
          fault = 'ALREADY_IN_FLIGHT'
        } else {
          bits[word] |= bit
          row[index + GroupCell.InFlight] += 1
          total = this.#inFlightAll()
        }
      } else if (op === Op.Redeliver) {
        if (inFlight) this.#recorder.add(row, index + GroupCell.Retries, this.#slot + GroupCell.Retries, 1, this.topic.entity, this.entity)
        else fault = 'NOT_IN_FLIGHT'
      } else {
        const cell = op === Op.Delivered ? GroupCell.Delivered : GroupCell.Dropped
        this.#recorder.add(row, index + cell, this.#slot + cell, 1, this.topic.entity, this.entity)
        if (inFlight) {
          bits[word] &= ~bit
          row[index + GroupCell.InFlight] -= 1
        }
        bits[word + words] |= bit
        let above = headers[header + W_SETTLED] + 1
        // The floor rises over every settled seq above it; their bits are cleared for reuse.
        for (;;) {
          const next = (floor + 1) % window
          const w = first + words + (next >>> 5)
          const b = 1 << (next & 31)
          if ((bits[w] & b) === 0 || (floor + 1 > lastSeq && floor + 1 > (lastSeq = this.#lastSeqNow(lane)))) break
          bits[w] &= ~b
          floor++
          above--
        }
        headers[header + W_SETTLED] = above
        headers[header + W_BASE] = floor + 1
        if (floor > lane.hints[lane.hintAt]) lane.hints[lane.hintAt] = floor
      }
    } finally {
      release(this.#lock, this.#lockIndex, tag)
    }
    // Faults are raised after the call's last write (docs/reclamation.md).
    if (fault !== '') {
      const metric = fault === 'ALREADY_IN_FLIGHT' || fault === 'NOT_IN_FLIGHT' ? 'mq_group_in_flight' : 'mq_group_lag'
      this.#recorder.fault(fault, metric, this.#partitionLabels(partition), previous, seq)
      return false
    }
    if (op === Op.Send && total > this.#maxInFlight) {
      this.#recorder.fault('IN_FLIGHT_LIMIT_PASSED', 'mq_group_in_flight', this.#labels(), this.#maxInFlight, total)
    }
    return true
  }

  /**
   * The partition's lane, resolved on its first per-message call: undefined while nothing was
   * appended to it. Its blocks are the group's own for the group's life (a removed group fails
   * #alive() before any of them is touched), so they are resolved once.
   */
  #lane(partition: number): Lane | undefined {
    checkPartition(partition)
    this.#alive()
    const lastSeqSlot = this.topic.knownPartition(partition)
    if (lastSeqSlot === undefined) return undefined
    const registry = this.#recorder.registry
    // Blocks first (they may take the registration lock), then the group's lock.
    const floorSlot = registry.floor(this.entity, partition)
    const windowSlot = registry.windowBlock(this.entity, partition)
    this.#recorder.resolveChunk(floorSlot)
    this.#recorder.resolveChunk(windowSlot)
    const header = windowSlot & Chunk.Mask
    const lane: Lane = {
      lastSeqSlot,
      seen: this.topic.lastSeqOf(lastSeqSlot),
      floorSlot,
      hints: this.#recorder.sharedChunks[floorSlot >>> Chunk.Shift],
      hintAt: floorSlot & Chunk.Mask,
      headers: this.#recorder.sharedChunks[windowSlot >>> Chunk.Shift],
      header,
      bits: this.#memory.sharedI32(windowSlot >>> Chunk.Shift),
      first: (header + W_HEADER) * 2, // the in-flight bits; the settled bits follow them
    }
    this.#lanes[partition] = lane
    return lane
  }

  /** last_seq read across every thread (a seq above the lane's last sight of it). */
  #lastSeqNow(lane: Lane): number {
    const now = this.topic.lastSeqOf(lane.lastSeqSlot)
    if (now > lane.seen) lane.seen = now
    return now
  }

  #partitionLabels(partition: number): Record<string, string> {
    return { topic: this.topic.entity.label, group: this.entity.label, partition: String(partition) }
  }

  /** Current in_flight across every thread. */
  inFlight(): number {
    if (this.#tag[this.#index] !== this.#id) throw this.#gone() // see lastSeqKnown
    return Math.max(0, this.#inFlightAll())
  }

  /**
   * This thread's share does not cover the settlement: another thread dispatched it, or nobody
   * did. Checked against every thread's share under the group's lock; a total below 0 found here
   * (threads that raced past their own shares) is repaired to 0 as well.
   */
  #settleAcrossThreads(n: number): void {
    const memory = this.#memory
    let available: number
    const tag = memory.lockTag
    acquire(this.#lock, this.#lockIndex, tag, memory)
    try {
      const inFlight = this.#inFlightAll()
      available = Math.max(0, inFlight)
      this.#alive() // again, right before the write (see dispatch)
      this.#row[this.#index + GroupCell.InFlight] -= Math.min(inFlight, 0) + Math.min(n, available)
    } finally {
      release(this.#lock, this.#lockIndex, tag)
    }
    // Design §invariants: the delivery/drop happened and is counted; in_flight stays at 0.
    if (available < n) this.#underflow(available, available - n)
  }

  #inFlightAll(): number {
    return this.#sumAll(GroupCell.InFlight)
  }

  /** Every thread row's chunk holding this group's cells, mapped so far (index = row). */
  #rowsAll(): readonly (Float64Array | undefined)[] {
    const rows = Math.min(this.#memory.control[C_NEXT_ROW], MAX_ROWS)
    for (let row = 1; row < rows; row++) {
      if (this.#rowChunks[row] === undefined) {
        const chunk = this.#memory.rowChunk(row, this.#slot >>> Chunk.Shift, false)
        if (chunk !== undefined) this.#rowChunks[row] = chunk
      }
    }
    return this.#rowChunks
  }

  /**
   * Σ over every thread's row of one of this group's cells. Called under the group lock. The
   * row count is a plain read (Atomics.load costs ~9 ns here): a thread can only hold a non-zero
   * cell of this group after taking this lock once (to dispatch, or for a settlement or a DLQ
   * credit its own cells did not cover), and it claimed its row before that, so our acquire
   * already orders the claim before this read. Each row's cell block is looked up once and
   * cached (the chunk of a row never moves), so dispatch() pays no Atomics.load and no Map
   * lookup per row per call (the `dispatch()` row of `npm run bench`).
   */
  #sumAll(offset: number): number {
    const rows = Math.min(this.#memory.control[C_NEXT_ROW], MAX_ROWS)
    const chunks = this.#rowChunks
    const at = this.#index + offset
    let sum = 0
    for (let row = 1; row < rows; row++) {
      let chunk = chunks[row]
      if (chunk === undefined) {
        // Not recorded into by that thread (yet): its share is 0 until it allocates the chunk.
        chunk = this.#memory.rowChunk(row, this.#slot >>> Chunk.Shift, false)
        if (chunk === undefined) continue
        chunks[row] = chunk
      }
      sum += chunk[at]
    }
    return sum
  }

  #knownFloor(partition: number): number {
    const registry = this.#recorder.registry
    registry.sync()
    const slot = this.entity.floorSlot(partition)
    if (slot === undefined) return 0
    this.#resolveFloor(partition)
    return this.#recorder.highest(slot)
  }

  /** The slot of this group's ack floor on a partition, registering it if it is new. */
  #resolveFloor(partition: number): number {
    const slot = this.#recorder.registry.floor(this.entity, partition)
    this.#recorder.resolveChunk(slot)
    return slot
  }

  #labels(): Record<string, string> {
    return { topic: this.topic.entity.label, group: this.entity.label }
  }
}
