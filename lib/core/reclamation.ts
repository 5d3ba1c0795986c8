// When a removed topic's or group's slot blocks may be handed to a later registration: epochs
// announced by every thread between its tasks (quiescent-state-based reclamation). The argument
// is written out in docs/reclamation.md; in short:
//
// - A recording call is synchronous JavaScript: it checks its handle's liveness tag and then
//   writes, and nothing else of its thread runs in between. So a thread that is running a task
//   other than a recording call — in particular a timer callback — is inside no recording call.
// - A removal is published with the epoch it is about to start; replaying it clears the liveness
//   tags; then the epoch advances (Atomics: every later read of the epoch that sees the new value
//   also sees the cleared tags). Its blocks wait for it. If its thread stopped after publishing it
//   (a worker terminated), the next thread that catches up with the log clears the tags and
//   advances the epoch for it (catchUpEpoch).
// - Each thread announces, from a callback of its event loop (so between its tasks), the epoch it
//   reads: woken by the removal that moved it (Atomics.waitAsync / Atomics.notify). A
//   thread that announced epoch ≥ E has finished every call it began before it read E, and every
//   call it begins afterwards reads the cleared tag and throws instead of writing.
// - So once every other thread with a row has announced ≥ E (or provably exited), no write into
//   the blocks freed at E can still come: they are zeroed and reused. No timing threshold is
//   involved: a thread that never returns to its event loop only holds reuse back (registrations
//   take fresh blocks meanwhile), it never lets a stale write through.
//
// Everything here lives in the shared control block as 64-bit cells (no wrap over a surface's
// life) and names rows, not thread ids: a row of a thread that exited is recognised from /proc,
// or from the announcement DETACHED its thread made on exit.
import { isMainThread } from 'node:worker_threads'
import { B_ANNOUNCE, B_EPOCH, B_SURFACE_ID, C_CLOSED, MAIN_ROW } from './layout'
import { Memory } from './memory'

/**
 * How long a thread waits for the doorbell before it announces anyway. A removal (or a close)
 * rings every waiting thread of the process at once; the timeout is the backstop, and what a
 * process mapping the same memory from outside would rely on (a notify does not cross
 * processes). Idle, a surface so costs one wake per second instead of a timer every few
 * milliseconds: a bare 10 ms interval costs ~16 ms of CPU per second on the 2-core machine of
 * docs/reliability.md, 1.6% of a core, and measurably the broker's (examples/aedes/bench.js).
 */
export const ANNOUNCE_WAIT_MS = 1000

/** What a thread announces when it will never record again (it exited). */
const DETACHED = 2n ** 62n

/**
 * Announces that this thread is between tasks: inside no recording call. Only ever called from a
 * callback of watch() (or keepAnnouncing(), by a constructor or an attach), or at a point the
 * caller proves quiescent (a removal by this thread).
 */
export function announce(memory: Memory): void {
  const row = memory.row
  if (row >= MAIN_ROW) Atomics.store(memory.wide, B_ANNOUNCE + row, Atomics.load(memory.wide, B_EPOCH))
}

/** Wakes every thread of this process that waits in watch(): the epoch moved, or the surface closed. */
export function ring(memory: Memory): void {
  Atomics.add(memory.arena.doorbell, 0, 1)
  Atomics.notify(memory.arena.doorbell, 0)
}

/** This thread is exiting: it records nothing more, so it holds no reuse back. */
export function detach(memory: Memory): void {
  const row = memory.row
  if (row >= MAIN_ROW) Atomics.store(memory.wide, B_ANNOUNCE + row, DETACHED)
}

/**
 * Starts the epoch `expected` (nextEpoch()) of the removal the caller has just published (its
 * replay cleared the liveness tags): blocks freed by it wait for every other thread to announce
 * that epoch. The caller holds the registration lock and is itself between recording calls, so it
 * announces at once — for every row this thread records into on that surface (an attachSurface()
 * on the main thread beside the surface has one of its own).
 */
