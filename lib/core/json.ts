// JSON for /stats and /healthz with exact integers: a `bigint` is written as its bare decimal
// digits (JSON numbers have no size limit; JavaScript's JSON.stringify refuses bigint).
import { randomBytes } from 'node:crypto'

export function toJSON(value: unknown, indent = 0): string {
  if (indent === 0) {
    // Most answers hold no bigint: JSON.stringify alone is twice as fast as with the replacer,
    // and refuses a bigint with a TypeError (V8's only TypeError here but a cycle, which the
    // replacer meets again).
    try {
      return JSON.stringify(value)
    } catch (error) {
      if (!(error instanceof TypeError)) throw error
    }
  }
  return JSON.stringify(value, replaceBigInt, indent).replace(BIGINT_MARK, '$1')
}

// A bigint becomes a marked string during stringify, then the marks (and quotes) are removed. A
// string of the broker's (a raw name) may hold any characters, so the mark carries 64 random bits
// drawn when the process loads this file, which no caller sees: a name cannot forge it.
const NONCE = randomBytes(8).toString('hex')
const MARK = `\u0000bigint:${NONCE}:`
const BIGINT_MARK = new RegExp(`"\\\\u0000bigint:${NONCE}:(-?\\d+)"`, 'g')

function replaceBigInt(_key: string, value: unknown): unknown {
  return typeof value === 'bigint' ? MARK + value.toString() : value
}

/**
 * A JSON text in parts, in order, sent as they are (a large body is not copied into one buffer:
 * on a fresh allocation that costs about a millisecond per megabyte, all of it at once).
 */
export class JsonChunks {
  readonly length: number
  constructor(readonly parts: readonly Buffer[]) {
    let length = 0
    for (const part of parts) length += part.length
    this.length = length
  }
}

/** What a chunk of JsonChunks holds at most, and the least a part of other memory must be to be sent as it is (not copied). */
const CHUNK_BYTES = 64 * 1024
const VIEW_MIN_BYTES = 16 * 1024

/**
 * Builds JsonChunks from text and from parts of buffers written already: small pieces are copied
 * into chunks of at most 64 KiB (one allocation each), large parts of other memory are kept as
 * views (no copy). So the chunks stay few whatever the mix, and no step allocates much at once.
 */
export class ChunkWriter {
  readonly #parts: Buffer[] = []
  #chunk: Buffer | undefined
  #used = 0

  text(text: string): void {
    const bytes = Buffer.byteLength(text, 'utf8')
    if (this.#chunk === undefined || this.#used + bytes > this.#chunk.length) this.#next(bytes)
    this.#used += this.#chunk!.write(text, this.#used, 'utf8')
  }

  bytes(part: Buffer): void {
    if (part.length === 0) return
    if (part.length >= VIEW_MIN_BYTES) {
      this.#flush()
      this.#parts.push(part)
      return
    }
    if (this.#chunk === undefined || this.#used + part.length > this.#chunk.length) this.#next(part.length)
    part.copy(this.#chunk!, this.#used)
    this.#used += part.length
  }

  finish(): JsonChunks {
    this.#flush()
    return new JsonChunks(this.#parts)
  }

  #next(bytes: number): void {
    this.#flush()
    this.#chunk = Buffer.allocUnsafe(Math.max(CHUNK_BYTES, bytes))
  }

  #flush(): void {
    if (this.#chunk !== undefined && this.#used > 0) this.#parts.push(this.#chunk.subarray(0, this.#used))
    this.#chunk = undefined
    this.#used = 0
  }
}

/**
 * A JSON array of a /stats view built from its sources one at a time (a topic's entries: its
 * groups, its partitions): all at once by toArray() (`surface.stats()`), or a few sources at a
 * time between which toJSONSliced() lets the event loop run (/stats over HTTP).
 */
export class Listing<S, T> {
  constructor(
    readonly sources: readonly S[],
    readonly entries: (source: S) => readonly T[],
  ) {}

  toArray(): T[] {
    const out: T[] = []
    for (const source of this.sources) for (const entry of this.entries(source)) out.push(entry)
    return out
  }
}

/** `value` with each Listing among its own values made an array: what toJSONSliced() writes, at once. */
export function materialize<V>(value: V): V {
  if (typeof value !== 'object' || value === null || Object.getPrototypeOf(value) !== Object.prototype) return value
  const out: Record<string, unknown> = {}
  for (const [key, field] of Object.entries(value)) out[key] = field instanceof Listing ? field.toArray() : field
  return out as V
}

/**
 * How a sliced write waits between two slices and tells the time (tests pass their own), and
 * whether its reader has gone (then it stops: toJSONSliced() resolves undefined).
 */
export interface Slicer {
  now(): number
  pause(): Promise<void>
  gone?(): boolean
}

/** Slices of the event loop: the next begins once the loop has run what waited (setImmediate). */
export const IMMEDIATE_SLICES: Slicer = {
  now: () => performance.now(),
  pause: () => new Promise((resolve) => setImmediate(resolve)),
}

/**
 * toJSON(materialize(value)), the same text, written in slices of about `holdMs` with the event
 * loop free between them: the entries of each Listing among `value`'s own values are built and
 * written a source at a time (docs/endpoints.md: a large /stats view never holds the broker's
 * thread for its whole write). Other values are written whole, and a value with no Listing at
 * once (a Buffer, not a promise).
 */
export function toJSONSliced(value: unknown, holdMs: number, slicer: Slicer = IMMEDIATE_SLICES): Buffer | Promise<Buffer | undefined> {
  // Without a Listing, at once (a /healthz answer, an error: answered inside the call).
  if (typeof value !== 'object' || value === null || Object.getPrototypeOf(value) !== Object.prototype || !Object.values(value).some((v) => v instanceof Listing)) {
    return Buffer.from(toJSON(value), 'utf8')
  }
  return writeSliced(value as Record<string, unknown>, holdMs, slicer)
}

async function writeSliced(value: Record<string, unknown>, holdMs: number, slicer: Slicer): Promise<Buffer | undefined> {
  const parts: Buffer[] = []
  let text = '{'
  let deadline = slicer.now() + holdMs
  let first = true
  for (const [key, field] of Object.entries(value)) {
    if (field === undefined || typeof field === 'function' || typeof field === 'symbol') continue // as JSON.stringify leaves them out
    text += `${first ? '' : ','}${JSON.stringify(key)}:`
    first = false
    if (!(field instanceof Listing)) {
      text += toJSON(field)
      continue
    }
    text += '['
    let empty = true
    for (const source of field.sources) {
      for (const entry of field.entries(source)) {
        text += `${empty ? '' : ','}${toJSON(entry) ?? 'null'}` // as JSON.stringify writes undefined in an array
        empty = false
      }
      if (slicer.now() >= deadline) {
        parts.push(Buffer.from(text, 'utf8'))
        text = ''
        await slicer.pause()
        if (slicer.gone?.() === true) return undefined
        deadline = slicer.now() + holdMs
      }
    }
    text += ']'
  }
  parts.push(Buffer.from(text + '}', 'utf8'))
  return Buffer.concat(parts)
}
