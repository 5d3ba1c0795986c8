// The registration log's encoding: entries of Int32 cells in arena chunks, one generation at a
// time. Every thread replays the same entries in the same order into its own picture of the
// registry (picture.ts). A compaction writes the live state as a checkpoint into the other of
// two directories and starts a new generation, so the log stays bounded by what is alive, not by
// what ever existed (docs/reclamation.md). Written and read only under the registration lock.
import { LOG_CHUNK_INTS } from './layout'
import { Memory } from './memory'

/** Entry types. Fields after the header; ids and epochs take two cells (high, low). */
export const enum Entry {
  /** The rest of this log chunk is unused. */
  Skip = 1,
  /** id(2), slot, name. */
  Topic = 2,
  /**
   * id(2), epoch(2), keep: the topic's blocks wait for the epoch (reclamation.ts). keep 1: another
   * live topic has its label, and the topic retires into the label's carry (TopicRetired) instead.
   */
  RemoveTopic = 3,
  /** topicId(2), partition, slot. */
  Partition = 4,
  /** topicId(2), groupId(2), slot, maxInFlight, window, name. */
  Group = 5,
  /** groupId(2), partition, slot. */
  Floor = 6,
  /** slot, amount(2): an amount moved out of a row cell that neared 2^53. */
  Fold = 7,
  /**
   * groupId(2), epoch(2), carries: the group is retiring; its counts still add to its topic's.
   * carries 1: another live group has its label, and its retries stay in the label's series.
   */
  RemoveGroup = 8,
  /**
   * topicId(2), groupId(2), delivered(2), dropped(2), dlq(2): a retiring group's final counts
   * move into its topic's retired totals and its blocks become free. groupId 0: totals only (a
   * checkpoint).
   */
  Retired = 9,
  /** key (the blocks' size and kind), then slot, epoch(2) per block: freed blocks, in their queue's order, as many as the chunk holds (checkpoints only). */
  Free = 10,
  /** The checkpoint at the start of a generation is complete. */
  CheckpointEnd = 11,
  /** groupId(2), partition, slot, header: a group's settlement window on a partition (its bits' block and its header's). */
  Window = 12,
  /**
   * topicId(2), kind (CarryKind), partition, amount(2), and for retries the group label: a share
   * of a removed topic or group added to the carry of the topic's label (carry.ts LabelCarry).
   * The topic is any of the label's, live or retiring.
   */
  Carry = 13,
  /** topicId(2): a topic retiring into its label's carry has retired (its Carry entries came first); its blocks become free. */
  TopicRetired = 14,
  /** topicId(2), partition…: partitions whose last_seq a retiring topic's label keeps (checkpoints only; TopicEntity.carriedPartitions). */
  Carries = 15,
}

/** What an Entry.Carry adds to. */
export const enum CarryKind {
  Produced = 0,
  Bytes = 1,
  Delivered = 2,
  Dropped = 3,
  Dlq = 4,
  /** The highest value wins (partition names which). */
  LastSeq = 5,
  /** The entry's text names the group label. */
  Retries = 6,
}

const TYPE_BITS = 4
const TYPE_MASK = (1 << TYPE_BITS) - 1

/**
 * The most an amount field of one log entry holds: its two cells are 64 bits. A larger amount (a
 * counter's folds summed in a checkpoint, a removed group's totals) is written as several
 * entries, which add up.
 */
const ENTRY_AMOUNT = 2n ** 62n

/** `amounts` as rows of parts, each part at most ENTRY_AMOUNT, the rows summing to `amounts` (the last row holds the rest). */
export function amountRows(amounts: readonly bigint[]): bigint[][] {
  const rest = [...amounts]
  const rows: bigint[][] = []
  while (rest.some((a) => a > ENTRY_AMOUNT)) rows.push(rest.map((a, i) => (a > ENTRY_AMOUNT ? ((rest[i] = a - ENTRY_AMOUNT), ENTRY_AMOUNT) : 0n)))
  rows.push(rest)
  return rows
}

/** A number below 2^64 as two cells: high and low 32 bits. */
export function wide(value: number | bigint): [number, number] {
  const big = BigInt(value)
  return [Number((big >> 32n) & 0xffffffffn) | 0, Number(big & 0xffffffffn) | 0]
}

