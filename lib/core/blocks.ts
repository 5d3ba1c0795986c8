// Slot blocks: where a registration's cells come from (entities.ts sizes them). A block is the
// oldest freed one of its kind and size once every other thread is past the epoch it was freed at
// (reclamation.ts), zeroed in every row, else a fresh one from the end of its kind's chunks. Every
// thread replays the same registrations and removals into the same free queues (picture.ts takes
// and releases); the registration lock's holder allocates (registry.ts). Caller locks throughout.
import { FLOOR_SLOTS, GROUP_SLOTS, PARTITION_SLOTS, TOPIC_SLOTS, W_HEADER, windowSlots } from './entities'
import { C_NEXT_HEADER_SLOT, C_NEXT_SLOT, C_NEXT_WINDOW_SLOT, C_SLOT_CHUNKS, C_SLOTS_RESERVED, DIRECTORY_ENTRIES, SLOTS_PER_CHUNK } from './layout'
import { Memory } from './memory'

/**
 * Freed blocks wait in queues by kind and size, never by size alone: a removed handle checks the
 * liveness tag in its block's first shared cell, and in a block of another kind that cell holds
 * something else (a last_seq hint, a floor's hint, a window's bits) that could equal the old id.
 */
const KIND_BITS = 3
const blockKey = (kind: number, size: number) => size * (1 << KIND_BITS) + kind
export const KEY_TOPIC = blockKey(0, TOPIC_SLOTS)
export const KEY_PARTITION = blockKey(1, PARTITION_SLOTS)
export const KEY_GROUP = blockKey(2, GROUP_SLOTS)
export const KEY_FLOOR = blockKey(3, FLOOR_SLOTS)
const KIND_WINDOW = 4
export const windowKey = (window: number) => blockKey(KIND_WINDOW, windowSlots(window))
const KIND_HEADER = 5
export const KEY_HEADER = blockKey(KIND_HEADER, W_HEADER)

/** Slot chunks a surface can hand out: a row's directory names each by index (layout.ts), so 1 GiB of slots. */
export const MAX_SLOT_CHUNKS = DIRECTORY_ENTRIES

/** The slots of a block of `key` (a block key: kind and size). */
export function blockSize(key: number): number {
  return key >>> KIND_BITS
}

/** Freed blocks of one size, oldest first: `slots[head…]`, each with the epoch it waits for. */
export interface FreeQueue {
  slots: number[]
  epochs: number[]
  head: number
}

/**
 * The control cell of the next never-used slot of `key`'s kind. Settlement windows and their
 * headers come from chunks of their own (one kind each): the shared row alone holds them, so a
 * thread row of such a chunk is never made (64 KiB per thread and chunk), and windows of a
 * power-of-two size fill their chunks whole. Every other block comes from the other chunks.
 */
function nextCell(key: number): number {
  const kind = key & ((1 << KIND_BITS) - 1)
  return kind === KIND_WINDOW ? C_NEXT_WINDOW_SLOT : kind === KIND_HEADER ? C_NEXT_HEADER_SLOT : C_NEXT_SLOT
}

/**
 * Whether a block of `size` slots at the next never-used `slot` opens a new chunk: a block never
 * straddles two chunks (a handle keeps one view per block), so one that does not fit what is left
 * of the current chunk (none at a chunk's start) opens a new one.
 */
function opensChunk(slot: number, size: number): boolean {
  return slot % SLOTS_PER_CHUNK === 0 || (slot % SLOTS_PER_CHUNK) + size > SLOTS_PER_CHUNK
}

export class Blocks {
  readonly #memory: Memory
  /** Whether every other thread is past an epoch (reclamation.ts): a block freed at it may be reused. */
  readonly #hasPassed: (epoch: number) => boolean
  readonly #free = new Map<number, FreeQueue>() // block key (kind and size: blockKey) → freed blocks, oldest first
  /** Slot chunks fit() lets registrations open (MAX_SLOT_CHUNKS); tests lower it to fill the counter memory. */
  maxChunks = MAX_SLOT_CHUNKS

  constructor(memory: Memory, hasPassed: (epoch: number) => boolean) {
    this.#memory = memory
    this.#hasPassed = hasPassed
  }

