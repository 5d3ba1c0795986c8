// The process-wide slot memory: arenas of fixed-size chunks that every thread of the process
// maps as its own external ArrayBuffer over the same bytes. Recording happens in JavaScript on
// those views (a plain Float64Array store costs 1–3 ns; an N-API call costs 10–25 ns on Node 20),
// so this file only allocates, maps and frees. No strings, no policy.
#include <node_api.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#ifdef _WIN32
#include <malloc.h>  // _aligned_malloc
#endif

#include "args.h"

namespace {

// Chunks are 64-byte aligned so that rows of different threads never share a cache line.
constexpr size_t kChunkAlignment = 64;
// Bounds on what a caller may ask for: a chunk of 64 bytes to 1 GiB, and 2^24 chunks per arena.
constexpr double kMinChunkBytes = 64;
constexpr double kMaxChunkBytes = 1 << 30;
constexpr double kMaxChunks = 1 << 24;

// No standard containers here: their allocator calls std::__throw_bad_array_new_length, which
// g++ 11 and later take from libstdc++'s GLIBCXX_3.4.29, and the prebuilt binary must load beside
// the older libstdc++ of every distribution the official Node.js binaries run on (docs/install.md).
// Chunks come from aligned_alloc, not the aligned operator new (CXXABI_1.3.11), for the same reason.
// aligned_alloc is C++17 but not in MSVC's runtime, which has its own pair.
void* AllocateChunk(size_t bytes) {
#ifdef _WIN32
  return _aligned_malloc(bytes, kChunkAlignment);
#else
  return std::aligned_alloc(kChunkAlignment, bytes);
#endif
}

void FreeChunk(void* chunk) {
#ifdef _WIN32
  _aligned_free(chunk);
#else
  std::free(chunk);
#endif
}

struct Arena {
  uint32_t id;
  Arena* next;  // the list of arenas (gArenas), guarded by gMutex
  size_t chunkBytes;
  // Guarded by gMutex: the chunk table (grown with realloc) and its length. A chunk itself never
  // moves once allocated; only the table of pointers to chunks does.
  void** chunks = nullptr;
  size_t capacity = 0;
  // Live external ArrayBuffers over this arena, across every thread. The memory is freed only
  // when the surface released the arena *and* no view is left, so a worker that still holds a
  // view can never touch freed memory.
  std::atomic<int64_t> views{0};
  bool released = false;  // guarded by gMutex
};

// The one piece of global mutable state (STYLE: the process-wide slot table). Registration of
// chunks is rare (once per 64 KiB of slots per thread), so a mutex is fine here; the hot path
// never comes near it.
std::mutex gMutex;
Arena* gArenas = nullptr;  // one per surface not yet freed: a few at a time, so a list
uint32_t gNextId = 1;

Arena* FindLocked(uint32_t id) {
  for (Arena* arena = gArenas; arena != nullptr; arena = arena->next) {
    if (arena->id == id) return arena;
  }
  return nullptr;
}

void FreeArenaLocked(Arena* arena) {
  for (size_t k = 0; k < arena->capacity; k++) {
    FreeChunk(arena->chunks[k]);
  }
  std::free(arena->chunks);
  for (Arena** link = &gArenas; *link != nullptr; link = &(*link)->next) {
    if (*link == arena) {
      *link = arena->next;
      break;
    }
  }
  delete arena;
}

struct ViewHint {
  uint32_t id;
};

void FinalizeView(ViewHint* hint) {
  std::lock_guard<std::mutex> lock(gMutex);
  Arena* arena = FindLocked(hint->id);
  if (arena != nullptr) {
    // relaxed: the count is only compared under gMutex, which orders it.
    if (arena->views.fetch_sub(1, std::memory_order_relaxed) == 1 && arena->released) FreeArenaLocked(arena);
  }
  delete hint;
}

napi_value ArenaCreate(napi_env env, napi_callback_info info) {
  args::Call call;
  uint64_t chunkBytes;
  if (!args::Read(env, info, &call) || !args::Count(call, 1, "arenaCreate") ||
      !args::Integer(call, 0, "arenaCreate", "chunkBytes", kMinChunkBytes, kMaxChunkBytes, &chunkBytes)) {
    return args::Undefined(env);
  }
  if (chunkBytes % 64 != 0) {
    napi_throw_range_error(env, nullptr, "arenaCreate: chunkBytes must be a multiple of 64");
    return args::Undefined(env);
  }
  Arena* arena = new (std::nothrow) Arena();
  if (arena == nullptr) {
    napi_throw_error(env, nullptr, "mq-metrics: out of memory creating an arena");
    return args::Undefined(env);
  }
  arena->chunkBytes = chunkBytes;
  uint32_t id;
  {
    std::lock_guard<std::mutex> lock(gMutex);
    id = gNextId++;
    arena->id = id;
    arena->next = gArenas;
    gArenas = arena;
  }
  napi_value result;
  napi_create_uint32(env, id, &result);
  return result;
}

// arenaChunk(id, k) → an ArrayBuffer over chunk k, allocated (zeroed, 64-byte aligned so that
// rows of different threads never share a cache line) the first time any thread asks for it.
napi_value ArenaChunk(napi_env env, napi_callback_info info) {
  args::Call call;
  uint64_t id;
  uint64_t k;
  if (!args::Read(env, info, &call) || !args::Count(call, 2, "arenaChunk") || !args::Integer(call, 0, "arenaChunk", "id", 1, UINT32_MAX, &id) ||
      !args::Integer(call, 1, "arenaChunk", "k", 0, kMaxChunks - 1, &k)) {
    return args::Undefined(env);
  }
  void* data;
  size_t bytes;
  {
    std::lock_guard<std::mutex> lock(gMutex);
    Arena* arena = FindLocked(static_cast<uint32_t>(id));
    if (arena == nullptr && id >= gNextId) {
      // No arena of this process ever had this id (ids are never reused): the share was made in
      // another process, or altered. lib/core/backend.ts turns this code into a TypeError.
      napi_throw_error(env, "ARENA_UNKNOWN", "mq-metrics: no native arena of this process has this id");
      return args::Undefined(env);
    }
    if (arena == nullptr || arena->released) {
      // lib/core/backend.ts turns this code into a ClosedError, as the JS backend throws.
      napi_throw_error(env, "SURFACE_CLOSED", "mq-metrics: the surface's native arena was closed");
      return args::Undefined(env);
    }
    if (arena->capacity <= k) {
      size_t capacity = arena->capacity == 0 ? 64 : arena->capacity;
      while (capacity <= k) capacity *= 2;  // k < kMaxChunks = 2^24: at most 2^24 entries
      void** grown = static_cast<void**>(std::realloc(arena->chunks, capacity * sizeof(void*)));
      if (grown == nullptr) {
        napi_throw_error(env, nullptr, "mq-metrics: out of memory growing the chunk table");
        return args::Undefined(env);
      }
      std::memset(grown + arena->capacity, 0, (capacity - arena->capacity) * sizeof(void*));
      arena->chunks = grown;
      arena->capacity = capacity;
    }
    if (arena->chunks[k] == nullptr) {
      void* chunk = AllocateChunk(arena->chunkBytes);  // chunkBytes: a multiple of 64 (arenaCreate)
      if (chunk == nullptr) {
        napi_throw_error(env, nullptr, "mq-metrics: out of memory allocating a counter chunk");
        return args::Undefined(env);
      }
      std::memset(chunk, 0, arena->chunkBytes);
      arena->chunks[k] = chunk;
    }
    data = arena->chunks[k];
    bytes = arena->chunkBytes;
    arena->views.fetch_add(1, std::memory_order_relaxed);  // ordered by gMutex
  }
  // napi_create_external_arraybuffer fails when the calling thread's environment is shutting
  // down (a worker terminated while it maps a chunk). Nothing may be thrown into that
  // environment then: the view that was counted is given back, and the worker just stops (its
  // termination is already under way).
  ViewHint* hint = new (std::nothrow) ViewHint{static_cast<uint32_t>(id)};
  napi_value buffer;
  napi_status status = hint == nullptr ? napi_generic_failure
                                       : napi_create_external_arraybuffer(
                                             env, data, bytes, [](napi_env, void*, void* h) { FinalizeView(static_cast<ViewHint*>(h)); }, hint, &buffer);
  if (status != napi_ok) {
    if (hint != nullptr) {
      FinalizeView(hint);  // views − 1, and frees the arena if it was its last view
    } else {
      std::lock_guard<std::mutex> lock(gMutex);
      Arena* arena = FindLocked(static_cast<uint32_t>(id));
      if (arena != nullptr) arena->views.fetch_sub(1, std::memory_order_relaxed);
    }
    return args::Undefined(env);
  }
  return buffer;
}

// arenaRelease(id): the surface is closed. Memory goes when the last view is collected.
napi_value ArenaRelease(napi_env env, napi_callback_info info) {
  args::Call call;
  uint64_t wide;
  if (!args::Read(env, info, &call) || !args::Count(call, 1, "arenaRelease") || !args::Integer(call, 0, "arenaRelease", "id", 1, UINT32_MAX, &wide)) {
    return args::Undefined(env);
  }
  uint32_t id = static_cast<uint32_t>(wide);
  std::lock_guard<std::mutex> lock(gMutex);
  Arena* arena = FindLocked(id);
  if (arena != nullptr && !arena->released) {
    arena->released = true;
    if (arena->views.load(std::memory_order_relaxed) == 0) FreeArenaLocked(arena);
  }
  return args::Undefined(env);
}

}  // namespace

bool InitArena(napi_env env, napi_value exports) {
  return args::Export(env, exports, "arenaCreate", ArenaCreate) && args::Export(env, exports, "arenaChunk", ArenaChunk) &&
         args::Export(env, exports, "arenaRelease", ArenaRelease);
}
