// The registration log's capacity policy: how much of a generation a registration may take (all
// but a reserve kept for removals, retirements and folds, so that room can always be made), when
// a call is refused for want of room (LimitError `registration_log`, nothing done), and when the
// log is compacted. It counts what a compaction would drop as the replay frees it (picture.ts),
// and makes room only through the registry (registry.ts): by writing the retirements due and by
// compacting. Caller locks and has synced throughout.
import { LimitError } from './errors'
import { GroupEntity, TopicEntity } from './entities'
import { endAfter, entryLength } from './log'
import { C_LOG_CHECKPOINT, C_LOG_END, LOG_CHUNK_INTS, MAX_LOG_CHUNKS } from './layout'

/** A log shorter than this is never compacted (Int32 units: 256 KiB). */
export const COMPACT_MIN_INTS = 65536

/** What the policy makes room with: the registry's own calls. */
export interface RoomMaker {
  /** Writes the retirements due (Registry.reclaim()). */
  reclaim(): void
  /** Writes a checkpoint of what is alive as a new generation; false if it would not fit (Registry.compact()). */
  compact(): boolean
  /** Whether a removed group or topic still waits to retire. */
  retirementsPending(): boolean
}

export class LogCapacity {
  /** The log length (Int32 units) below which it is never compacted; tests lower it to compact often. */
  compactMinInts = COMPACT_MIN_INTS
  /**
   * How many Int32 cells one generation of the log may hold (its directory's chunks, 414 MiB with
   * 64 KiB chunks); tests lower it to fill the log. A registration may use it but for the last
   * 1/64 (at least a chunk), kept for what makes room: removals, and folds of counters near 2^53.
   */
  logCapacityInts = MAX_LOG_CHUNKS * LOG_CHUNK_INTS
  /**
   * Log cells a compaction would drop, freed since the last checkpoint: by entities retired or
   * removed with nothing to carry (heldInts, their removal's entry included), and by a label's
   * carry gone with its last topic.
   */
  #reclaimable = 0
  /** Log end + #reclaimable when compact() last found its checkpoint too large to write (−∞: never, or compacted since). */
  #uncompacted = -Infinity
  readonly #control: Int32Array
  readonly #registry: RoomMaker

  constructor(control: Int32Array, registry: RoomMaker) {
    this.#control = control
    this.#registry = registry
  }

  /**
   * Refuses a registration whose entries (their `lengths`) the log cannot take, before anything
   * is allocated for it: LimitError `registration_log`, nothing registered. It leaves the last
   * 1/64 of the log to removals, retirements and folds, so that room can still be made in a full
   * log; it writes the retirements due first, and compacts when that is due (compactionDue).
   */
  room(lengths: number[], what: () => string): void {
    const control = this.#control
    const fits = () => endAfter(control[C_LOG_END], lengths) <= this.logCapacityInts - this.#logReserve()
    // Retirements due are written first (into the reserve), so that Blocks.allocate() has none to write.
    this.#registry.reclaim()
    if (fits()) return
    if (this.compactionDue(true)) this.#registry.compact()
    if (fits()) return
    throw this.#logFull(`cannot register ${what()}`, 'nothing was registered')
  }