export function advanceEpoch(memory: Memory, expected: number): void {
  // Moved only from the epoch the removal was published against: nothing else moves it under the lock.
  const before = Atomics.compareExchange(memory.wide, B_EPOCH, BigInt(expected - 1), BigInt(expected))
  if (before !== BigInt(expected - 1)) throw new Error(`internal: the epoch was ${before} when a removal published with epoch ${expected} went to start it: moved outside the registration lock`)
  announce(memory)
  const surface = `${Atomics.load(memory.wide, B_SURFACE_ID)}/`
  for (const [id, each] of announcing) if (each !== memory && id.startsWith(surface)) announce(each)
  ring(memory)
}

/** The epoch the next removal starts: it publishes it before advanceEpoch() moves there. Caller holds the registration lock. */
export function nextEpoch(memory: Memory): number {
  return Number(Atomics.load(memory.wide, B_EPOCH)) + 1
}

/**
 * A removal published with epoch `owed` whose thread stopped before it advanced there (a worker
 * terminated): the caller, having replayed it (its tags are cleared), moves the epoch on and rings.
 * It does not announce for its own thread, which may be inside a recording call (one that
 * registers a partition). Caller holds the registration lock.
 */
export function catchUpEpoch(memory: Memory, owed: number): void {
  for (;;) {
    const now = Atomics.load(memory.wide, B_EPOCH)
    if (now >= BigInt(owed)) return // never moved back
    if (Atomics.compareExchange(memory.wide, B_EPOCH, now, BigInt(owed)) === now) break
  }
  ring(memory)
}

/**
 * The lowest epoch every thread but the caller has announced: blocks freed at or below it can no
 * longer be written by a call that began before their removal. With `askProc`, a lagging row
 * whose owner has provably exited is marked DETACHED on the way (under the registration lock,
 * which claimRow also takes, so the row cannot change owner meanwhile). Caller holds the lock.
 */
export function passedEpoch(memory: Memory, askProc: boolean): number {
  const wide = memory.wide
  let lowest = Atomics.load(wide, B_EPOCH)
  for (let row = MAIN_ROW; row < memory.rowCount(); row++) {
    if (row === memory.row) continue
    const announced = Atomics.load(wide, B_ANNOUNCE + row)
    if (announced >= lowest) continue
    if (askProc && memory.ownerGone(row)) {
      Atomics.store(wide, B_ANNOUNCE + row, DETACHED)
      continue
    }
    lowest = announced
  }
  return Number(lowest)
}

/**
 * The memories this thread records into, by surface and row: attaching again to one surface from
 * a worker (the same row) adds nothing; attachSurface() on the main thread beside the surface
 * claims a row of its own, which must announce too (else no freed block is ever reused again).
 */
const announcing = new Map<string, Memory>()

/**
 * Announces for `memory` from now on, each time the epoch moves, until its surface is closed; in
 * a worker, also detaches on the thread's exit. The caller has claimed the memory's row.
 */
export function keepAnnouncing(memory: Memory): void {
  const id = `${Atomics.load(memory.wide, B_SURFACE_ID)}/${memory.row}`
  if (announcing.has(id)) return
  announcing.set(id, memory)
  watch(id, memory) // keepAnnouncing() is called by a constructor or an attach: between recording calls
  if (!isMainThread && !exitHooked) {
    exitHooked = true
    process.once('exit', () => {
      for (const each of announcing.values()) detach(each)
    })
  }
}
let exitHooked = false

/**
 * Announces, then waits — without holding the event loop open — for the next removal to ring the
 * arena's doorbell, and does it again from the callback the wait resolves in (a task of its own:
 * between recording calls). The doorbell is read before the announcement: a removal that moves
 * the epoch after the announcement read it rings after that too, so the wait ends at once and
 * no removal goes unannounced.
 */
function watch(id: string, memory: Memory): void {
  const doorbell = memory.arena.doorbell
  for (;;) {
    if (memory.control[C_CLOSED] === 1) {
      announcing.delete(id)
      return
    }
    const rung = Atomics.load(doorbell, 0)
    announce(memory)
    const wait = Atomics.waitAsync(doorbell, 0, rung, ANNOUNCE_WAIT_MS)
    if (wait.async) {
      wait.value.then(() => watch(id, memory))
      return
    }
  }
}
