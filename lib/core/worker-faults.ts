// Faults raised in worker threads, on their way to the main thread's log and listeners, for the
// whole life of a surface (design §5). One arena chunk, allocated on first use:
//
// - per-code counts (64-bit, Atomics.add): a worker counts its fault here first, so the counts the
//   main thread shows are exact however many faults come, however fast;
// - a ring of records (many producers, one consumer): a worker claims a slot by advancing the write
//   cursor with compare-and-swap (only while the ring has room), copies the fault's JSON in, and
//   publishes it by storing the slot's sequence number last. The main thread takes published
//   records in ring order and frees their slots by advancing the read cursor;
// - per-code "suppressed" counts: a fault that found the ring full is counted, not queued; each
//   drain turns them into one summary per code (FAULTS_SUPPRESSED), so a storm costs bounded memory
//   and the log and listeners see at most RING_SLOTS records per drain plus a line per code.
//
// A worker terminated between claiming a slot and publishing it would stop the ring: a slot that
// has stayed unpublished for STUCK_MS of the main thread's monotonic clock is skipped (its count
// was already taken). Slots claimed before that wait began have been unpublished as long, and are
// skipped with it (a pool terminated at once would otherwise hold the ring up STUCK_MS per
// worker). Of a gap between two drains at most STUCK_GAP_MS counts: a longer one is the process
// stopped as a whole, the worker with it. The limit is time, not a number of drains:
// drains can follow each other within microseconds (a loop of stats() calls) while a live worker
// sits preempted between its claim and its publish on a busy machine, and its record must still
// arrive.
//
// A worker paused longer than that (a debugger, swapping) may go on after the skip, once the ring
// has come round to its slot again. So a slot's text has a writer: a worker takes the slot's
// writer cell (compare-and-swap from 0, its lock tag) before it copies and lets go after the copy,
// before it publishes. A worker that finds the cell held, by a late worker of an earlier lap, gives
// its record up (counted as suppressed) and publishes its mark without text; the consumer drops a
// record whose cursor cell (written by the writer after the text) is not its own. A text is thus
// written by one worker at a time, and only by one whose cursor the consumer has not passed (it
// looks after taking the cell): a later lap's record is never overwritten, mixed or impersonated
// while the consumer reads it. A writer cell held by a thread that is gone (terminated inside its
// copy) is taken over; where that cannot be told (no /proc), the slot's later records are given up,
// each counted. A late worker publishes by compare-and-swap over 0 or over an earlier lap's mark
// only, so it never costs a later lap its mark; it counts its record as suppressed when it finds
// itself passed. A skip leaves the skipped cursor's own mark in the slot (by compare-and-swap over
// what the consumer saw: a publish that landed meanwhile is read instead), so a late publish after
// it is refused, and counted. After each cursor the consumer writes a value no cursor of the slot
// can have into its cursor cell. What is left: a late worker terminated between writing its cursor
// cell and letting go of the writer cell, where its thread cannot be told gone, leaves that cursor
// cell for a mark published without text 2^32 records later.
import { FAULT_CODES, FaultRecord } from './faults'
import { C_FAULT_CHANNEL, SLOTS_PER_CHUNK } from './layout'
import { Memory } from './memory'
import type { ThreadState } from './threads'

/** Int32 cells of one ring slot: sequence + 1 when published (0 free), length, the cursor, the writer's tag (0 none), then 2 UTF-16 units per cell. */
const SLOT_INTS = 256
/** Slots per ring chunk (the chunks after the header chunk). */
const SLOTS_PER_RING_CHUNK = (SLOTS_PER_CHUNK * 2) / SLOT_INTS
const RING_CHUNKS = 8
/** Records the ring holds (what one drain can deliver, at most): a power of two, so that slot = cursor mod it survives the cursor's wrap. */
export const RING_SLOTS = SLOTS_PER_RING_CHUNK * RING_CHUNKS
// A slot's cells: [0] its publish mark (markOf), then these, then the text.
const LENGTH = 1
const CURSOR = 2
const WRITER = 3
const TEXT = 4
/** The longest record a slot holds, in UTF-16 units (docs/faults.md names the figure). */
export const MAX_TEXT = (SLOT_INTS - TEXT) * 2
/** How long a claimed slot may stay unpublished before the consumer gives its producer up for dead. */
export const STUCK_MS = 5000
/**
 * The most one gap between two drains adds to a slot's wait: the drain timer runs every second, so
 * a longer gap is the whole process stopped (SIGSTOP, a paused container or VM), during which the
 * worker did not run either.
 */