  /**
   * Refuses a removal (LimitError, nothing removed) the log's reserve has no room for. One that
   * owes a retirement (`owes` cells of it, an upper bound: a group; a topic whose label another
   * topic has) may take the reserve's first quarter, the rest being for those retirements, which
   * a thread busy in one task holds back while removals go on; past it, only when no retirement
   * is pending and its own fits after it, an eighth of the reserve before the end. One that owes
   * none (the last topic of its label, which frees its room at once) may take it all, so that
   * room can always be made. The retirements due are written first, and the log compacted when
   * that frees enough (room).
   */
  roomToRemove(owes: number): void {
    const control = this.#control
    const quarter = this.logCapacityInts - Math.ceil((this.#logReserve() * 3) / 4)
    const fits = () => {
      const end = endAfter(control[C_LOG_END], [entryLength(5)])
      if (owes === 0 || end <= quarter) return end <= this.logCapacityInts
      // (end + owes, not endAfter(): the eighth of the reserve left takes the padding a chunk's end may add)
      return !this.#registry.retirementsPending() && end + owes <= this.logCapacityInts - Math.ceil(this.#logReserve() / 8)
    }
    if (fits()) return
    this.#registry.reclaim()
    if (!fits() && this.compactionDue(true)) this.#registry.compact()
    if (!fits()) throw this.#logFull('cannot remove', 'nothing was removed: the removals before it have not retired yet (a thread is busy in one task), and it is taken once they have and the log is compacted')
  }

  /** Refuses entries of `lengths` that would pass the log's end (LimitError, `what`: nothing was written). Past it nothing is written. */
  mustFit(lengths: number[], what: string): void {
    if (endAfter(this.#control[C_LOG_END], lengths) > this.logCapacityInts) throw this.#logFull(what, 'nothing was written')
  }

  /**
   * Whether the log is compacted now: it has doubled since its checkpoint (and passed
   * compactMinInts), or, `full` (a registration it cannot take) or into its reserve, what
   * retirements and removals freed since (#reclaimable) adds up to a quarter of the reserve:
   * each compaction of a full log frees that much at least, however many calls it refuses
   * meanwhile.
   */
  compactionDue(full = false): boolean {
    const control = this.#control
    const end = control[C_LOG_END]
    const reserve = this.#logReserve()
    if (end + this.#reclaimable < this.#uncompacted + reserve / 4) return false // measured too large not long ago
    if (end > Math.max(this.compactMinInts, 2 * control[C_LOG_CHECKPOINT])) return true
    // Full, what was written since is live or owed as much as not: only what retirements and
    // removals freed (#reclaimable) pays for a compaction.
    return (full || end > this.logCapacityInts - reserve) && this.#reclaimable >= reserve / 4
  }

  /** The replay freed `ints` cells a compaction would no longer restate (heldInts, a carry's entries). */
  freed(ints: number): void {
    this.#reclaimable += ints
  }

  /** A checkpoint measured too large to write: the log is not measured again until a quarter of the reserve more is freed or written. */
  tooLargeToCompact(): void {
    this.#uncompacted = this.#control[C_LOG_END] + this.#reclaimable
  }

  /** A new generation (written here, or replayed): nothing freed since its checkpoint, nothing measured. */
  restart(): void {
    this.#reclaimable = 0
    this.#uncompacted = -Infinity
  }

  /** The log's last 1/64 (at least a chunk): what registrations leave to removals, retirements and folds. */
  #logReserve(): number {
    return Math.max(LOG_CHUNK_INTS, Math.floor(this.logCapacityInts / 64))
  }

  #logFull(what: string, outcome: string): LimitError {
    const mib = (this.logCapacityInts * 4) / 2 ** 20
    return new LimitError('registration_log', `${what}: the registration log is full (${mib >= 1 ? Math.round(mib) : mib.toFixed(2)} MiB for the names and registrations of every live topic, partition and group, removals not retired yet, and what they freed); ${outcome}. Remove topics or groups no longer in use (per-message or per-client names?): their room comes back once they have retired and the log is compacted (docs/operations.md)`)
  }
}

/**
 * An upper bound of the log cells a topic removed into its label's carry takes to retire
 * (Registry #topicCarry): its five counters' carries, a last_seq one per partition, a retries one
 * per group label, and TopicRetired, each amount below 2^62 (one entry: log.ts amountRows).
 */
export function topicRetirementInts(topic: TopicEntity): number {
  let ints = 5 * entryLength(6) + topic.partitionNumbers.length * entryLength(6) + entryLength(2)
  for (const label of new Set([...topic.groups, ...topic.retiring].map((group) => group.label))) ints += entryLength(6, label)
  return ints
}

/**
 * What a compaction no longer restates once `entity` has retired: the log cells its
 * registrations and its removal take, less the 3 its each freed block takes in a checkpoint's
 * Free entries. (A topic's groups count their removal too: an upper bound by a few cells.)
 */
export function heldInts(entity: TopicEntity | GroupEntity): number {
  if (entity instanceof GroupEntity) {
    return entryLength(5) + entryLength(7, entity.name) - 3 + entity.floorSlots.length * 2 // a window's entry (6) frees two blocks (6)
  }
  let ints = entryLength(5) + entryLength(3, entity.name) - 3 + entity.partitionSlots.length * 2
  for (const group of [...entity.groups, ...entity.retiring]) ints += heldInts(group)
  return ints
}
