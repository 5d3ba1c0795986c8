// A consumer group handle: dispatch, settlement (by count and per message), retries, the dlq,
// ack floors and the settle window.
import { RemovedGroupError, UsageError } from './errors'
import { describe } from './labels'
import { C_CLOSED, C_NEXT_CHUNK, C_NEXT_ROW, MAX_ROWS, SHARED_ROW, SLOTS_PER_CHUNK } from './layout'
import { acquire, release } from './lock'
import { Memory } from './memory'
import { floorMovedBit, G_FLOOR_MOVED_INT32, G_LOCK, G_WINDOWED, GroupEntity, T_PARTITIONS, TopicEntity, W_BASE, W_PENDING, W_SETTLED } from './entities'
import { clearPassed, finishFloorMove, finishWindows } from './window'
import { Chunk, GroupCell, checkCount, checkPartition, checkSeq, goneError } from './checks'
import type { Recorder } from './recording'
import type { FaultCode, FaultNames } from './faults'

export type Outcome = 'delivered' | 'dropped'

/**
 * What a group handle asks of its topic's handle (topic.ts): the entity and its partitions' cells.
 * @internal
 */
export interface TopicOfGroup {
  readonly name: string
  readonly entity: TopicEntity
  baseOf(slot: number, partition: number): number
  baseHeld(slot: number): number
  ensurePartition(partition: number): number
  knownPartition(partition: number): number | undefined
  lastSeqOf(slot: number): number
}

const MAX_SAFE = Number.MAX_SAFE_INTEGER

/**
 * design §5: the test the hot path runs inline; false ⇔ checkCount throws. What pays is keeping
 * the throwing half (checkCount, with its messages) out of the inlined body. This module's own
 * (topic.ts has the same): imported, it makes delivered() measurably slower (bench/hot.js, the
 * `group.delivered()` row).
 */
function isCount(value: unknown): value is number {
  return typeof value === 'number' && value >= 0 && value <= MAX_SAFE && Math.floor(value) === value
}

/**
 * `seq mod window`: where a seq's bits are in its window (0 ≤ seq ≤ 2^53 − 1, 32 ≤ window ≤ 2^17).
 * A power-of-two window (the default) below 2^31 is a mask. Otherwise: seqs are doubles here
 * (they come from Float64Array cells), and V8 compiles `%` of doubles to a call into the C
 * library; a division, a floor and one correction cost a fraction of it (the per-message row of
 * bench/lifecycle.js). Exact below 2^52, where q·window stays below 2^53.
 */
function windowIndex(seq: number, window: number): number {
  if (seq <= 0x7fffffff && (window & (window - 1)) === 0) return seq & (window - 1)
  if (seq >= 4503599627370496) return seq % window
  const r = seq - Math.floor(seq / window) * window
  return r < 0 ? r + window : r >= window ? r - window : r
}

/** A partition's cells for the per-message calls of one group (Group.#lane). */
interface Lane {
  readonly lastSeqSlot: number
  /** The highest last_seq seen so far: a seq at or below it is appended (last_seq never decreases). */
  seen: number
  /**
   * This thread's own row's last_seq cell (and its index): what this thread appended. One of the
   * cells Recorder.highest() takes the maximum of, so a seq at or below it is appended too, known
   * without reading every thread's row — a broker that sends what it has just appended.
   */
  readonly own: Float64Array
  readonly ownAt: number
  readonly floorSlot: number
  /** The shared row's chunk holding the floor's hint, and its index. */
  readonly hints: Float64Array
  readonly hintAt: number
  /** The shared row's chunk holding the window's header (W_BASE, W_SETTLED, W_PENDING: entities.ts W_HEADER), and its index. */
  readonly headers: Float64Array
  readonly header: number
  /** The window's bits (entities.ts windowSlots), in flight from `first` on, settled after them. */
  readonly bits: Int32Array
  readonly first: number
  /** The group's settle window (entity.window), kept here: the per-message calls then read no entity. */
  readonly window: number
}

/**
 * What a settlement of `n` takes off this thread's in_flight share when every thread's in_flight
 * is `all`: n while `all` covers it; else what brings in_flight to 0 (an `all` below 0 is
 * repaired too). Design §invariants: in_flight never goes below 0.
 */
function shareTaken(all: number, n: number): number {
  return Math.min(all, 0) + Math.min(n, Math.max(all, 0))
}

/** What a per-message call does (Group.#perMessage). */
const enum Op {
  Send,
  Redeliver,
  Delivered,
  Dropped,
  DeliveredUpTo,
  DroppedUpTo,
  /** DroppedUpTo, but a floor at the seq or above is no fault (expire(): nothing left to expire). */
  ExpireUpTo,
  Query,
  QuerySettled,
}

export class Group {
  readonly name: string
  /** Its `max_in_flight` (design §5), as registered. */
  readonly maxInFlight: number
  /** Its `settle_window`: how far above its floor on a partition the per-message calls reach. */
  readonly settleWindow: number
  /** @internal */
  readonly entity: GroupEntity
  readonly #topic: TopicOfGroup
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
  /** In #lock's view (the group's shared Int32 cells): the index of its window count (entities.ts G_WINDOWED). */
  readonly #windowedIndex: number
  /** In #lock's view: the index of its floor-moved bits (entities.ts G_FLOOR_MOVED_INT32). */
  readonly #floorMovedIndex: number
  /** The topic's shared Int32 view and the index of its partition count (entities.ts T_PARTITIONS). */
  readonly #topicCells: Int32Array
  readonly #partitionsIndex: number
  readonly #maxInFlight: number
  /** By partition: the per-message calls' cells (#lane). */
  readonly #lanes: (Lane | undefined)[] = []
  /** The arena's chunk count when #inFlightAll() last found a thread row without this group's chunk (−1: none missing since). */
  #missingAt = -1

