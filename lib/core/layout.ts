// The layout of the shared memory: where every thread finds the same cells.
//
// Counters live in per-thread *rows*: thread r writes only row r (single writer, a plain
// Float64Array store) and the reader sums the rows at scrape time. `Atomics.add` on a
// BigUint64Array costs several times a plain store, and two threads incrementing cells 8 bytes
// apart lose their scaling to false sharing, while per-thread rows in separate 64 KiB chunks scale
// with the threads (bench/workers.js). Row 0 is not a thread: it holds the few *shared* cells that
// need a read-modify-write across threads (in_flight, the dlq credit, the last_seq hint, a topic's
// liveness tag), updated with Atomics where the contract needs an exact bound.
//
// Chunk 0 is the control block (Int32 cells and a few BigInt64 cells, below). Every other chunk is
// 8,192 Float64 slots. A slot id names the same cell in every row; row r's slots
// [c·8192, (c+1)·8192) live in the chunk that row r's directory names at index c (allocated the
// first time row r needs it). Every reference in shared memory is a chunk index or a cell index,
// never a pointer, so another process could map the same chunks.
import { CHUNK_BYTES } from './backend'

export const SLOTS_PER_CHUNK = CHUNK_BYTES / 8
export const SHARED_ROW = 0
export const MAIN_ROW = 1
export const MAX_ROWS = 1024
export const DIRECTORY_ENTRIES = CHUNK_BYTES / 4

// Control block cells (Int32 indices into chunk 0).
export const C_LOCK = 0 // 0 free, else the holder's lock tag (see lockTag)
export const C_NEXT_CHUNK = 1 // next arena chunk to hand out
export const C_NEXT_ROW = 2 // next thread row to claim
export const C_NEXT_SLOT = 3 // next never-used slot id of the chunk blocks are handed out from (blocks.ts Blocks.allocate)
export const C_QUORUM = 4 // design §6: the one copy of the quorum tier (0, 1, 2)
export const C_LOG_END = 5 // published end of the registration log, in Int32 units
export const C_LOG_GENERATION = 6 // bumped by every compaction of the log (see log.ts)
export const C_LOG_CHECKPOINT = 7 // length of the current generation's checkpoint, in Int32 units
export const C_ROW_OWNERS = 8 // arena chunk of the row-owner table (0 = none yet; see claimRow)
export const C_NEXT_ANONYMOUS = 9 // lock tags of threads with no row and no known tid (see lockTag)
export const C_CLOSED = 10 // 1 once the surface is closed (Registry.close): nothing records or registers after it
export const C_FAULT_CHANNEL = 11 // arena chunk of the worker fault channel (0 = none yet; see worker-faults.ts)
export const C_RECOUNT = 12 // 1 once a registration may have left a shared count behind (its lock taken over from a stopped holder, or it threw): the registry's next catch-up sets every one again (entities.ts G_WINDOWED)
export const C_LOCK_WANTED = 13 // 1 once a thread waiting for the registration lock went to sleep: a holder reading in slices lets it in (Memory.letWaiterIn)
export const C_NEXT_WINDOW_SLOT = 14 // next never-used slot id of the chunk settlement windows are handed out from (0: none yet): a chunk of windows holds nothing else, so no thread row of it is ever made
export const C_SLOT_CHUNKS = 15 // slot chunks handed out so far (to blocks and to windows): the next one is that index
export const C_SLOTS_RESERVED = 22 // slots ever handed out (arenaUsage().slotsReserved)
export const C_NEXT_HEADER_SLOT = 23 // as C_NEXT_WINDOW_SLOT, for the windows' headers (chunks of headers only)
export const C_LOCK_HOLDS = 24 // the registration lock's hold count (lock.ts acquire): a waiter tells a holder that holds again and again from one that never lets go
export const C_ROW_DIRECTORY = 64 // [MAX_ROWS]: chunk holding row r's directory, 0 = none yet
// BigInt64 cells (indices into the same chunk viewed as a BigInt64Array): numbers that must never
// wrap over a surface's life.
export const B_EPOCH = 8 // the reclamation epoch (reclamation.ts), Int32 cells 16–17
export const B_NEXT_ID = 9 // next topic / group id: ids are never reused, Int32 cells 18–19
export const B_SURFACE_ID = 10 // a random id of the surface, Int32 cells 20–21 (reclamation.ts keeps one announcer per surface and thread)
export const B_ANNOUNCE = (C_ROW_DIRECTORY + MAX_ROWS) / 2 // [MAX_ROWS]: the epoch each row last announced
export const C_LOG_DIRECTORIES = C_ROW_DIRECTORY + MAX_ROWS + 2 * MAX_ROWS // two [MAX_LOG_CHUNKS]: the log's chunks, by generation parity
export const MAX_LOG_CHUNKS = Math.floor((DIRECTORY_ENTRIES - C_LOG_DIRECTORIES) / 2)
export const LOG_CHUNK_INTS = CHUNK_BYTES / 4
