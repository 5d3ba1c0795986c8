// The process-wide slot memory: arenas of fixed-size chunks that every thread of the process
// maps as its own external ArrayBuffer over the same bytes. Recording happens in JavaScript on
// those views (a plain Float64Array store costs 1–3 ns; an N-API call costs 10–25 ns on Node 20),
// so this file only allocates, maps and frees. No strings, no policy.
#include <napi.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "args.h"

namespace {

// Chunks are 64-byte aligned so that rows of different threads never share a cache line.
constexpr std::align_val_t kChunkAlignment{64};
// Bounds on what a caller may ask for: a chunk of 64 bytes to 1 GiB, and 2^24 chunks per arena.
constexpr double kMinChunkBytes = 64;
constexpr double kMaxChunkBytes = 1 << 30;
constexpr double kMaxChunks = 1 << 24;

struct Arena {
  size_t chunkBytes;
  std::vector<void*> chunks;  // guarded by gMutex; a chunk never moves once allocated
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
std::unordered_map<uint32_t, Arena*> gArenas;
uint32_t gNextId = 1;

void FreeArenaLocked(uint32_t id, Arena* arena) {
  for (void* chunk : arena->chunks) {
    if (chunk != nullptr) ::operator delete(chunk, kChunkAlignment);
  }
  delete arena;
  gArenas.erase(id);
}

struct ViewHint {
  uint32_t id;
};

void FinalizeView(Napi::Env, void*, ViewHint* hint) {
  std::lock_guard<std::mutex> lock(gMutex);
  auto it = gArenas.find(hint->id);
  if (it != gArenas.end()) {
    Arena* arena = it->second;
    // relaxed: the count is only compared under gMutex, which orders it.
    if (arena->views.fetch_sub(1, std::memory_order_relaxed) == 1 && arena->released) {
      FreeArenaLocked(hint->id, arena);
    }
  }
  delete hint;
}

Napi::Value ArenaCreate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint64_t chunkBytes;
  if (!args::Count(info, 1, "arenaCreate") || !args::Integer(info, 0, "arenaCreate", "chunkBytes", kMinChunkBytes, kMaxChunkBytes, &chunkBytes)) {
    return env.Undefined();
  }
  if (chunkBytes % 64 != 0) {
    Napi::RangeError::New(env, "arenaCreate: chunkBytes must be a multiple of 64").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  std::lock_guard<std::mutex> lock(gMutex);
  uint32_t id = gNextId++;
  Arena* arena = new Arena();
  arena->chunkBytes = chunkBytes;
  gArenas[id] = arena;
  return Napi::Number::New(env, id);
}

// arenaChunk(id, k) → an ArrayBuffer over chunk k, allocated (zeroed, 64-byte aligned so that
// rows of different threads never share a cache line) the first time any thread asks for it.
Napi::Value ArenaChunk(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint64_t id;
  uint64_t k;
  if (!args::Count(info, 2, "arenaChunk") || !args::Integer(info, 0, "arenaChunk", "id", 1, UINT32_MAX, &id) ||
      !args::Integer(info, 1, "arenaChunk", "k", 0, kMaxChunks - 1, &k)) {
    return env.Undefined();
  }
  void* data;
  size_t bytes;
  {
    std::lock_guard<std::mutex> lock(gMutex);
    auto it = gArenas.find(static_cast<uint32_t>(id));
    if (it == gArenas.end() || it->second->released) {
      // lib/backend.ts turns this code into a ClosedError, as the JS backend throws.
      Napi::Error error = Napi::Error::New(env, "mq-metrics: the surface's native arena was closed");
      error.Set("code", Napi::String::New(env, "SURFACE_CLOSED"));
      error.ThrowAsJavaScriptException();
      return env.Undefined();
    }
    Arena* arena = it->second;
    if (arena->chunks.size() <= k) arena->chunks.resize(k + 1, nullptr);
    if (arena->chunks[k] == nullptr) {
      void* chunk = ::operator new(arena->chunkBytes, kChunkAlignment, std::nothrow);
      if (chunk == nullptr) {
        Napi::Error::New(env, "mq-metrics: out of memory allocating a counter chunk").ThrowAsJavaScriptException();
        return env.Undefined();
      }
      std::memset(chunk, 0, arena->chunkBytes);
      arena->chunks[k] = chunk;
    }
    data = arena->chunks[k];
    bytes = arena->chunkBytes;
    arena->views.fetch_add(1, std::memory_order_relaxed);  // ordered by gMutex
  }
  // napi_create_external_arraybuffer fails when the calling thread's environment is shutting
  // down (a worker terminated while it maps a chunk). Napi::ArrayBuffer::New would then throw
  // into that environment, which node-addon-api turns into a fatal error that aborts the whole
  // process. Called directly: on failure the view that was counted is given back, and the worker
  // just stops (its termination is already under way).
  ViewHint* hint = new ViewHint{static_cast<uint32_t>(id)};
  napi_value buffer;
  napi_status status = napi_create_external_arraybuffer(
      env, data, bytes, [](napi_env e, void*, void* h) { FinalizeView(Napi::Env(e), nullptr, static_cast<ViewHint*>(h)); }, hint,
      &buffer);
  if (status != napi_ok) {
    FinalizeView(env, nullptr, hint);  // views − 1, and frees the arena if it was its last view
    return env.Undefined();
  }
  return Napi::Value(env, buffer);
}

// arenaRelease(id): the surface is closed. Memory goes when the last view is collected.
Napi::Value ArenaRelease(const Napi::CallbackInfo& info) {
  uint64_t wide;
  if (!args::Count(info, 1, "arenaRelease") || !args::Integer(info, 0, "arenaRelease", "id", 1, UINT32_MAX, &wide)) {
    return info.Env().Undefined();
  }
  uint32_t id = static_cast<uint32_t>(wide);
  std::lock_guard<std::mutex> lock(gMutex);
  auto it = gArenas.find(id);
  if (it != gArenas.end() && !it->second->released) {
    it->second->released = true;
    if (it->second->views.load(std::memory_order_relaxed) == 0) FreeArenaLocked(id, it->second);
  }
  return info.Env().Undefined();
}

}  // namespace

void InitArena(Napi::Env env, Napi::Object exports) {
  exports.Set("arenaCreate", Napi::Function::New(env, ArenaCreate));
  exports.Set("arenaChunk", Napi::Function::New(env, ArenaChunk));
  exports.Set("arenaRelease", Napi::Function::New(env, ArenaRelease));
}