  /** @internal */
  constructor(recorder: Recorder, topic: TopicOfGroup, entity: GroupEntity) {
    this.name = entity.name
    this.maxInFlight = entity.maxInFlight
    this.settleWindow = entity.window
    this.entity = entity
    this.#topic = topic
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
    this.#windowedIndex = (this.#index + G_WINDOWED) * 2
    this.#floorMovedIndex = this.#windowedIndex + G_FLOOR_MOVED_INT32
    const topicSlot = topic.entity.slot
    this.#topicCells = recorder.registry.memory.sharedI32(Math.floor(topicSlot / SLOTS_PER_CHUNK))
    this.#partitionsIndex = ((topicSlot % SLOTS_PER_CHUNK) + T_PARTITIONS) * 2
  }

  // in_flight is kept as per-thread shares (dispatched here − settled here), summed at scrape.
  // Settling — delivered()/dropped(), as frequent as publishing — then costs a plain store while
  // this thread's share covers it, where an atomic read-modify-write would cost several times a
  // plain Float64Array add (the `delivered()` row of `npm run bench`). dispatch()
  // takes the group's lock so that the design §5 bound is exact across threads; settlements only
  // lower in_flight, so a dispatch that reads a share a moment old can only be stricter.

  /**
   * Design §invariants: in_flight += n, or false (nothing changes) if that would pass
   * max_in_flight. Checked against every thread's share under the group's lock; an in_flight
   * found below 0 (more settled than dispatched, by threads that raced) is repaired to 0 with
   * IN_FLIGHT_UNDERFLOW first, so the bound holds whatever happened before. Throws UsageError
   * IN_FLIGHT_KEPT_BY_SEND, counting nothing, on a group settled per message on every partition of
   * its topic (what is in flight there is what send() counted).
   */
  dispatch(n = 1): boolean {
    if (!isCount(n)) checkCount('n', n)
    if (this.#tag[this.#index] !== this.#id) throw this.#gone()
    if (this.#lock[this.#windowedIndex] !== 0) this.#countLevelAllowed('dispatch')
    const tag = this.#memory.lockTag
    let below = 0
    const took = acquire(this.#lock, this.#lockIndex, tag, this.#memory)
    try {
      if (took) this.#tookOver()
      let inFlight = this.#inFlightAll()
      // Checked again before any write: the wait for the lock (and a first look at another
      // thread's row in #inFlightAll) may have let a removal land; a call that waits checks again.
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
   * dispatch(), dispatched(), delivered() and dropped() count without naming a message. On a group
   * that settles every partition of its topic per message, every message in flight is one that
   * send() counted and every settlement one that settle() counts, so a count-level call counts some
   * message twice (in_flight that never returns to 0: a redelivery counted with dispatch(), or
   * dispatch() and send() for one message; an acknowledgement counted by delivered() and settle(),
   * a broken identity). Thrown, with
   * nothing counted; while some partition of the topic has no window of the group (kept by floor,
   * or no message yet) it may still dispatch. Called once the group's shared window count
   * (entities.ts G_WINDOWED) is above 0, so a group kept by floor pays one plain read. No lock,
   * no registry: the count is read with Atomics, then the topic's partition count (written before
   * any window on a partition can be), so a count of windows that reaches it means a window on every
   * partition. Every other thread's registrations count, whether or not this one has synced.
   */
  #countLevelAllowed(call: string): void {
    if (Atomics.load(this.#lock, this.#windowedIndex) < this.#topicCells[this.#partitionsIndex]) return
    if (this.#tag[this.#index] !== this.#id) throw this.#gone() // removed meanwhile: that is the answer
    const why = call === 'delivered' || call === 'dropped'
      ? `settle() counts what it delivers and drops, and ${call}() would count a message twice, or end in flight one that settle() will end (use settle(partition, seq, '${call}'))`
      : `its in_flight counts what send() sent, and ${call}() would count a message twice (use send() for a new delivery, redeliver() for a retry)`
    throw new UsageError('IN_FLIGHT_KEPT_BY_SEND', `group ${JSON.stringify(this.name)} of topic ${JSON.stringify(this.#topic.name)} settles every partition per message: ${why}`)
  }

  /**
   * in_flight was found at `attempted` < 0 (more settled than dispatched) and is 0 again: the
   * fault, raised after the call's last write (faults are always raised last: docs/reclamation.md).
   */
  #underflow(previous: number, attempted: number): void {
    this.#recorder.fault('IN_FLIGHT_UNDERFLOW', 'mq_group_in_flight', this.#labels(), previous, attempted, this.#names())
  }

  /**
   * An in_flight below 0 that no dispatch or settlement has met yet (a scrape found it): repaired
   * to 0 in this thread's share, with IN_FLIGHT_UNDERFLOW. Returns whether there was one.
   * @internal
   */
  repairInFlight(): boolean {
    if (this.#tag[this.#index] !== this.#id) return false
    const tag = this.#memory.lockTag
    let below = 0
    const took = acquire(this.#lock, this.#lockIndex, tag, this.#memory)
    try {
      if (took) this.#tookOver()
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

  /**
   * delivered += n (group and topic), in_flight −= n (design §5: never below 0). Throws UsageError
   * IN_FLIGHT_KEPT_BY_SEND, counting nothing, on a group settled per message on every partition (#countLevelAllowed).
   */
  delivered(n = 1): void {
    // Flat fast path (the `delivered()` row of `npm run bench`): inline count test, the topic's liveness
    // cell read from this handle, and both cells written only when the counter stays below 2^53
    // and this thread's in_flight share covers n; anything else takes #settle (the exact path).
    if (!isCount(n)) checkCount('n', n)
    if (this.#tag[this.#index] !== this.#id) throw this.#gone()
    if (this.#lock[this.#windowedIndex] !== 0) this.#countLevelAllowed('delivered')
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

  /** dropped += n (group and topic), in_flight −= n; each drop is credit for one DLQ success. Throws as delivered(). */
  dropped(n = 1): void {
    if (!isCount(n)) checkCount('n', n)
    if (this.#tag[this.#index] !== this.#id) throw this.#gone()
    if (this.#lock[this.#windowedIndex] !== 0) this.#countLevelAllowed('dropped')
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
    else this.#recorder.add(row, at, this.#slot + GroupCell.Retries, n, this.#topic.entity, this.entity)
  }

  /** Throws when the group (or its topic) was removed, or the surface closed. */
  #alive(): void {
    if (this.#tag[this.#index] !== this.#id) throw this.#gone()
  }

  /** Which of the three cleared the tag: the surface closed, the topic removed, or the group. */
  #gone(): Error {
    const registry = this.#recorder.registry
    if (this.#memory.control[C_CLOSED] === 1 || !registry.isLive(this.#topic.entity)) return goneError(this.#memory.control, this.#topic.name)
    return new RemovedGroupError(this.#topic.name, this.name)
  }

  /**
   * The slow half of delivered()/dropped(): a counter nearing 2^53 (room made first: a fold,
   * whole), or a share that does not cover n. Both cells are written with no call between.
   */
  #settle(offset: number, n: number): void {
    const row = this.#row
    const index = this.#index
    this.#recorder.room(row, index + offset, this.#slot + offset, n, this.#topic.entity, this.entity)
    const share = row[index + GroupCell.InFlight]
    if (share >= n) {
      row[index + offset] += n
      row[index + GroupCell.InFlight] = share - n
    } else {
      this.#settleAcrossThreads(offset, n)
    }
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
    const took = acquire(this.#lock, this.#lockIndex, tag, memory)
    try {
      if (took) this.#tookOver()
      credit = this.#creditAll()
      this.#alive() // again, right before the write (see dispatch)
      if (credit >= n) this.#recorder.add(row, index + GroupCell.Dlq, this.#slot + GroupCell.Dlq, n, this.#topic.entity, this.entity)
    } finally {
      release(this.#lock, this.#lockIndex, tag)
    }
    if (credit < n) {
      this.#recorder.fault('DLQ_WITHOUT_DROP', 'mq_topic_messages_dlq_total', this.#labels(), Number(credit), n, this.#names())
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
      throw new UsageError('FLOOR_KEPT_BY_SETTLE', `group ${JSON.stringify(this.name)} of topic ${JSON.stringify(this.#topic.name)} settles partition ${partition} per message (settle/send): its floor follows the settlements and ackFloor() cannot move it`)
    }
    const { lastSeq, current } = this.#floorNow(partition)
    if (floor < current || floor > lastSeq) {
      this.#recorder.fault('ACK_FLOOR_INVALID', 'mq_group_lag', this.#partitionLabels(partition), current, floor, this.#names())
      return false
    }
    const [cells, hints, cell] = this.#floorCells(partition) // may throw LimitError, nothing moved
    // Marked before the floor moves (entities.ts G_FLOOR_MOVED_INT32): a check that sees the
    // floor moved sees the partition as one whose floor can lead the group's counts.
    const moved = floorMovedBit(partition)
    if (floor > current && (this.#lock[this.#floorMovedIndex] & moved) === 0) Atomics.or(this.#lock, this.#floorMovedIndex, moved)
    cells[cell] = floor
    if (floor > hints[cell]) hints[cell] = floor
    return true
  }

  /**
   * Messages of `partition` up to `upTo` that the group will never get (retention deleted them, the
   * consumer skipped them, a session's backlog was discarded) are dropped; returns how many. On a
   * partition kept by floor, the floor moves to `upTo` and every message it passes counts as
   * dropped, in_flight unchanged: they were never fetched (end what is in flight first, with
   * ackFloor() and dropped()). Both in one call under the group's lock, so no scrape sees the floor
   * moved without the drops. On a partition settled per message it is settleUpTo(partition, upTo,
   * 'dropped'). 0, nothing changed, when the floor is at `upTo` or above; SEQ_NOT_APPENDED past
   * last_seq.
   */
  expire(partition: number, upTo: number): number {
    checkPartition(partition)
    checkCount('upTo', upTo)
    this.#alive()
    for (;;) {
      // The group's window count before this thread's look at the partition's window: a window
      // registered after it (which counts after its log entry) shows as a new count under the lock.
      const windowed = Atomics.load(this.#lock, this.#windowedIndex)
      if (this.entity.windowSlot(partition) !== undefined || (this.#recorder.registry.sync(), this.entity.windowSlot(partition) !== undefined)) {
        return upTo === 0 ? 0 : this.#perMessage(partition, upTo, Op.ExpireUpTo)
      }
      const { lastSeq, current } = this.#floorNow(partition)
      if (upTo > lastSeq) {
        this.#recorder.fault('SEQ_NOT_APPENDED', 'mq_partition_last_seq', this.#partitionLabels(partition), lastSeq, upTo, this.#names())
        return 0
      }
      if (upTo <= current) return 0 // nothing to expire (nor a partition to register)
      const [cells, hints, cell] = this.#floorCells(partition)
      const slot = this.entity.floorSlot(partition)!
      const base = this.#topic.baseOf(this.#topic.knownPartition(partition)!, partition)
      const tag = this.#memory.lockTag
      let n = 0
      const took = acquire(this.#lock, this.#lockIndex, tag, this.#memory)
      try {
        if (took) this.#tookOver()
        // A window made on the partition meanwhile: its per-message path, from the start.
        if (Atomics.load(this.#lock, this.#windowedIndex) !== windowed) continue
        // Under the lock, every thread's floor (not the hint, which a racing ackFloor() may leave
        // behind): two threads expiring the same messages count them once.
        n = upTo - Math.max(this.#recorder.highest(slot), base)
        if (n > 0) {
          const row = this.#row
          const at = this.#index + GroupCell.Dropped
          if (row[at] + n > MAX_SAFE) this.#recorder.room(row, at, this.#slot + GroupCell.Dropped, n, this.#topic.entity, this.entity)
          this.#alive() // the reads above may have waited for the registration lock
          // The drops and the floor with no call between (docs/design.md §11).
          row[at] += n
          cells[cell] = upTo
          if (upTo > hints[cell]) hints[cell] = upTo
        }
      } finally {
        release(this.#lock, this.#lockIndex, tag)
      }
      return Math.max(n, 0)
    }
  }

  /**
   * The floor-level floor of `partition` (`current`: this thread's and the shared hint's larger, or
   * a resumed log's base when higher) and its last_seq. The hint is the largest any thread wrote,
   * unless a racing ackFloor() left it behind: fine for a bound on ackFloor(); expire(), which
   * counts from it, reads every thread's floor under the group's lock instead. The registry's sorted floor
   * arrays, not a cache of our own (8 B per floor saved: ~1.6 MB at 4,348 topics × 16 partitions ×
   * 2 groups); a floor whose cells this thread has not mapped yet is read across every row first.
   */
  #floorNow(partition: number): { lastSeq: number; current: number } {
    const lastSeqSlot = this.#topic.knownPartition(partition)
    const lastSeq = lastSeqSlot === undefined ? 0 : this.#topic.lastSeqOf(lastSeqSlot)
    const rowChunks = this.#recorder.rowChunks
    const sharedChunks = this.#recorder.sharedChunks
    const slot = this.entity.floorSlot(partition)
    const kept = slot === undefined || rowChunks[slot >>> Chunk.Shift] === undefined || sharedChunks[slot >>> Chunk.Shift] === undefined
      ? this.#knownFloor(partition)
      : Math.max(rowChunks[slot >>> Chunk.Shift][slot & Chunk.Mask], sharedChunks[slot >>> Chunk.Shift][slot & Chunk.Mask])
    return { lastSeq, current: lastSeqSlot === undefined ? kept : Math.max(kept, this.#topic.baseOf(lastSeqSlot, partition)) }
  }

  /**
   * Where a floor-level floor of `partition` is written (the caller checked the floor): this
   * thread's cells, the shared hints, the cell's index in both. Registers the floor (and makes the
   * partition seen: design §4, its series appear) if need be; the group is alive on return.
   */
  #floorCells(partition: number): [Float64Array, Float64Array, number] {
    if (this.#topic.knownPartition(partition) === undefined) this.#topic.ensurePartition(partition)
    const slot = this.entity.floorSlot(partition) ?? this.#resolveFloor(partition)
    this.#recorder.resolveChunk(slot)
    // The calls above may have waited for the registration lock: checked again before the writes.
    this.#alive()
    return [this.#recorder.rowChunks[slot >>> Chunk.Shift], this.#recorder.sharedChunks[slot >>> Chunk.Shift], slot & Chunk.Mask]
  }

  /**
   * in_flight += n, always (a broker that cannot refuse a delivery): passing max_in_flight is the
   * fault IN_FLIGHT_LIMIT_PASSED, not a refusal. Returns whether the bound still held. Throws
   * UsageError IN_FLIGHT_KEPT_BY_SEND, counting nothing, as dispatch() does.
   */
  dispatched(n = 1): boolean {
    if (!isCount(n)) checkCount('n', n)
    this.#alive()
    if (this.#lock[this.#windowedIndex] !== 0) this.#countLevelAllowed('dispatched')
    const tag = this.#memory.lockTag
    let total: number
    const took = acquire(this.#lock, this.#lockIndex, tag, this.#memory)
    try {
      if (took) this.#tookOver()
      this.#alive()
      this.#row[this.#index + GroupCell.InFlight] += n
      total = this.#inFlightAll()
    } finally {
      release(this.#lock, this.#lockIndex, tag)
    }
    if (total > this.#maxInFlight) {
      this.#recorder.fault('IN_FLIGHT_LIMIT_PASSED', 'mq_group_in_flight', this.#labels(), this.#maxInFlight, total, this.#names())
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
    return this.#perMessage(partition, seq, Op.Send) === 1
  }

  /** Message `seq`, in flight, was sent again: retries += 1, in_flight unchanged (fault NOT_IN_FLIGHT otherwise). */
  redeliver(partition: number, seq: number): boolean {
    return this.#perMessage(partition, seq, Op.Redeliver) === 1
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
    return this.#perMessage(partition, seq, outcome === 'delivered' ? Op.Delivered : Op.Dropped) === 1
  }

  /**
   * Settles every message of `partition` up to `seq` that is not settled yet with `outcome` — a
   * discarded session's backlog, an expired range — ending in flight those that were. Returns how
   * many it settled (0, with ALREADY_SETTLED, when the floor is at `seq` already).
   */
  settleUpTo(partition: number, seq: number, outcome: Outcome): number {
    if (outcome !== 'delivered' && outcome !== 'dropped') throw new TypeError(`outcome must be 'delivered' or 'dropped', got ${describe(outcome)}`)
    return this.#perMessage(partition, seq, outcome === 'delivered' ? Op.DeliveredUpTo : Op.DroppedUpTo)
  }

  /** Whether message `seq` of `partition` is in flight in this group (sent, not settled). */
  isInFlight(partition: number, seq: number): boolean {
    return this.#perMessage(partition, seq, Op.Query) === 1
  }

  /**
   * Whether message `seq` of `partition` is settled in this group (at or below its floor, or
   * settled above it): a broker that may send a message again — a session's queue replayed — tells
   * one it has settled already from one it never sent.
   */
  isSettled(partition: number, seq: number): boolean {
    return this.#perMessage(partition, seq, Op.QuerySettled) === 1
  }

  /** design §4: this group's ack floor on `partition` (its base when higher: the partition started later). */
  floor(partition: number): number {
    checkPartition(partition)
    this.#alive()
    // A floor move under way, or left by a thread that is gone (its lock kept, or its move pending):
    // the floor its counts already moved is shown once the move is done, waited for or finished.
    if (Atomics.load(this.#lock, this.#lockIndex) !== 0 || this.#movePending(partition)) this.#finishMoves()
    const lastSeqSlot = this.#topic.knownPartition(partition)
    const base = lastSeqSlot === undefined ? 0 : this.#topic.baseOf(lastSeqSlot, partition)
    const slot = this.entity.floorSlot(partition)
    return Math.max(base, slot === undefined ? this.#knownFloor(partition) : this.#recorder.highest(slot))
  }

  /**
   * The per-message calls. The window (entities.ts windowSlots) holds two bits per seq above its
   * base — in flight, settled — at bit `seq mod window`, and is read and written only under the
   * group's lock: any thread may send, redeliver or settle any message.
   */
  #perMessage(partition: number, seq: number, op: Op): number {
    if (!isCount(seq) || seq === 0) checkSeq(seq)
    let lane = this.#lanes[partition]
    if (lane === undefined || typeof partition !== 'number') {
      // Nothing of a partition's window exists until a call writes to it: a query or a refused
      // call before then reads the floor instead (ackFloor() stays open: FLOOR_KEPT_BY_SETTLE).
      const early = this.#beforeLane(partition, seq, op)
      if (early !== undefined) return early
      lane = this.#lane(partition)!
    }
    if (seq > lane.seen && seq > this.#lastSeqReaching(lane, seq)) {
      this.#alive()
      this.#recorder.fault('SEQ_NOT_APPENDED', 'mq_partition_last_seq', this.#partitionLabels(partition), lane.seen, seq, this.#names())
      return 0
    }
    let lastSeq = lane.seen
    const headers = lane.headers
    const header = lane.header
    const bits = lane.bits
    const first = lane.first
    const window = lane.window
    const words = window >>> 5
    const position = windowIndex(seq, window)
    const word = first + (position >>> 5)
    const bit = 1 << (position & 31)
    const row = this.#row
    const index = this.#index
    const tag = this.#memory.lockTag
    let fault: FaultCode | '' = ''
    let previous = 0
    let total = 0
    let result = 1
    // In flight (every thread's) before the call and after it, when it went below 0: IN_FLIGHT_UNDERFLOW.
    let underflowFrom = 0
    let underflowTo = 0
    const took = acquire(this.#lock, this.#lockIndex, tag, this.#memory)
    try {
      if (took) this.#tookOver()
      this.#alive()
      // A holder that stopped (a worker terminated) inside a floor move left it recorded: finished first.
      if (headers[header + W_PENDING] !== 0) finishFloorMove(headers, header, bits, first, window, lane.hints, lane.hintAt)
      const initialized = headers[header + W_BASE] !== 0
      const floor = initialized ? headers[header + W_BASE] - 1 : Math.max(this.#recorder.highest(lane.floorSlot), this.#topic.baseHeld(lane.lastSeqSlot))
      const inFlight = (bits[word] & bit) !== 0
      // A settlement: what it counts (n, into `cell`), how many it ends in flight, the floor it
      // moves to (`to`, over `passed` seqs settled above the floor). Decided first (reads, calls),
      // then written with no call between the first write and the last, nor a loop but the bits'
      // clearing, which W_PENDING covers: a terminated thread stops only at a call or a loop's
      // back edge, so it never leaves a settlement half made (docs/design.md §11).
      let settling = false
      let cell = 0
      let n = 0
      let ended = 0
      let to = floor
      let passed = 0
      if (op === Op.Query) {
        result = seq > floor && seq <= floor + window && inFlight ? 1 : 0
      } else if (op === Op.QuerySettled) {
        result = seq <= floor || (seq <= floor + window && (bits[word + words] & bit) !== 0) ? 1 : 0
      } else if (op === Op.DeliveredUpTo || op === Op.DroppedUpTo || op === Op.ExpireUpTo) {
        if (seq <= floor) {
          if (op !== Op.ExpireUpTo) (fault = 'ALREADY_SETTLED'), (previous = floor)
          result = 0
        } else {
          // Within the window each seq not settled yet counts (in flight ones end); beyond it
          // nothing can be settled or in flight, so every seq there counts.
          for (let s = floor + 1, at = windowIndex(s, window); s <= seq && s <= floor + window; s++, at = at + 1 === window ? 0 : at + 1) {
            const w = first + (at >>> 5)
            const b = 1 << (at & 31)
            if ((bits[w + words] & b) !== 0) passed++
            else if ((n++, (bits[w] & b) !== 0)) ended++
          }
          if (seq > floor + window) n += seq - (floor + window)
          settling = true
          cell = op === Op.DeliveredUpTo ? GroupCell.Delivered : GroupCell.Dropped
          to = seq
        }
      } else if (seq > floor + window) {
        // First: beyond the window, the seq's bits are another seq's (seq − window…).
        fault = 'SETTLE_WINDOW_EXCEEDED'
        previous = floor + window
      } else if (seq <= floor || (bits[word + words] & bit) !== 0) {
        fault = 'ALREADY_SETTLED'
        previous = floor
      } else if (op === Op.Send) {
        if (inFlight) {
          fault = 'ALREADY_IN_FLIGHT'
          previous = floor
        } else {
          // An in_flight below 0 (threads that settled by count past their own shares at once) is
          // brought back to 0 first, as dispatch() does.
          const all = this.#inFlightAll()
          const below = all < 0 ? all : 0
          if (below < 0) underflowTo = below
          total = all - below + 1
          if (!initialized) headers[header + W_BASE] = floor + 1
          bits[word] |= bit
          row[index + GroupCell.InFlight] += 1 - below
        }
      } else if (op === Op.Redeliver) {
        if (!inFlight) (fault = 'NOT_IN_FLIGHT'), (previous = floor)
        else if (row[index + GroupCell.Retries] + 1 <= MAX_SAFE) row[index + GroupCell.Retries] += 1
        else this.#recorder.add(row, index + GroupCell.Retries, this.#slot + GroupCell.Retries, 1, this.#topic.entity, this.entity)
      } else {
        settling = true
        cell = op === Op.Delivered ? GroupCell.Delivered : GroupCell.Dropped
        n = 1
        if (inFlight) ended = 1
        if (seq === floor + 1) to = seq // the floor rises over it (and the settled seqs above: below)
      }
      if (settling) {
        // Seqs settled above the new floor continue it: it rises over them too.
        for (let next = windowIndex(to + 1, window); to !== floor && to + 1 <= floor + window; next = next + 1 === window ? 0 : next + 1) {
          if ((bits[first + words + (next >>> 5)] & (1 << (next & 31))) === 0 || (to + 1 > lastSeq && to + 1 > (lastSeq = this.#lastSeqReaching(lane, to + 1)))) break
          to++
          passed++
        }
        // What it ends in flight comes off this thread's share. A share that does not cover it (the
        // message was sent from another thread) is checked against every thread's: one settled by
        // count as well (delivered() and settle() for one message) would take in_flight below 0.
        // Counted all the same; in_flight stays at 0 (IN_FLIGHT_UNDERFLOW, as delivered()).
        let less = ended
        if (ended !== 0 && row[index + GroupCell.InFlight] < ended) {
          const all = this.#inFlightAll()
          if (all < ended) {
            less = shareTaken(all, ended)
            underflowFrom = Math.max(all, 0)
            underflowTo = underflowFrom - ended
          }
        }
        // Near 2^53 the count's cell makes room first (a fold: a call, whole, totals unchanged). Then the writes.
        if (row[index + cell] + n > MAX_SAFE) this.#recorder.room(row, index + cell, this.#slot + cell, n, this.#topic.entity, this.entity)
        row[index + cell] += n
        row[index + GroupCell.InFlight] -= less
        if (op === Op.Delivered || op === Op.Dropped) bits[word] &= ~bit
        if (to === floor) {
          // Not next: settled above the floor.
          if (!initialized) headers[header + W_BASE] = floor + 1
          bits[word + words] |= bit
          headers[header + W_SETTLED] += 1
        } else if (passed === 0 && to === floor + 1 && (op === Op.Delivered || op === Op.Dropped)) {
          // Next, nothing settled above it: the floor takes one step (its bits are clear already).
          headers[header + W_BASE] = to + 1
        } else {
          // The move is recorded before the bits of the seqs passed over are cleared (a call and a
          // loop: a thread stopped there leaves the move to the lock's next holder).
          headers[header + W_BASE] = floor + 1
          headers[header + W_PENDING] = to + 1
          clearPassed(bits, first, window, windowIndex(floor + 1, window), to - floor)
          headers[header + W_SETTLED] -= passed
          headers[header + W_BASE] = to + 1
          headers[header + W_PENDING] = 0
        }
        if (to > lane.hints[lane.hintAt]) lane.hints[lane.hintAt] = to
        result = n
      }
    } finally {
      release(this.#lock, this.#lockIndex, tag)
    }
    // Faults are raised after the call's last write (docs/reclamation.md).
    if (fault !== '') return this.#refuse(fault, partition, previous, seq)
    if (underflowTo < 0) this.#underflow(underflowFrom, underflowTo)
    if (op === Op.Send && total > this.#maxInFlight) {
      this.#recorder.fault('IN_FLIGHT_LIMIT_PASSED', 'mq_group_in_flight', this.#labels(), this.#maxInFlight, total, this.#names())
    }
    return result
  }

  /** Whether this thread knows `partition`'s window and a floor move is recorded there, not finished. */
  #movePending(partition: number): boolean {
    const lane = this.#lanes[partition]
    if (lane !== undefined) return lane.headers[lane.header + W_PENDING] !== 0
    const slot = this.entity.windowHeader(partition)
    return slot !== undefined && this.#memory.rowChunk(SHARED_ROW, slot >>> Chunk.Shift, true)![(slot & Chunk.Mask) + W_PENDING] !== 0
  }

  /** Under the group's lock (waited for, or taken over from a thread that is gone), every floor move left pending finished. */
  #finishMoves(): void {
    const tag = this.#memory.lockTag
    acquire(this.#lock, this.#lockIndex, tag, this.#memory)
    try {
      this.#tookOver()
    } finally {
      release(this.#lock, this.#lockIndex, tag)
    }
  }

  /**
   * This thread took the group's lock over from a thread that is gone (a worker terminated inside
   * a call), or floor() holds it: a floor move left recorded but not finished, on any partition this
   * thread knows, is finished now, before this call reads anything (window.ts). Its other calls are whole or not
   * made (docs/design.md §11). The registry is synced only if that needs no wait (under a group's
   * lock, only a fold or a credit read waits for the registration lock): a window this thread does
   * not know then is finished by a scrape (reader.ts) or the next per-message call on its partition.
   */
  #tookOver(): void {
    // A removed group's handle (it throws GROUP_REMOVED next) may hold its old block's lock, now
    // another group's: its own windows, perhaps reused too, are not its to finish.
    if (this.#tag[this.#index] !== this.#id) return
    this.#recorder.registry.trySync()
    finishWindows(this.#memory, this.entity)
  }

  /**
   * A per-message call on a partition this thread has no lane for yet: its answer when the call
   * writes nothing — a query, or a refusal — read from the floor if no thread made the partition's
   * window yet (undefined: the call goes on, the lane is made).
   */
  #beforeLane(partition: number, seq: number, op: Op): number | undefined {
    checkPartition(partition)
    this.#alive()
    const lastSeqSlot = this.#topic.knownPartition(partition)
    const lastSeq = lastSeqSlot === undefined ? 0 : this.#topic.lastSeqOf(lastSeqSlot)
    if (seq > lastSeq) {
      this.#recorder.fault('SEQ_NOT_APPENDED', 'mq_partition_last_seq', this.#partitionLabels(partition), lastSeq, seq, this.#names())
      return 0
    }
    if (this.entity.windowSlot(partition) !== undefined || (this.#recorder.registry.sync(), this.entity.windowSlot(partition) !== undefined)) return undefined
    // No window: nothing is in flight or settled above the floor.
    const floor = this.floor(partition)
    if (op === Op.Query) return 0
    if (op === Op.QuerySettled) return seq <= floor ? 1 : 0
    let fault: FaultCode | '' = ''
    let previous = floor
    if (seq <= floor && op === Op.ExpireUpTo) return 0
    if (seq <= floor) fault = 'ALREADY_SETTLED'
    else if (op !== Op.DeliveredUpTo && op !== Op.DroppedUpTo && op !== Op.ExpireUpTo && seq > floor + this.entity.window) (fault = 'SETTLE_WINDOW_EXCEEDED'), (previous = floor + this.entity.window)
    else if (op === Op.Redeliver) fault = 'NOT_IN_FLIGHT'
    return fault === '' ? undefined : this.#refuse(fault, partition, previous, seq)
  }

  /** A per-message call refused: its fault raised, 0 (false) returned. */
  #refuse(fault: FaultCode, partition: number, previous: number, seq: number): 0 {
    const metric = fault === 'ALREADY_IN_FLIGHT' || fault === 'NOT_IN_FLIGHT' ? 'mq_group_in_flight' : 'mq_group_lag'
    this.#recorder.fault(fault, metric, this.#partitionLabels(partition), previous, seq, this.#names())
    return 0
  }

  /**
   * The partition's lane, resolved on its first per-message call: undefined while nothing was
   * appended to it. Its blocks are the group's own for the group's life (a removed group fails
   * #alive() before any of them is touched), so they are resolved once.
   */
  #lane(partition: number): Lane | undefined {
    checkPartition(partition)
    this.#alive()
    const lastSeqSlot = this.#topic.knownPartition(partition)
    if (lastSeqSlot === undefined) return undefined
    const registry = this.#recorder.registry
    // Blocks first (they may take the registration lock), then the group's lock.
    const floorSlot = registry.floor(this.entity, partition)
    const windowSlot = registry.windowBlock(this.entity, partition)
    const headerSlot = this.entity.windowHeader(partition)!
    this.#recorder.resolveChunk(floorSlot)
    // A window and its header are in the shared row only: no thread row of their chunks is ever made.
    this.#recorder.resolveShared(windowSlot)
    this.#recorder.resolveShared(headerSlot)
    this.#recorder.resolveChunk(lastSeqSlot)
    const lane: Lane = {
      lastSeqSlot,
      seen: this.#topic.lastSeqOf(lastSeqSlot),
      own: this.#recorder.rowChunks[lastSeqSlot >>> Chunk.Shift],
      ownAt: lastSeqSlot & Chunk.Mask,
      floorSlot,
      hints: this.#recorder.sharedChunks[floorSlot >>> Chunk.Shift],
      hintAt: floorSlot & Chunk.Mask,
      headers: this.#recorder.sharedChunks[headerSlot >>> Chunk.Shift],
      header: headerSlot & Chunk.Mask,
      bits: this.#memory.sharedI32(windowSlot >>> Chunk.Shift),
      first: (windowSlot & Chunk.Mask) * 2, // the in-flight bits; the settled bits follow them
      window: this.entity.window,
    }
    this.#lanes[partition] = lane
    return lane
  }

  /**
   * last_seq, read no further than needed to know whether it reaches `seq`: this thread's own
   * appends first (Lane.own), every thread's row only when they fall short.
   */
  #lastSeqReaching(lane: Lane, seq: number): number {
    const own = lane.own[lane.ownAt]
    if (own > lane.seen) lane.seen = own
    return own >= seq ? own : this.#lastSeqNow(lane)
  }

  /** last_seq read across every thread (a seq above the lane's last sight of it). */
  #lastSeqNow(lane: Lane): number {
    const now = this.#topic.lastSeqOf(lane.lastSeqSlot)
    if (now > lane.seen) lane.seen = now
    return now
  }

  #partitionLabels(partition: number): Record<string, string> {
    return { topic: this.#topic.entity.label, group: this.entity.label, partition: String(partition) }
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
  #settleAcrossThreads(offset: number, n: number): void {
    const memory = this.#memory
    const row = this.#row
    const index = this.#index
    let available: number
    const tag = memory.lockTag
    const took = acquire(this.#lock, this.#lockIndex, tag, memory)
    try {
      if (took) this.#tookOver()
      const inFlight = this.#inFlightAll()
      available = Math.max(0, inFlight)
      const less = shareTaken(inFlight, n)
      this.#alive() // again, right before the writes (see dispatch)
      row[index + offset] += n
      row[index + GroupCell.InFlight] -= less
    } finally {
      release(this.#lock, this.#lockIndex, tag)
    }
    // Design §invariants: the delivery/drop happened and is counted; in_flight stays at 0.
    if (available < n) this.#underflow(available, available - n)
  }

  /**
   * Σ of every thread's in_flight share. Called under the group lock. The row count is a plain
   * read (Atomics.load costs ~9 ns here): a thread claimed its row before it took this lock, so
   * our acquire orders the claim before this read. Each row's chunk is cached (a row's chunk
   * never moves: no Atomics.load nor Map lookup per row per call, the `dispatch()` row of `npm
   * run bench`). A thread row with no chunk of this group's cells holds a share of 0, and is
   * looked up again (a directory read) only once the arena has handed out a chunk since the last
   * look: a thread's share becomes non-zero only under this lock (dispatch(), send(), a
   * settlement its own share did not cover; delivered() without the lock only lowers a positive
   * share), after it made its chunk, so our acquire orders that chunk's count before this read.
   * A broker scraped by the scrape thread has such a row on every call (that thread's), which
   * otherwise cost a lookup per send().
   */
  #inFlightAll(): number {
    const rows = Math.min(this.#memory.control[C_NEXT_ROW], MAX_ROWS)
    const allocated = this.#memory.control[C_NEXT_CHUNK]
    const look = allocated !== this.#missingAt
    const chunks = this.#rowChunks
    const at = this.#index + GroupCell.InFlight
    let missing = false
    let sum = 0
    for (let row = 1; row < rows; row++) {
      let chunk = chunks[row]
      if (chunk === undefined) {
        if (!look) continue
        chunk = this.#memory.rowChunk(row, this.#slot >>> Chunk.Shift, false)
        if (chunk === undefined) {
          missing = true
          continue
        }
        chunks[row] = chunk
      }
      sum += chunk[at]
    }
    if (look) this.#missingAt = missing ? allocated : -1
    return sum
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
    return { topic: this.#topic.entity.label, group: this.entity.label }
  }

  /** The raw names a fault's labels were sanitized from. */
  #names(): FaultNames {
    return { topic: this.#topic.name, group: this.name }
  }
}
