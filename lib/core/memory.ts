// Memory: one thread's view of the shared arena (lib/core/layout.ts) — its row, the chunks it has
// mapped, the registration lock and the row-owner table that lets rows of exited threads be reused.
import { Arena, CHUNK_BYTES, chunkOffset } from './backend'
import { acquireWanted, release } from './lock'
import { MAX_TID, ThreadIdentity, ThreadState, taskStat, threadIdentity, threadState } from './threads'
import {
  B_ANNOUNCE, B_EPOCH, B_NEXT_ID, B_SURFACE_ID, C_LOCK, C_LOCK_HOLDS, C_LOCK_WANTED, C_LOG_DIRECTORIES, C_NEXT_ANONYMOUS, C_NEXT_CHUNK, C_NEXT_ROW, C_RECOUNT, C_ROW_DIRECTORY,
  C_ROW_OWNERS, MAIN_ROW, MAX_LOG_CHUNKS, MAX_ROWS, SHARED_ROW, SLOTS_PER_CHUNK,
} from './layout'

let surfacesCreated = 0

export class Memory {
  readonly arena: Arena
  readonly control: Int32Array
  /** The control block as BigInt64 cells (B_*): the epoch, the next id, each row's announcement. */
  readonly wide: BigInt64Array
  readonly #f64 = new Map<number, Float64Array>()
  readonly #i32 = new Map<number, Int32Array>()
  readonly #i64 = new Map<number, BigInt64Array>()
  readonly #directories = new Map<number, Int32Array>()
  readonly #liveness: (tid: number, start: number) => ThreadState
  /** Milliseconds, for the lock's patience with a holder it cannot check (a test drives its own). */
  readonly now: () => number
  #lockDepth = 0
  #lockTag = 0
  #heldTag = 0 // the tag the registration lock was taken with (claimRow changes lockTag inside it)
  #row = 0

  /**
   * `liveness` answers whether a row owner still runs (read from /proc), `clock` what time it is;
   * a test stands in for either.
   */
  constructor(arena: Arena, fresh: boolean, liveness: (tid: number, start: number) => ThreadState = threadState, clock: () => number = () => performance.now()) {
    this.arena = arena
    this.#liveness = liveness
    this.now = clock
    this.control = new Int32Array(arena.chunk(0), chunkOffset(arena, 0), CHUNK_BYTES / 4)
    this.wide = new BigInt64Array(arena.chunk(0), chunkOffset(arena, 0), CHUNK_BYTES / 8)
    if (fresh) {
      this.control[C_NEXT_CHUNK] = 1
      this.control[C_NEXT_ROW] = MAIN_ROW
      this.wide[B_NEXT_ID] = 1n
      this.wide[B_EPOCH] = 1n
      this.wide[B_SURFACE_ID] = BigInt.asIntN(64, BigInt(Math.floor(Math.random() * 2 ** 52)) * 4096n + BigInt(++surfacesCreated % 4096))
    }
  }