/** The number two cells hold (a `number`: ids, epochs and slots stay far below 2^53). */
export function narrow(high: number, low: number): number {
  return (high >>> 0) * 2 ** 32 + (low >>> 0)
}

/** The amount two cells hold, exactly. */
export function wideAmount(high: number, low: number): bigint {
  return (BigInt(high >>> 0) << 32n) | BigInt(low >>> 0)
}

/** How many Int32 cells an entry of `fields` fields (and `text`) takes: its header, fields, text. */
export function entryLength(fields: number, text?: string): number {
  return 1 + fields + (text === undefined ? 0 : 1 + Math.ceil(text.length / 2))
}

/** Where entries of these `lengths`, written from `position` on, end (one that does not fit what is left of a chunk starts the next). */
export function endAfter(position: number, lengths: readonly number[]): number {
  for (const length of lengths) {
    const within = position % LOG_CHUNK_INTS
    position += (within + length > LOG_CHUNK_INTS ? LOG_CHUNK_INTS - within : 0) + length
  }
  return position
}

/** Where an entry was found: its chunk, its header's index there, its type and length. */
export interface EntryAt {
  log: Int32Array
  /** Index of the first field in `log`. */
  fields: number
  type: Entry
  /** The position after this entry. */
  next: number
}

export class RegistrationLog {
  readonly #memory: Memory

  constructor(memory: Memory) {
    this.#memory = memory
  }

  /**
   * Writes one entry of `generation` at `position` (not published: the caller stores the new end
   * in C_LOG_END). Returns the entry's own position (after a Skip, if it did not fit the chunk)
   * and the position after it.
   */
  write(generation: number, position: number, type: Entry, fields: readonly number[], text?: string): [number, number] {
    const length = entryLength(fields.length, text)
    if (length > LOG_CHUNK_INTS) throw new RangeError('mq-metrics: a registration log entry does not fit a chunk')
    let within = position % LOG_CHUNK_INTS
    if (within + length > LOG_CHUNK_INTS) {
      this.#chunk(generation, position, true)[within] = Entry.Skip
      position += LOG_CHUNK_INTS - within
      within = 0
    }
    const log = this.#chunk(generation, position, true)
    log[within] = type | (length << TYPE_BITS)
    for (let i = 0; i < fields.length; i++) log[within + 1 + i] = fields[i]
    if (text !== undefined) {
      let at = within + 1 + fields.length
      log[at++] = text.length
      for (let i = 0; i < text.length; i += 2) {
        log[at++] = text.charCodeAt(i) | ((i + 1 < text.length ? text.charCodeAt(i + 1) : 0) << 16)
      }
    }
    return [position, position + length]
  }

  /** The entry at `position` of `generation` (a Skip's `next` is the next chunk's start). */
  at(generation: number, position: number): EntryAt {
    const within = position % LOG_CHUNK_INTS
    const log = this.#chunk(generation, position, false)
    const type = (log[within] & TYPE_MASK) as Entry
    if (type === Entry.Skip) return { log, fields: within + 1, type, next: position + (LOG_CHUNK_INTS - within) }
    const length = log[within] >>> TYPE_BITS
    if (length < 1 || type > Entry.Carries || type < Entry.Skip) {
      throw new Error(`mq-metrics: corrupt registration log entry ${type} at ${position}`)
    }
    return { log, fields: within + 1, type, next: position + length }
  }

  #chunk(generation: number, position: number, create: boolean): Int32Array {
    const chunk = this.#memory.logChunk(generation, Math.floor(position / LOG_CHUNK_INTS), create)
    if (chunk === undefined) throw new Error(`mq-metrics: the registration log has no chunk at ${position}`)
    return chunk
  }
}

/** The text an entry holds at `at` (its length, then two UTF-16 units per cell). */
export function readText(log: Int32Array, at: number): string {
  const length = log[at]
  let text = ''
  for (let i = 0; i < length; i += 2) {
    const pair = log[at + 1 + i / 2]
    text += String.fromCharCode(pair & 0xffff)
    if (i + 1 < length) text += String.fromCharCode(pair >>> 16)
  }
  return text
}
