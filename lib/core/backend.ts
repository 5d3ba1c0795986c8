// The one place that loads the native addon and picks the backend (STYLE: the native/TS
// boundary). Both backends expose the same `Arena`: numbered fixed-size chunks of zeroed memory
// that every thread of the process can map. Nothing above this file knows which one it has.
import * as fs from 'node:fs'
import * as path from 'node:path'
import { ClosedError, ConfigError } from './errors'

export type BackendName = 'native' | 'js'

/** Bytes per chunk: 8,192 Float64 slots. Chunks are 64-byte aligned in both backends. */
export const CHUNK_BYTES = 65536

export interface Arena {
  readonly backend: BackendName
  /** The memory of chunk `k` (allocated and zeroed on first use by any thread). */
  chunk(k: number): ArrayBuffer | SharedArrayBuffer
  /** What a worker needs to map the same memory: structured-cloneable. */
  share(): SharedArena
  /** The surface is closed: the memory goes once no thread maps it any more. */
  release(): void
  /**
   * One Int32 cell every removal rings and every thread of the process waits on between its tasks
   * (reclamation.ts). Its own SharedArrayBuffer in both backends: the native core's memory is
   * not one, and only a SharedArrayBuffer's cells can be waited on.
   */
  readonly doorbell: Int32Array
}

export type SharedArena =
  | { backend: 'native'; id: number; doorbell: SharedArrayBuffer }
  | { backend: 'js'; buffer: SharedArrayBuffer; doorbell: SharedArrayBuffer }

interface NativeAddon {
  arenaCreate(chunkBytes: number): number
  arenaChunk(id: number, k: number): ArrayBuffer | undefined
  arenaRelease(id: number): void
  latencyQuantiles?(counts: Float64Array, offset: number): { p50: number; p90: number; p99: number; count: number } | null
  latencyBuckets?: number
}

let addon: NativeAddon | null | undefined
/** Where the addon came from, or why none loaded: what `backendReason()` says. */
let addonFrom = ''
let addonError = ''
let warned = false
/** An addon refused by the process itself (--no-addons, or the permission model): no build would help. */
let addonsDisabled = false
/** Where native/install.js writes why its build from source failed, under build/. */
const INSTALL_FAILURE = 'install-failure.txt'

const ROOT = path.join(__dirname, '..', '..') // the package: dist/core/ → ../..
const PLATFORM = `${process.platform}-${process.arch}`

/**
 * Where the addon is looked for, in order (docs/install.md): the prebuilt binary shipped in the
 * package for this platform and architecture (Node-API 8: one binary serves every Node.js from 20
 * on), then a build from source made by `npm install` (or `npm run build:native`).
 * MQ_METRICS_ADDON_PATH is a test hook, not a user setting: the tests point it at a missing file
 * to see a machine without the native core, or at the sanitizer build.
 */
function addonCandidates(env: NodeJS.ProcessEnv = process.env): { file: string; what: string; missing: string }[] {
  const override = env.MQ_METRICS_ADDON_PATH
  if (override !== undefined && override !== '') {
    return [{ file: path.resolve(override), what: 'MQ_METRICS_ADDON_PATH', missing: 'no file at MQ_METRICS_ADDON_PATH' }]
  }
  return [
    { file: path.join(ROOT, 'prebuilds', PLATFORM, 'mq_metrics.node'), what: `the prebuilt binary for ${PLATFORM}`, missing: `no prebuilt binary for ${PLATFORM}` },
    { file: path.join(ROOT, 'build', 'Release', 'mq_metrics.node'), what: 'the build from source', missing: 'not built from source' },
  ]
}

/**
 * Why the install script's build from source failed, as it wrote it beside the build
 * (native/install.js): npm's quiet install output hides the script's warning. '' when it left none.
 */
function installFailure(built: string): string {
  try {
    const reason = fs.readFileSync(path.join(path.dirname(built), '..', INSTALL_FAILURE), 'utf8').trim()
    return reason === '' ? '' : `: the build at install failed: ${reason.slice(0, 300)}`
  } catch {
    return ''
  }
}

/** The addon, or null when none loads (the reasons are kept for backendReason() and errors). */
export function loadAddon(): NativeAddon | null {
  if (addon === undefined) {
    addon = null
    const failures: string[] = []
    for (const { file, what, missing } of addonCandidates()) {
      try {
        addon = require(file) as NativeAddon
        addonFrom = `${what} (${path.relative(ROOT, file) || file})`
        break
      } catch (error) {
        const code = (error as { code?: unknown }).code
        if (code === 'ERR_DLOPEN_DISABLED') addonsDisabled = true
        failures.push(code === 'MODULE_NOT_FOUND' ? missing + installFailure(file) : `${what} does not load: ${(error as Error).message.split('\n')[0]}`)
      }
    }
    addonError = failures.join('; ')
  }
  return addon
}