  /**
   * Claims a row for the calling thread (each thread writes only its own row). Rows are reused:
   * a thread that attaches again gets the row it already has, and a row whose thread has exited
   * (returned, threw, called process.exit() or was terminated) goes to the next thread that
   * attaches. The new owner inherits the row's numbers and keeps adding to them, so the sums a
   * scrape reads stay exact and monotonic. Only when no row is free does a fresh one come.
   *
   * Which thread owns a row is its kernel identity (tid and start time, see threadIdentity), kept
   * in the row-owner table; whether that thread still exists is asked of /proc, since a thread
   * that is gone can no longer write. Without /proc (not Linux) no identity is known and every
   * attach takes a fresh row, as many as MAX_ROWS − 1 over the surface's life. `identity` is the
   * calling thread's (a parameter only so that tests can play several threads in one; null: none).
   */
  claimRow(identity: ThreadIdentity | null | undefined = threadIdentity()): number {
    const me = identity ?? undefined
    for (;;) {
      // The owner table is read and /proc asked without the lock (a scan over many live threads
      // takes milliseconds, and scrapes need the lock); a row found is taken only if its entry
      // still holds the very owner that was found gone — a thread that is gone stays gone.
      const found = me === undefined ? undefined : this.#reusableRow(me)
      this.lock()
      try {
        let row: number
        if (found !== undefined) {
          if (!isOwner(this.#owners(), found.row, found.owner)) continue // taken meanwhile: look again
          row = found.row
        } else {
          row = this.control[C_NEXT_ROW]
          if (row >= MAX_ROWS) {
            throw new RangeError(`mq-metrics: at most ${MAX_ROWS - 1} threads can record into one surface at a time${me === undefined ? ' (rows of exited threads are reused only on Linux)' : ''}`)
          }
          Atomics.store(this.control, C_NEXT_ROW, row + 1)
        }
        let generation = 0
        if (me !== undefined) {
          // A new owner moves the row's generation on, so that a lock tag of the previous owner
          // never names this one (see holderState). The main thread's row gets an owner too —
          // its lock tags can then be checked — but is never handed out (see #reusableRow).
          const owners = this.#owners()
          if (!isOwner(owners, row, me)) setOwner(owners, row, me)
          generation = generationOf(owners, row)
        }
        this.#lockTag = tagOf(row, generation)
        this.#row = row
        // A thread that claims a row now holds no handle resolved before now: it is past every
        // removal so far (reclamation.ts).
        Atomics.store(this.wide, B_ANNOUNCE + row, Atomics.load(this.wide, B_EPOCH))
        return row
      } finally {
        this.unlock()
      }
    }
  }

  /** A row this thread already owns, else one whose owner has exited; with that owner. */
  #reusableRow(me: ThreadIdentity): { row: number; owner: ThreadIdentity } | undefined {
    const k = Atomics.load(this.control, C_ROW_OWNERS)
    if (k === 0) return undefined
    const owners = this.chunkI32(k)
    const rows = Atomics.load(this.control, C_NEXT_ROW)
    // The main thread's row is never handed out: the surface itself records into it.
    for (let row = MAIN_ROW + 1; row < rows; row++) if (isOwner(owners, row, me)) return { row, owner: me }
    for (let row = MAIN_ROW + 1; row < rows; row++) {
      // Read once: the owner checked in /proc is the owner returned. (Reading the entry again
      // after the check could return a thread that claimed the row meanwhile — alive — which
      // the re-check under the lock would then confirm: two live threads in one row.)
      const owner = ownerOf(owners, row)
      if (owner !== undefined && this.#liveness(owner.tid, owner.start) === 'gone') return { row, owner }
    }
    return undefined
  }

  /** The row-owner table (allocated on first use). Caller holds the lock. */
  #owners(): Int32Array {
    let k = this.control[C_ROW_OWNERS]
    if (k === 0) {
      k = this.allocateChunk()
      this.arena.chunk(k)
      Atomics.store(this.control, C_ROW_OWNERS, k)
    }
    return this.chunkI32(k)
  }

  /** The row this thread claimed (0: none yet). */
  get row(): number {
    return this.#row
  }

  /**
   * Whether `row`'s owner has provably exited (/proc: its tid is gone, or reused by a thread that
   * started later). A row with no known owner, or one /proc cannot tell of, is not gone.
   */
  ownerGone(row: number): boolean {
    const k = Atomics.load(this.control, C_ROW_OWNERS)
    if (k === 0 || row <= SHARED_ROW || row >= MAX_ROWS) return false
    const owner = ownerOf(this.chunkI32(k), row)
    return owner !== undefined && this.#liveness(owner.tid, owner.start) === 'gone'
  }

  /** Rows ever claimed, the main thread's included (rows of exited threads are reused). */
  rowCount(): number {
    return Math.min(Atomics.load(this.control, C_NEXT_ROW), MAX_ROWS)
  }

  /** The registration lock: rare (new names, removals, chunk allocation), never on the hot path. */
  lock(): void {
    if (this.#lockDepth++ > 0) return
    this.#heldTag = this.lockTag
    // Taken over: the holder stopped inside a registration, perhaps between its log entry and a
    // shared count (entities.ts G_WINDOWED); the registry's next catch-up sets them all again.
    if (acquireWanted(this.control, C_LOCK, this.#heldTag, this, C_LOCK_WANTED, C_LOCK_HOLDS)) this.control[C_RECOUNT] = 1
  }

  /**
   * For a holder that reads in slices (Observer.observeSliced), right after unlock(): if a thread
   * went to sleep waiting for the registration lock since the flag was last cleared, waits (up to
   * `ms`) until some thread has taken it. A waiter sleeps ~0.05 ms between tries: a holder that
   * took the lock back at once would keep it from the waiter for the whole read.
   */
  letWaiterIn(ms: number): void {
    const control = this.control
    if (Atomics.load(control, C_LOCK_WANTED) === 0) return
    Atomics.store(control, C_LOCK_WANTED, 0)
    const until = performance.now() + ms
    while (Atomics.load(control, C_LOCK) === 0 && performance.now() < until);
  }

  /** The holder of the registration lock forgets who waited (letWaiterIn): a waiter still waiting sets the flag again. */
  clearWanted(): void {
    if (this.control[C_LOCK_WANTED] !== 0) Atomics.store(this.control, C_LOCK_WANTED, 0)
  }

  /** lock() if the registration lock is free now (or this thread holds it): false, not taken, otherwise. */
  tryLock(): boolean {
    if (this.#lockDepth > 0) return ++this.#lockDepth > 0
    const tag = this.lockTag
    if (Atomics.compareExchange(this.control, C_LOCK, 0, tag) !== 0) return false
    this.control[C_LOCK_HOLDS] = (this.control[C_LOCK_HOLDS] + 1) | 0 // a hold, as acquire() counts it (lock.ts)
    this.#heldTag = tag
    this.#lockDepth = 1
    return true
  }

  unlock(): void {
    if (--this.#lockDepth > 0) return
    release(this.control, C_LOCK, this.#heldTag)
  }

  /**
   * Whether the thread that took a lock with `tag` still runs. A row's tag names the row and the
   * generation of its owner entry at claim time; only that owner takes locks with it, and a row
   * changes owner (generation) only once its owner is gone. So an entry that moved on to another
   * generation, or that names an exited thread, proves the holder exited. A thread that has no
   * row yet locks with its tid, negated: no thread with that tid proves the holder gone (a worker
   * terminated inside attachSurface); a thread that has it may be the holder or a later one, so
   * that is 'unknown'. Also 'unknown': no owner entry, no /proc, or /proc could not say; the
   * waiter then falls back on time.
   */
  holderState(tag: number): ThreadState {
    if (tag < 0) return -tag <= MAX_TID && taskStat(-tag) === 'gone' ? 'gone' : 'unknown'
    const row = tagRow(tag)
    const k = Atomics.load(this.control, C_ROW_OWNERS)
    if (tag === 0 || row < MAIN_ROW || row >= MAX_ROWS || k === 0) return 'unknown'
    const owners = this.chunkI32(k)
    const generation = generationOf(owners, row)
    if (generation !== Math.floor(tag / TAG_ROWS)) return 'gone'
    const owner = ownerOf(owners, row)
    if (owner === undefined) return 'unknown'
    // Read before the entry moved on (a torn read of an entry being rewritten)? Then gone too.
    if (generationOf(owners, row) !== generation) return 'gone'
    return this.#liveness(owner.tid, owner.start)
  }

  /**
   * The tag a lock held by this thread carries: (row + 1) + generation × TAG_ROWS once it has a
   * row (at most 2^31 − 1: MAX_ROWS ≤ TAG_ROWS and 2^20 generations). Before that, −tid (Linux
   * tids are ≤ MAX_TID), which /proc can check; without /proc a negative number of its own below
   * −MAX_TID. Either way a waiter can tell one holder from the next (see acquire).
   */
  get lockTag(): number {
    if (this.#lockTag === 0) {
      const me = threadIdentity()
      this.#lockTag = me !== undefined && me.tid <= MAX_TID ? -me.tid : -MAX_TID - 1 - (Atomics.add(this.control, C_NEXT_ANONYMOUS, 1) & 0x3fffffff)
    }
    return this.#lockTag
  }

  #view<T>(cache: Map<number, T>, k: number, make: (buffer: ArrayBuffer | SharedArrayBuffer, offset: number) => T): T {
    let view = cache.get(k)
    if (view === undefined) {
      view = make(this.arena.chunk(k), chunkOffset(this.arena, k))
      cache.set(k, view)
    }
    return view
  }

  chunkF64(k: number): Float64Array {
    return this.#view(this.#f64, k, (b, o) => new Float64Array(b, o, SLOTS_PER_CHUNK))
  }
  chunkI32(k: number): Int32Array {
    return this.#view(this.#i32, k, (b, o) => new Int32Array(b, o, SLOTS_PER_CHUNK * 2))
  }
  chunkI64(k: number): BigInt64Array {
    return this.#view(this.#i64, k, (b, o) => new BigInt64Array(b, o, SLOTS_PER_CHUNK))
  }

  /** A fresh chunk index. Caller holds the lock. */
  allocateChunk(): number {
    const k = this.control[C_NEXT_CHUNK]
    this.control[C_NEXT_CHUNK] = k + 1
    return k
  }

  #directory(row: number, create: boolean): Int32Array | undefined {
    let directory = this.#directories.get(row)
    if (directory) return directory
    let k = Atomics.load(this.control, C_ROW_DIRECTORY + row)
    if (k === 0) {
      if (!create) return undefined
      this.lock()
      try {
        k = this.control[C_ROW_DIRECTORY + row]
        if (k === 0) {
          k = this.allocateChunk()
          this.arena.chunk(k)
          Atomics.store(this.control, C_ROW_DIRECTORY + row, k)
        }
      } finally {
        this.unlock()
      }
    }
    directory = this.chunkI32(k)
    this.#directories.set(row, directory)
    return directory
  }

  /** Row `row`'s chunk holding slot chunk `c`, allocating it when `create`; else undefined if absent. */
  rowChunk(row: number, c: number, create: boolean): Float64Array | undefined {
    const directory = this.#directory(row, create)
    if (directory === undefined) return undefined
    let k = Atomics.load(directory, c)
    if (k === 0) {
      if (!create) return undefined
      this.lock()
      try {
        k = directory[c]
        if (k === 0) {
          k = this.allocateChunk()
          this.arena.chunk(k)
          Atomics.store(directory, c, k)
        }
      } finally {
        this.unlock()
      }
    }
    return this.chunkF64(k)
  }

  /** The Int32 / BigInt64 views of the shared row's chunk `c` (for Atomics on shared cells). */
  sharedI32(c: number): Int32Array {
    this.rowChunk(SHARED_ROW, c, true)
    return this.chunkI32(Atomics.load(this.#directory(SHARED_ROW, true)!, c))
  }
  sharedI64(c: number): BigInt64Array {
    this.rowChunk(SHARED_ROW, c, true)
    return this.chunkI64(Atomics.load(this.#directory(SHARED_ROW, true)!, c))
  }

  /**
   * Chunk `i` of the registration log of `generation` (log.ts): the log lives in one of two
   * directories by the generation's parity, and a compaction writes the next generation into the
   * other one, reusing its chunks (allocated under the lock, kept for the surface's life).
   */
  logChunk(generation: number, i: number, create: boolean): Int32Array | undefined {
    if (i >= MAX_LOG_CHUNKS) throw new RangeError('mq-metrics: the registration log is full')
    const cell = C_LOG_DIRECTORIES + (generation & 1) * MAX_LOG_CHUNKS + i
    let k = Atomics.load(this.control, cell)
    if (k === 0) {
      if (!create) return undefined
      k = this.allocateChunk()
      this.arena.chunk(k)
      Atomics.store(this.control, cell, k)
    }
    return this.chunkI32(k)
  }
}

// Row owners.
// ticks since boot, field 22 of /proc/<tid>/stat), which no two threads with the same tid share.
const OWNER_INTS = 4 // per row: tid, start time low 32 bits, start time high bits, generation
/** Lock tags: row + 1 below TAG_ROWS, the owner entry's generation (mod GENERATIONS) above. */
const TAG_ROWS = 2048
const GENERATIONS = 2 ** 20
if (MAX_ROWS > TAG_ROWS || (TAG_ROWS * GENERATIONS) - 1 > 2 ** 31 - 1) throw new Error('internal: lock tags do not fit an Int32')

/** The lock tag of a row's owner in `generation` (see Memory.lockTag). */
function tagOf(row: number, generation: number): number {
  return row + 1 + generation * TAG_ROWS
}

/** The row a (positive) lock tag names. */
function tagRow(tag: number): number {
  return (tag % TAG_ROWS) - 1
}

/** A row's owner as recorded (undefined: none recorded, which counts as alive). */
function ownerOf(owners: Int32Array, row: number): ThreadIdentity | undefined {
  const at = row * OWNER_INTS
  return owners[at] === 0 ? undefined : { tid: owners[at], start: (owners[at + 1] >>> 0) + owners[at + 2] * 2 ** 32 }
}

/** How many times the row has changed owner (mod GENERATIONS); the tag of its owner's locks. */
function generationOf(owners: Int32Array, row: number): number {
  return Atomics.load(owners, row * OWNER_INTS + 3)
}

function isOwner(owners: Int32Array, row: number, thread: ThreadIdentity): boolean {
  const owner = ownerOf(owners, row)
  return owner !== undefined && owner.tid === thread.tid && owner.start === thread.start
}

/** A new owner for the row, in a new generation. Caller holds the lock. */
function setOwner(owners: Int32Array, row: number, me: ThreadIdentity): void {
  const at = row * OWNER_INTS
  // The generation moves first: a reader that sees the new tid also sees the new generation.
  Atomics.store(owners, at + 3, (owners[at + 3] + 1) % GENERATIONS)
  owners[at] = me.tid
  owners[at + 1] = me.start % 2 ** 32 | 0
  owners[at + 2] = Math.floor(me.start / 2 ** 32)
}