export const STUCK_GAP_MS = 1000
// The header chunk: Int32 cells [0] write cursor, [1] read cursor; BigInt64 cells [16 + code]
// counts, [48 + code] suppressed (code = index in FAULT_CODES). Then RING_CHUNKS chunks of slots.
const WRITE = 0
const READ = 1
const COUNTS = 16
const SUPPRESSED = 48
if (FAULT_CODES.length > 32) throw new Error('internal: the worker fault channel holds 32 codes')

export class WorkerFaultChannel {
  readonly #memory: Memory
  #cells: Int32Array | undefined
  #wide: BigInt64Array | undefined
  readonly #ring: Int32Array[] = []
  readonly #now: () => number
  readonly #holderState: (tag: number) => ThreadState
  /** Consumer only: the read position found unpublished, since when, and what was suppressed so far. */
  #stuck = 0
  #isStuck = false
  #stuckFor = 0
  #stuckSeenAt = 0
  /** The write cursor when the wait began: a slot claimed before it has been unpublished all of #stuckFor. */
  #stuckSince = 0
  readonly #suppressedSeen = new Map<string, bigint>()

  /**
   * `now`: the consumer's monotonic clock in ms; `holderState`: whether the thread of a lock tag
   * runs (Memory.holderState). Parameters so that a test can move the one and answer the other.
   */
  constructor(memory: Memory, now: () => number = () => performance.now(), holderState: (tag: number) => ThreadState = (tag) => memory.holderState(tag)) {
    this.#memory = memory
    this.#now = now
    this.#holderState = holderState
  }

  /** A worker's fault: counted at once, queued for the main thread while the ring has room. */
  send(fault: FaultRecord): void {
    this.#attach(true)
    const cells = this.#cells!
    const wide = this.#wide!
    const code = codeIndex(fault.code)
    Atomics.add(wide, COUNTS + code, 1n)
    let text = JSON.stringify(fault)
    if (text.length > MAX_TEXT) text = JSON.stringify({ ...fault, names: undefined }) // long raw names: the labels say which
    if (text.length > MAX_TEXT) text = JSON.stringify({ ...fault, labels: {}, names: undefined, metric: fault.metric.slice(0, 200) }).slice(0, MAX_TEXT)
    for (;;) {
      const write = Atomics.load(cells, WRITE)
      if (((write - Atomics.load(cells, READ)) | 0) >= RING_SLOTS) {
        Atomics.add(wide, SUPPRESSED + code, 1n)
        return
      }
      if (Atomics.compareExchange(cells, WRITE, write, (write + 1) | 0) !== write) continue
      const [slot, at] = this.#slot(write)
      // Skipped already (paused past STUCK_MS): the slot may be another's now.
      if (passed(cells, write)) return void Atomics.add(wide, SUPPRESSED + code, 1n)
      const tag = this.#memory.lockTag
      if (!this.#takeWriter(slot, at, tag)) {
        // A late worker of an earlier lap is copying here: its text, not this record's, may be in
        // the slot. The mark alone, so that the consumer goes on without waiting (and drops it).
        Atomics.add(wide, SUPPRESSED + code, 1n)
        publish(cells, slot, at, write)
        return
      }
      if (passed(cells, write)) {
        Atomics.compareExchange(slot, at + WRITER, tag, 0)
        return void Atomics.add(wide, SUPPRESSED + code, 1n)
      }
      slot[at + LENGTH] = text.length
      for (let i = 0; i < text.length; i += 2) {
        slot[at + TEXT + i / 2] = text.charCodeAt(i) | ((i + 1 < text.length ? text.charCodeAt(i + 1) : 0) << 16)
      }
      slot[at + CURSOR] = write // after the text: the consumer drops a record whose cursor is not its own
      Atomics.compareExchange(slot, at + WRITER, tag, 0) // before the publish: a held cell means a copy under way
      if (!publish(cells, slot, at, write)) Atomics.add(wide, SUPPRESSED + code, 1n)
      return
    }
  }

