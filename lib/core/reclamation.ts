// When a removed topic's or group's slot blocks may be handed to a later registration: epochs
// announced by every thread between its tasks (quiescent-state-based reclamation). The argument
// is written out in docs/reclamation.md; in short:
//
// - A recording call is synchronous JavaScript: it checks its handle's liveness tag and then
//   writes, and nothing else of its thread runs in between. So a thread that is running a task
//   other than a recording call — in particular a timer callback — is inside no recording call.
// - A removal clears the liveness tags first, then advances the epoch (Atomics: every later read
//   of the epoch that sees the new value also sees the cleared tags). Its blocks wait for it.
// - Each thread announces, from an unref'd timer (so between its tasks), the epoch it reads. A
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

/** How often each thread announces the epoch it has seen (an unref'd timer). */
export const ANNOUNCE_MS = 10

/** What a thread announces when it will never record again (it exited). */
const DETACHED = 2n ** 62n

/**
 * Announces that this thread is between tasks: inside no recording call. Only ever called from a
 * timer callback, or at a point the caller proves quiescent (a removal by this thread).
 */
export function announce(memory: Memory): void {
  const row = memory.row
  if (row >= MAIN_ROW) Atomics.store(memory.wide, B_ANNOUNCE + row, Atomics.load(memory.wide, B_EPOCH))
}

/** This thread is exiting: it records nothing more, so it holds no reuse back. */
export function detach(memory: Memory): void {
  const row = memory.row
  if (row >= MAIN_ROW) Atomics.store(memory.wide, B_ANNOUNCE + row, DETACHED)
}

/**
 * Starts a new epoch for what the caller has just unlinked (its liveness tags already cleared)
 * and returns it: blocks freed now wait for every other thread to announce it. The caller holds
 * the registration lock and is itself between recording calls, so it announces at once.
 */
export function advanceEpoch(memory: Memory): number {
  const epoch = Atomics.add(memory.wide, B_EPOCH, 1n) + 1n
  announce(memory)
  return Number(epoch)
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

/** The memories this thread records into, by surface (attaching again to one surface adds nothing). */
const announcing = new Map<bigint, Memory>()
let announcer: NodeJS.Timeout | undefined

/**
 * Announces for `memory` from now on, every ANNOUNCE_MS, from one unref'd timer per thread, until
 * its surface is closed; in a worker, also detaches on the thread's exit.
 */
export function keepAnnouncing(memory: Memory): void {
  announcing.set(Atomics.load(memory.wide, B_SURFACE_ID), memory)
  if (announcer !== undefined) return
  announcer = setInterval(() => {
    for (const [id, each] of announcing) {
      if (each.control[C_CLOSED] === 1) announcing.delete(id)
      else announce(each)
    }
    if (announcing.size === 0) {
      clearInterval(announcer)
      announcer = undefined
    }
  }, ANNOUNCE_MS).unref()
  if (!isMainThread && !exitHooked) {
    exitHooked = true
    process.once('exit', () => {
      for (const each of announcing.values()) detach(each)
    })
  }
}
let exitHooked = false
