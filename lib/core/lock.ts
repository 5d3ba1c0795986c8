// The spin lock every cross-thread critical section takes (registration, a group's dispatch).
import type { ThreadState } from './threads'

/** What a lock waiter may ask about a holder: whether its thread is alive, gone, or unknown; and the time. */
export interface HolderCheck {
  holderState(tag: number): ThreadState
  now(): number
}

/**
 * A lock holder whose thread cannot be checked (no /proc, or a thread that had no row yet) is
 * evicted after holding the lock this long (a worker terminated mid-registration).
 */
export const LOCK_STEAL_MS = 5000
/**
 * The most one gap between two of a waiter's looks adds to a hold's time (they come every
 * ~0.05 ms): a longer gap is the process stopped as a whole (SIGSTOP, a paused VM), the holder
 * with it, or the waiter kept off the CPU; it is not time the holder had to let go.
 */
export const LOCK_GAP_MS = 100
/** How often a waiter asks whether the holder's thread still exists (a /proc read, ~20 µs). */
const HOLDER_CHECK_MS = 10
const sleeper = new Int32Array(new SharedArrayBuffer(4))
/**
 * A spin lock on one Int32 cell (0 = free, else the holder's tag). Critical sections are a few
 * hundred nanoseconds, so spinning beats parking; past that the waiter sleeps briefly. A holder
 * terminated inside its critical section (a worker killed with terminate()) never releases: when
 * `memory` can tell that the holder's thread is gone, the waiter takes the lock over at once. A
 * holder known to be alive is never evicted, however long it holds; one that cannot be checked is
 * evicted once one hold has lasted LOCK_STEAL_MS. A hold is told by the tag and the lock's hold
 * count, the Int32 cell `holds` (by default the one after the lock's), which every acquire() adds 1
 * to: a holder that lets go and takes the lock again between two of the waiter's tries shows the
 * same tag at both, but not the same count, and its clock starts again. Times are the waiter's
 * monotonic clock (performance.now() by default): a step of the wall clock evicts no one; nor does
 * a stop of the whole process (of a gap between two looks LOCK_GAP_MS counts at most).
 * Taking the lock over is safe: a registration or a removal publishes its work with one store (the
 * log's end; what a removal does after it, the next holder that catches up with the log does:
 * registry.ts); a group's call makes its writes after its last call, with no loop between
 * them (a terminated thread stops only at a call or at a loop's back edge), or records first what
 * its one loop of writes will do (W_PENDING). Returns true when it took the lock over: a group's
 * caller then finishes such a move on every partition of the group (window.ts finishWindows).
 */
export function acquire(cells: Int32Array, index: number, tag: number, memory?: HolderCheck, holds = index + 1): boolean {
  // The uncontended case in a body small enough for V8 to inline into every caller.
  const took = Atomics.compareExchange(cells, index, 0, tag) !== 0 && contend(cells, index, tag, memory, -1, holds)
  cells[holds] = (cells[holds] + 1) | 0 // written by the holder alone: a waiter needs only to see it change
  return took
}

/**
 * acquire() of a lock whose holder may hold it in slices (the registration lock, which a scrape
 * reads under: Observer.observeSliced): a waiter sets the Int32 cell `wanted` to 1 each time it
 * goes to sleep, so that the holder, between two slices, leaves it the lock.
 */
export function acquireWanted(cells: Int32Array, index: number, tag: number, memory: HolderCheck, wanted: number, holds: number): boolean {
  const took = Atomics.compareExchange(cells, index, 0, tag) !== 0 && contend(cells, index, tag, memory, wanted, holds)
  cells[holds] = (cells[holds] + 1) | 0
  return took
}

/**
 * acquire() when the lock was held: spin, then sleep briefly, taking it over from a dead holder.
 * true: taken over (the caller puts right what the holder may have left half done).
 */
function contend(cells: Int32Array, index: number, tag: number, memory: HolderCheck | undefined, wanted: number, holds: number): boolean {
  let spins = 0
  let seen = 0
  let seenHolds = 0
  let heldFor = 0 // the hold's time so far, as the waiter saw it (gaps capped at LOCK_GAP_MS)
  let lastAt = 0
  let checkedAt = 0
  let state: ThreadState = 'unknown'
  for (;;) {
    const owner = Atomics.compareExchange(cells, index, 0, tag)
    if (owner === 0) return false
    if (++spins < 200) continue
    const now = memory !== undefined ? memory.now() : performance.now()
    const count = Atomics.load(cells, holds)
    const gap = Math.min(Math.max(now - lastAt, 0), LOCK_GAP_MS)
    lastAt = now
    if (owner !== seen) {
      seen = owner
      seenHolds = count
      heldFor = 0
      checkedAt = now
      state = 'unknown'
    } else if (count !== seenHolds) {
      seenHolds = count // the same holder, another hold: its clock starts again
      heldFor = 0
    } else {
      heldFor += gap
      if (memory !== undefined && now - checkedAt >= HOLDER_CHECK_MS) {
        checkedAt = now
        state = memory.holderState(owner)
      }
      if (state === 'gone' || (state === 'unknown' && heldFor > LOCK_STEAL_MS)) {
        if (Atomics.compareExchange(cells, index, owner, tag) === owner) return true
      }
    }
    if (wanted >= 0) Atomics.store(cells, wanted, 1)
    Atomics.wait(sleeper, 0, 0, 0.05)
  }
}

/**
 * Frees the lock `tag` took. Only if it still holds it: a holder that was taken for gone (and
 * the lock taken over) must not free the lock for whoever holds it now.
 */
export function release(cells: Int32Array, index: number, tag: number): void {
  Atomics.compareExchange(cells, index, tag, 0)
}