  /** Takes the slot's writer cell: free, or held by a thread that is gone. false: a live (or unknown) late worker holds it. */
  #takeWriter(slot: Int32Array, at: number, tag: number): boolean {
    for (;;) {
      const writer = Atomics.compareExchange(slot, at + WRITER, 0, tag)
      if (writer === 0) return true
      if (writer === tag || this.#holderState(writer) !== 'gone') return false
      if (Atomics.compareExchange(slot, at + WRITER, writer, tag) === writer) return true
    }
  }

  /**
   * The main thread: every published record in ring order, and a FAULTS_SUPPRESSED summary per code
   * whose faults were not queued since the last drain (the ring full, or given up: see the header).
   */
  drain(): FaultRecord[] {
    if (!this.#attach(false)) return []
    const cells = this.#cells!
    const out: FaultRecord[] = []
    let read = Atomics.load(cells, READ)
    const write = Atomics.load(cells, WRITE)
    while (read !== write) {
      const [slot, at] = this.#slot(read)
      const mark = markOf(read)
      const seen = Atomics.load(slot, at)
      if (seen !== mark) {
        // Claimed, not published: a copy under way, or a worker that died in it.
        const now = this.#now()
        if (!this.#isStuck || this.#stuck !== read) {
          // A slot claimed before the wait for the one before it began (several workers
          // terminated inside their queuing at once) has been unpublished all that time: its
          // wait goes on from there, not from 0 (each waited 5 s more, in turn).
          const claimedBefore = this.#isStuck && ((this.#stuckSince - read) | 0) > 0
          this.#isStuck = true
          this.#stuck = read
          if (!claimedBefore) {
            this.#stuckFor = 0
            this.#stuckSeenAt = now
            this.#stuckSince = write
            break
          }
        }
        this.#stuckFor += Math.min(Math.max(now - this.#stuckSeenAt, 0), STUCK_GAP_MS)
        this.#stuckSeenAt = now
        if (this.#stuckFor < STUCK_MS) break
        // Skipped: the slot takes this cursor's own mark, so that the late worker's publish is
        // refused (and counted as suppressed by it). Published in the meantime: read it after all.
        if (Atomics.compareExchange(slot, at, seen, mark) !== seen) continue
      } else {
        const length = Math.min(slot[at + LENGTH], MAX_TEXT)
        let text = ''
        for (let i = 0; i < length; i += 2) {
          const pair = slot[at + TEXT + i / 2]
          text += String.fromCharCode(pair & 0xffff)
          if (i + 1 < length) text += String.fromCharCode(pair >>> 16)
        }
        // A mark without its text (its worker gave it up, see the header): dropped; counted as suppressed.
        if (Atomics.load(slot, at + CURSOR) === read) {
          try {
            out.push(JSON.parse(text) as FaultRecord)
          } catch {
            // garbled as well
          }
        }
        Atomics.store(slot, at, 0)
      }
      // No cursor of this slot's (~read is never read mod RING_SLOTS): a later lap's mark published
      // without its text is never taken for a record by a cursor cell left from this one.
      Atomics.store(slot, at + CURSOR, ~read)
      // The wait goes on for the slots claimed before it began (above), and ends past them.
      if (((this.#stuckSince - read) | 0) <= 1) this.#isStuck = false
      read = (read + 1) | 0
      Atomics.store(cells, READ, read)
    }
    const at = new Date().toISOString()
    for (let code = 0; code < FAULT_CODES.length; code++) {
      const suppressed = Atomics.load(this.#wide!, SUPPRESSED + code)
      const name = FAULT_CODES[code]
      const before = this.#suppressedSeen.get(name) ?? 0n
      if (suppressed === before) continue
      this.#suppressedSeen.set(name, suppressed)
      out.push({ code: 'FAULTS_SUPPRESSED', metric: '', labels: { code: name }, previous: null, attempted: Number(suppressed - before), at })
    }
    return out
  }

  /** Faults workers raised, per code, since the surface was created (exact). */
  counts(): Map<string, number> {
    const counts = new Map<string, number>()
    if (!this.#attach(false)) return counts
    for (let code = 0; code < FAULT_CODES.length; code++) {
      const count = Atomics.load(this.#wide!, COUNTS + code)
      if (count > 0n) counts.set(FAULT_CODES[code], Number(count))
    }
    return counts
  }

  /** The ring chunk and index of the slot of `cursor`. */
  #slot(cursor: number): [Int32Array, number] {
    const slot = mod(cursor) % RING_SLOTS
    return [this.#ring[Math.floor(slot / SLOTS_PER_RING_CHUNK)], (slot % SLOTS_PER_RING_CHUNK) * SLOT_INTS]
  }

  /** Maps the channel's chunks; with `create`, allocates them first if no thread has. */
  #attach(create: boolean): boolean {
    if (this.#cells !== undefined) return true
    const memory = this.#memory
    let k = Atomics.load(memory.control, C_FAULT_CHANNEL)
    if (k === 0) {
      if (!create) return false
      memory.lock()
      try {
        k = memory.control[C_FAULT_CHANNEL]
        if (k === 0) {
          // Consecutive chunks: the lock holder alone hands chunks out.
          k = memory.allocateChunk()
          for (let i = 0; i < RING_CHUNKS; i++) memory.allocateChunk()
          for (let i = 0; i <= RING_CHUNKS; i++) memory.arena.chunk(k + i)
          Atomics.store(memory.control, C_FAULT_CHANNEL, k)
        }
      } finally {
        memory.unlock()
      }
    }
    for (let i = 1; i <= RING_CHUNKS; i++) this.#ring.push(memory.chunkI32(k + i))
    this.#wide = memory.chunkI64(k)
    this.#cells = memory.chunkI32(k)
    return true
  }
}

/**
 * Publishes the record of `cursor` by storing its mark last: over 0, or over the mark a worker
 * skipped on an earlier lap left when it went on late (its cursor is before this one); never over
 * a later lap's mark, nor once the consumer has passed `cursor`. false: not published.
 */
function publish(cells: Int32Array, slot: Int32Array, at: number, cursor: number): boolean {
  const mark = markOf(cursor)
  for (;;) {
    const current = Atomics.load(slot, at)
    if (passed(cells, cursor) || (current !== 0 && ((current - 1 - cursor) | 0) >= 0)) return false
    if (Atomics.compareExchange(slot, at, current, mark) === current) return true
  }
}

/** The publish mark of `cursor`'s record: cursor + 1, never 0 (0 is a slot never published since it was read). */
function markOf(cursor: number): number {
  return (cursor + 1) | 0 || 1
}

/** Whether the consumer's read cursor has gone past `cursor` (its slot was taken or skipped). */
function passed(cells: Int32Array, cursor: number): boolean {
  return ((Atomics.load(cells, READ) - cursor) | 0) > 0
}

/** A cursor (an Int32 that wraps) as a non-negative position. */
function mod(cursor: number): number {
  return cursor >>> 0
}

function codeIndex(code: string): number {
  const index = (FAULT_CODES as readonly string[]).indexOf(code)
  if (index < 0) throw new Error(`internal: fault code ${code} is not in FAULT_CODES`)
  return index
}