/** design §1: MQ_METRICS_BACKEND=js|native forces a backend; anything else but empty (as unset) is a startup error. */
export function chooseBackend(env: NodeJS.ProcessEnv = process.env): BackendName {
  const forced = env.MQ_METRICS_BACKEND
  if (forced === undefined || forced === '') {
    if (loadAddon()) return 'native'
    if (!warned) {
      // One line at first use, on stderr, where npm's quiet install output cannot hide it.
      warned = true
      process.emitWarning(`mq-metrics: ${backendReason('js', env)}`, { code: 'MQ_METRICS_NO_NATIVE_CORE' })
    }
    return 'js'
  }
  if (forced === 'js') return 'js'
  if (forced === 'native') {
    if (!loadAddon()) {
      throw new ConfigError('MQ_METRICS_BACKEND', `is "native" but the native core is unavailable (${addonError}); see docs/install.md, or unset it`)
    }
    return 'native'
  }
  throw new ConfigError('MQ_METRICS_BACKEND', `must be "js" or "native", got ${JSON.stringify(forced)}`)
}

/** Which backend a surface runs on and why, in words a user can act on (surface.backendReason). */
export function backendReason(backend: BackendName, env: NodeJS.ProcessEnv = process.env): string {
  if (backend === 'native') {
    loadAddon()
    return `native core: ${addonFrom}`
  }
  if (env.MQ_METRICS_BACKEND === 'js') return 'TypeScript backend: chosen by MQ_METRICS_BACKEND=js'
  loadAddon()
  if (addonsDisabled) return `TypeScript backend: this process may not load native addons (node --no-addons, or the permission model without --allow-addons); allow them for the native core`
  return `TypeScript backend: no native core for ${PLATFORM} (${addonError}); to build it, reinstall with a C++ compiler, make and python3 present (see docs/install.md)`
}

export function createArena(backend: BackendName): Arena {
  if (backend === 'native') {
    const native = loadAddon()!
    return new NativeArena(native, native.arenaCreate(CHUNK_BYTES), new SharedArrayBuffer(4))
  }
  // One growable SharedArrayBuffer: growth is visible to every thread that holds it, so a worker
  // can add chunks that the main thread sees at once (Node 20 supports growable SABs). The
  // maximum is reserved address space only; pages are committed as the buffer grows.
  return new JsArena(new SharedArrayBuffer(CHUNK_BYTES, { maxByteLength: JS_ARENA_MAX_BYTES }), new SharedArrayBuffer(4))
}

export function attachArena(shared: SharedArena): Arena {
  if (shared.backend === 'native') {
    const native = loadAddon()
    if (!native) throw new Error(`mq-metrics: this surface uses the native core, which cannot load in this thread (${addonError})`)
    return new NativeArena(native, shared.id, shared.doorbell)
  }
  return new JsArena(shared.buffer, shared.doorbell)
}

/** 4 GiB of slots (512 Mi counters) per surface for the JS backend. */
const JS_ARENA_MAX_BYTES = 2 ** 32

class NativeArena implements Arena {
  readonly backend = 'native' as const
  readonly #addon: NativeAddon
  readonly #id: number
  readonly doorbell: Int32Array
  constructor(native: NativeAddon, id: number, doorbell: SharedArrayBuffer) {
    this.#addon = native
    this.#id = id
    this.doorbell = new Int32Array(doorbell, 0, 1)
  }
  chunk(k: number): ArrayBuffer {
    let buffer: ArrayBuffer | undefined
    try {
      buffer = this.#addon.arenaChunk(this.#id, k)
    } catch (error) {
      // The surface was closed before this thread mapped the chunk, or the id names no arena of this
      // process (native/arena.cc).
      const code = (error as { code?: unknown })?.code
      if (code === 'SURFACE_CLOSED') throw new ClosedError('this mq-metrics surface')
      if (code === 'ARENA_UNKNOWN') {
        throw new TypeError(`mq-metrics: no native arena of this process has id ${this.#id}: a share() is for the threads of the process that made it (was it made in another process, or altered?)`)
      }
      throw error
    }
    // undefined: the addon could not make the view because this thread is being terminated.
    if (buffer === undefined) throw new Error('mq-metrics: cannot map the counter memory: this thread is shutting down')
    return buffer
  }
  share(): SharedArena {
    return { backend: 'native', id: this.#id, doorbell: this.doorbell.buffer as SharedArrayBuffer }
  }
  release(): void {
    this.#addon.arenaRelease(this.#id)
  }
}

class JsArena implements Arena {
  readonly backend = 'js' as const
  readonly #buffer: SharedArrayBuffer
  readonly doorbell: Int32Array
  constructor(buffer: SharedArrayBuffer, doorbell: SharedArrayBuffer) {
    this.#buffer = buffer
    this.doorbell = new Int32Array(doorbell, 0, 1)
  }
  chunk(k: number): SharedArrayBuffer {
    const need = (k + 1) * CHUNK_BYTES
    if (this.#buffer.byteLength < need) {
      try {
        this.#buffer.grow(need)
      } catch (error) {
        // Another thread may have grown it past `need` in the meantime (growing a SAB to a
        // smaller size throws); only a real failure is an error.
        if (this.#buffer.byteLength < need) throw error
      }
    }
    // A chunk is addressed by its own views (see layout.ts); the buffer itself is the chunk source.
    return this.#buffer
  }
  share(): SharedArena {
    return { backend: 'js', buffer: this.#buffer, doorbell: this.doorbell.buffer as SharedArrayBuffer }
  }
  release(): void {
    // Garbage collected with the last thread that holds the buffer.
  }
}

/** Offset in bytes of chunk `k` inside the buffer `Arena.chunk(k)` returned. */
export function chunkOffset(arena: Arena, k: number): number {
  return arena.backend === 'js' ? k * CHUNK_BYTES : 0
}
