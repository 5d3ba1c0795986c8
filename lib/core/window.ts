// A group's settlement window on one partition (docs/design.md §4): two bit arrays of `window` bits
// each, in flight then settled, seq s at bit `s mod window`, and a header in a block of its own
// (entities.ts W_*).
// Only the group's lock holder reads or writes it.
import { Chunk } from './checks'
import { GroupEntity, W_BASE, W_PENDING, W_SETTLED } from './entities'
import { SHARED_ROW } from './layout'
import type { Memory } from './memory'

function popcount(word: number): number {
  let v = word - ((word >>> 1) & 0x55555555)
  v = (v & 0x33333333) + ((v >>> 2) & 0x33333333)
  return (Math.imul((v + (v >>> 4)) & 0x0f0f0f0f, 0x01010101) >>> 24)
}

/**
 * Clears both bits of `count` seqs (at most the window) from bit `at` on: the seqs a floor move
 * passes over, whose bits stand for seqs a window further on from now.
 */
export function clearPassed(bits: Int32Array, first: number, window: number, at: number, count: number): void {
  const words = window >>> 5
  for (let n = Math.min(count, window); n > 0; n--, at = at + 1 === window ? 0 : at + 1) {
    const keep = ~(1 << (at & 31))
    bits[first + (at >>> 5)] &= keep
    bits[first + words + (at >>> 5)] &= keep
  }
}

/**
 * Finishes a floor move a holder recorded (W_PENDING) but did not live to complete: the bits of
 * the seqs the floor passes over are cleared, the settled seqs above the new floor counted again,
 * the floor moved and its hint (`hints[hintAt]`, if the caller knows it) raised. Idempotent, so a
 * thread stopped inside it leaves it to the next holder. The caller holds the group's lock.
 */
export function finishFloorMove(headers: Float64Array, header: number, bits: Int32Array, first: number, window: number, hints?: Float64Array, hintAt = 0): void {
  const pending = headers[header + W_PENDING]
  if (pending === 0) return
  const floor = headers[header + W_BASE] - 1
  const to = pending - 1
  const words = window >>> 5
  clearPassed(bits, first, window, (floor + 1) % window, to - floor)
  let settled = 0
  for (let w = first + words; w < first + 2 * words; w++) settled += popcount(bits[w])
  headers[header + W_SETTLED] = settled
  headers[header + W_BASE] = to + 1
  headers[header + W_PENDING] = 0
  if (hints !== undefined && to > hints[hintAt]) hints[hintAt] = to
}

/**
 * Every floor move of `group` left pending, on any partition, finished: by whoever took the
 * group's lock over from a thread that is gone (group.ts; a scrape's reader, reader.ts). Caller
 * holds the lock.
 */
export function finishWindows(memory: Memory, group: GroupEntity): void {
  const shared = (c: number) => memory.rowChunk(SHARED_ROW, c, true)!
  for (let w = 0; w < group.windowSlots.length; w++) {
    const slot = group.windowSlots[w]
    const header = group.windowHeaders[w]
    const floorSlot = group.floorSlot(group.windowPartitions[w])
    const hints = floorSlot === undefined ? undefined : shared(floorSlot >>> Chunk.Shift)
    finishFloorMove(shared(header >>> Chunk.Shift), header & Chunk.Mask, memory.sharedI32(slot >>> Chunk.Shift), (slot & Chunk.Mask) * 2, group.window, hints, floorSlot === undefined ? 0 : floorSlot & Chunk.Mask)
  }
}