  /**
   * A block of `size` slots: the oldest freed one (zeroed in every row) once no call can still
   * write into it (reclamation.ts), else a fresh one.
   */
  allocate(key: number, queued = 0): number {
    const size = key >>> KIND_BITS
    // A handle maps a block through one chunk's view: a larger block would run past it (topic.ts MAX_SETTLE_WINDOW keeps windows below).
    if (size > SLOTS_PER_CHUNK) throw new Error(`internal: a block of ${size} slots does not fit a chunk of ${SLOTS_PER_CHUNK}`)
    // The retirements due were written by the room check (log-capacity.ts room), before the registration's room was measured: none here, after it.
    // `queued`: blocks of this key already taken from the queue's front for entries not published yet.
    if (this.#reusable(key, queued)) {
      const free = this.#free.get(key)!
      const slot = free.slots[free.head + queued]
      const c = Math.floor(slot / SLOTS_PER_CHUNK)
      const at = slot % SLOTS_PER_CHUNK
      for (let row = 0; row < this.#memory.rowCount(); row++) {
        this.#memory.rowChunk(row, c, false)?.fill(0, at, at + size)
      }
      return slot
    }
    // A fresh block, from its kind's chunks (nextCell). The registration asked fit() first.
    const control = this.#memory.control
    const next = nextCell(key)
    let slot = control[next]
    if (opensChunk(slot, size)) slot = control[C_SLOT_CHUNKS]++ * SLOTS_PER_CHUNK
    control[next] = slot + size
    control[C_SLOTS_RESERVED] += size
    return slot
  }

  /** Whether allocate(key, queued) takes a freed block: the one `queued` behind its queue's front, once no call can still write into it. */
  #reusable(key: number, queued: number): boolean {
    const free = this.#free.get(key)
    const front = free === undefined ? 0 : free.head + queued
    return free !== undefined && front < free.slots.length && this.#hasPassed(free.epochs[front])
  }

  /**
   * Whether blocks of `keys`, allocated one after another as a registration does (a key's second
   * block the one behind its first in the free queue: allocate(key, queued)), fit in the slot
   * chunks a surface can hand out (MAX_SLOT_CHUNKS). Changes nothing: a registration asks first,
   * so that one that does not fit registers nothing.
   */
  fit(keys: readonly number[]): boolean {
    const control = this.#memory.control
    const queued = new Map<number, number>() // key → freed blocks taken so far
    const next = new Map<number, number>() // next-slot cell → its value after the blocks so far
    let chunks = control[C_SLOT_CHUNKS]
    for (const key of keys) {
      const taken = queued.get(key) ?? 0
      if (this.#reusable(key, taken)) {
        queued.set(key, taken + 1)
        continue
      }
      const cell = nextCell(key)
      let slot = next.get(cell) ?? control[cell]
      if (opensChunk(slot, key >>> KIND_BITS)) slot = chunks++ * SLOTS_PER_CHUNK
      next.set(cell, slot + (key >>> KIND_BITS))
    }
    return chunks <= this.maxChunks
  }

  /** Whether `slot` is the block `queued` places behind the front of `key`'s free queue (allocate(key, queued) took it from there). */
  queuedAt(key: number, queued: number, slot: number): boolean {
    const queue = this.#free.get(key)
    return queue !== undefined && queue.slots[queue.head + queued] === slot
  }

  /** A block is in use again (a replayed registration): drop it from the free queue. */
  take(key: number, slot: number): void {
    // allocate() reuses the front of the queue; a fresh block is above every block ever freed.
    const free = this.#free.get(key)
    if (free !== undefined && free.head < free.slots.length && free.slots[free.head] === slot) {
      free.head++
      if (free.head >= 1024 && free.head * 2 >= free.slots.length) {
        free.slots.splice(0, free.head)
        free.epochs.splice(0, free.head)
        free.head = 0
      }
    }
  }

  /** A block freed at `epoch` (a replayed removal or retirement, or a checkpoint's Free entry): queued behind those freed before it. */
  release(key: number, slot: number, epoch: number): void {
    let free = this.#free.get(key)
    if (!free) this.#free.set(key, (free = { slots: [], epochs: [], head: 0 }))
    free.slots.push(slot)
    free.epochs.push(epoch)
  }

  /** The free queues by block key, oldest block first from each one's head (a checkpoint restates them). */
  queues(): IterableIterator<[number, FreeQueue]> {
    return this.#free.entries()
  }

  /** Every queue emptied: a checkpoint about to be replayed restates them. */
  clear(): void {
    this.#free.clear()
  }

  /** The freed blocks waiting for reuse, and the slots they hold. */
  freed(): { blocks: number; slots: number } {
    let blocks = 0
    let slots = 0
    for (const [key, queue] of this.#free) {
      blocks += queue.slots.length - queue.head
      slots += (key >>> KIND_BITS) * (queue.slots.length - queue.head)
    }
    return { blocks, slots }
  }
}
