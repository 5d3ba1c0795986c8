// The hot path's per-thread context. Topic and group handles (topic.ts, group.ts) are resolved
// once, then recorded on millions of times a second, through the Recorder here. Each method
// validates its arguments, checks what design §5 needs, and only then writes — a rejected call
// leaves every number as it was. Counters go to this thread's own row (a plain Float64Array
// add: no lock, no atomic, no N-API call); the few cells that need an exact bound across
// threads (in_flight, the dlq credit) use Atomics on the shared row.
import { C_QUORUM, SHARED_ROW } from './layout'
import { GroupEntity, TopicEntity } from './entities'
import { Registry } from './registry'
import { Chunk } from './checks'
import type { FaultCode, FaultNames } from './faults'

const MAX_SAFE = Number.MAX_SAFE_INTEGER

export type FaultSink = (code: FaultCode, metric: string, labels: Record<string, string>, previous: number | null, attempted: number | null, names?: FaultNames) => void

/** A last_seq hint that names its only writer: a quiet NaN whose payload is the thread's row. */
const OWNED = 0x7ff8000000000000n
const bitsView = new Float64Array(1)
const bitsView64 = new BigInt64Array(bitsView.buffer)

export class Recorder {
  readonly registry: Registry
  readonly row: number
  readonly fault: FaultSink
  readonly #control: Int32Array
  /**
   * By chunk number: this thread's row chunk and the shared row's, filled in as handles resolve
   * their slots. Handles keep a slot number per partition and per ack floor and find the cells
   * here, rather than one small object per cell: 8 bytes instead of ~56 per partition and ~48
   * per floor (the `memory` section of `npm run bench` weighs it per sample).
   */
  readonly rowChunks: Float64Array[] = []
  readonly sharedChunks: Float64Array[] = []
  /**
   * By chunk number: every thread row's chunk (index = row), filled in as rows appear — what
   * dispatch() sums in_flight over. Shared by all the groups of a chunk (an array per group was
   * 64 B of the ~120 B per sample at 4,348 topics × 16 partitions × 2 groups).
   */
  readonly #allRows: (Float64Array | undefined)[][] = []
  /**
   * Called before a removal of group `group` of topic `topic` (every group of it, without `group`;
   * `topicId`, the incarnation meant, when the caller knows it): the group's numbers judged as it
   * leaves (Observer.checkLeaving). Returns what tells the faults found, to be called once the
   * removal is made. Set by the surface, and by a worker's recorder.
   */
  leaving: ((topic: string, topicId: number | undefined, group: string | undefined) => () => void) | undefined


  constructor(registry: Registry, row: number, fault: FaultSink) {
    this.registry = registry
    this.row = row
    this.fault = fault
    this.#control = registry.memory.control
  }

  readOnly(): boolean {
    return this.#control[C_QUORUM] === 2
  }

  /** Makes `rowChunks` and `sharedChunks` hold the chunk of `slot` (allocating it if need be). */
  resolveChunk(slot: number): void {
    const c = slot >>> Chunk.Shift
    if (this.rowChunks[c] === undefined) this.rowChunks[c] = this.registry.memory.rowChunk(this.row, c, true)!
    this.resolveShared(slot)
  }

  /** Makes `sharedChunks` hold the chunk of `slot`, for a block only the shared row holds (a settlement window). */
  resolveShared(slot: number): void {
    const c = slot >>> Chunk.Shift
    if (this.sharedChunks[c] === undefined) this.sharedChunks[c] = this.registry.memory.rowChunk(SHARED_ROW, c, true)!
  }

  /**
   * The last_seq hint protocol (design §5's regression check across threads without a shared write
   * per call). A partition's hint cell in the shared row is, as 64 bits:
   *   0 (+0.0)       fresh: no thread has written the partition yet;
   *   OWNED | row    a NaN: thread `row` is its only writer. produced() compares seq with the hint
   *                  and raises it only when `seq > hint`, both false against NaN, so the owner
   *                  never touches the shared cache line, and two threads writing their own
   *                  partitions do not ping-pong one line (the `workers` section of `npm run bench`);
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
    const c = slot >>> Chunk.Shift
    const at = slot & Chunk.Mask
    const rows = this.allRowsOf(c) // resolves the chunk too
    const hint = this.sharedChunks[c][at]
    let max = hint > 0 ? hint : 0
    const count = this.registry.memory.rowCount()
    for (let row = 1; row < count; row++) {
      let chunk = rows[row]
      if (chunk === undefined) {
        // That thread has not written this chunk (yet): asked again each time until it has.
        chunk = this.registry.memory.rowChunk(row, c, false)
        if (chunk === undefined) continue
        rows[row] = chunk
      }
      if (chunk[at] > max) max = chunk[at]
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
   * Adds to a row cell of `topic` (of `group`, for a group's cell); past 2^53 the cell's value
   * moves to the log first so the total stays exact (under the registration lock, which checks
   * again that the topic or group was not removed meanwhile). The add is this call's one write.
   */
  add(row: Float64Array, index: number, slot: number, n: number, topic: TopicEntity, group?: GroupEntity): void {
    this.room(row, index, slot, n, topic, group)
    row[index] += n
  }

  /**
   * Makes room for `n` in a row cell: when it would pass 2^53, its value moves to the log (a
   * fold, whole or not made; totals unchanged). A call that writes several cells makes room in
   * each first, then writes them all with no call between (design §11).
   */
  room(row: Float64Array, index: number, slot: number, n: number, topic: TopicEntity, group?: GroupEntity): void {
    if (row[index] + n > MAX_SAFE) this.registry.fold(row, index, slot, topic, group)
  }

  /**
   * Σ over every thread row of a cell, and its folds: a number while that is exact, else a
   * bigint. Read under the registration lock, the registry synced (another thread's folds are
   * log entries): a fold holds that lock from giving its cell's value up to publishing the entry
   * that holds it, so no fold is seen half made (the cell down, the entry not yet there).
   */
  exactTotal(rows: readonly (Float64Array | undefined)[], rowCount: number, index: number, slot: number): number | bigint {
    return this.registry.whileSynced(() => {
      let sum = 0
      for (let row = 1; row < rowCount; row++) sum += rows[row]?.[index] ?? 0
      if (sum <= MAX_SAFE && !this.registry.folds.has(slot)) return sum
      return this.registry.exactSum(slot)
    })
  }
}
