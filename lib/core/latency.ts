// The latency estimator's core (design §9): log-linear buckets, the hot-path `recordLatency`, the
// nearest-rank read-out, `LatencyWindow`, the double buffer owned by the reading thread, and the
// `LatencyEstimator` a surface and a worker hand the broker.
//
// Each thread counts into its own row of Float64 cells (design §11: single writer, no atomics).
// Those per-thread counts are cumulative and never cleared; a window is the difference of two
// snapshots of their sum. The "double buffer" is therefore the pair of snapshots held by the
// reader (previous cumulative, sealed window), and recording never has to know a rotation exists.
// native/latency.cc holds the C++ twin of `quantilesFromCounts`; both must agree bit for bit.

import { ClosedError } from './errors'
import { describe } from './labels'
import { C_CLOSED } from './layout'
import type { LatencyQuantiles } from './snapshot'

// Bucket layout. A bucket is one power of two split into 64 equal sub-buckets, so its index is
// read straight off the IEEE-754 bits: the 11 exponent bits and the top 6 mantissa bits, i.e.
// bits 30..14 of the high 32-bit word. The first octave is [2^-10, 2^-9) ms (2^-10 ≈ 0.000977 <
// 0.001 ms = 1 µs) and the last is [2^21, 2^22) ms (2^22 ≈ 4.19e6 > 3.6e6 ms = 1 h): 32 octaves.
const SUB_BUCKET_BITS = 6
const FIRST_EXPONENT = -10
const OCTAVES = 32
/** Number of latency buckets (32 octaves × 64 sub-buckets). */
export const LATENCY_BUCKETS = OCTAVES << SUB_BUCKET_BITS // 2048
const LAST_BUCKET = LATENCY_BUCKETS - 1
const MANTISSA_BITS_DROPPED = 20 - SUB_BUCKET_BITS // of the high word's 20 mantissa bits
// (biased exponent of the first octave) << 6: subtracted from bits 30..14 to get the index.
const INDEX_BIAS = (FIRST_EXPONENT + 1023) << SUB_BUCKET_BITS // 64832

// A private scratch double aliased as two 32-bit words, to read a value's bits without Math.log.
const scratchDouble = new Float64Array(1)
const scratchWords = new Uint32Array(scratchDouble.buffer)
// Which word holds the sign, exponent and top mantissa bits depends on the platform's byte order.
const HIGH_WORD = (() => {
  scratchDouble[0] = 1 // 0x3FF00000_00000000
  return scratchWords[1] === 0x3ff00000 ? 1 : 0
})()
const LOW_WORD = 1 - HIGH_WORD

/** Bucket index of a validated ms (finite, ≥ 0 or −0). Out-of-range values clamp to the ends. */
function bucketIndexOf(ms: number): number {
  scratchDouble[0] = ms
  // & 0x1ffff drops the sign bit, so −0 lands with +0 in the first bucket.
  const index = ((scratchWords[HIGH_WORD] >>> MANTISSA_BITS_DROPPED) & 0x1ffff) - INDEX_BIAS
  return index < 0 ? 0 : index > LAST_BUCKET ? LAST_BUCKET : index
}

function throwBadLatency(ms: unknown): never {
  if (typeof ms !== 'number') {
    throw new TypeError(`latency ms must be a number, got ${describe(ms)}`)
  }
  throw new RangeError(`latency ms must be a finite number ≥ 0, got ${ms}`)
}

/** Index of the bucket that counts `ms`. Throws like `recordLatency` on a bad value. */
export function latencyBucketIndex(ms: number): number {
  if (typeof ms !== 'number' || !(ms >= 0 && ms < Infinity)) throwBadLatency(ms)
  return bucketIndexOf(ms)
}

/**
 * The value reported for a bucket: its midpoint, 2^e · (1 + (s + ½)/64), built from its bits (the
 * index's bits followed by a single 1) so that native/latency.cc computes the very same double.
 * Any value in the bucket is within 1/128 (0.78%) of it.
 */
export function latencyBucketValue(index: number): number {
  if (!Number.isInteger(index) || index < 0 || index > LAST_BUCKET) {
    throw new RangeError(`latency bucket index must be an integer in [0, ${LAST_BUCKET}], got ${index}`)
  }
  return bucketMidpoint(index)
}

function bucketMidpoint(index: number): number {
  scratchWords[HIGH_WORD] = ((index + INDEX_BIAS) << MANTISSA_BITS_DROPPED) | (1 << (MANTISSA_BITS_DROPPED - 1))
  scratchWords[LOW_WORD] = 0
  return scratchDouble[0]
}

/**
 * The hot path: count one observation into this thread's row, whose buckets start at `base`.
 * No clock read, no allocation, no N-API call (which alone costs more than the whole of this): see
 * the bench row `latency record(ms)` (docs/benchmarks.md).
 */
export function recordLatency(row: Float64Array, base: number, ms: number): void {
  if (typeof ms !== 'number' || !(ms >= 0 && ms < Infinity)) throwBadLatency(ms)
  row[base + bucketIndexOf(ms)] += 1
}

/**
 * Nearest-rank p50/p90/p99 (rank = ⌈q·n⌉, 1-based) over the `LATENCY_BUCKETS` counts starting at
 * `offset`; null when they hold no sample. One monotone scan finds the three ranks in order, so
 * p50 ≤ p90 ≤ p99 by construction. Its cost: the bench row `latency quantiles p50/p90/p99`.
 */
export function quantilesFromCounts(counts: Float64Array, offset: number): LatencyQuantiles | null {
  // Four running sums break the chain of dependent additions (~3× faster). Counts are integers
  // far below 2^53, so every partial sum is exact and the order cannot change the total.
  let sum0 = 0
  let sum1 = 0
  let sum2 = 0
  let sum3 = 0
  for (let i = offset; i < offset + LATENCY_BUCKETS; i += 4) {
    sum0 += counts[i]
    sum1 += counts[i + 1]
    sum2 += counts[i + 2]
    sum3 += counts[i + 3]
  }
  const count = sum0 + sum1 + (sum2 + sum3)
  if (!(count > 0)) return null
  // ⌈n·per/100⌉ is exact in doubles: n·per is an exact integer and the quotient is either an
  // exact integer or at least 0.01 away from one, so rounding can never cross an integer.
  const rank50 = Math.ceil((count * 50) / 100)
  const rank90 = Math.ceil((count * 90) / 100)
  const rank99 = Math.ceil((count * 99) / 100)
  // Three consecutive stretches of one scan, each resuming where the previous rank was reached.
  // `seen` reaches count (exact integer sums) by the last bucket, and rank99 ≤ count; the index
  // bound only guards against non-integer counts from a misuse.
  let seen = counts[offset]
  let index = 0
  while (seen < rank50 && index < LAST_BUCKET) seen += counts[offset + ++index]
  const p50 = index
  while (seen < rank90 && index < LAST_BUCKET) seen += counts[offset + ++index]
  const p90 = index
  while (seen < rank99 && index < LAST_BUCKET) seen += counts[offset + ++index]
  const p99 = index
  return {
    p50: bucketMidpoint(p50),
    p90: bucketMidpoint(p90),
    p99: bucketMidpoint(p99),
    count,
  }
}

export type QuantilesFromCounts = (counts: Float64Array, offset: number) => LatencyQuantiles | null

/**
 * The double buffer, owned by the reading thread: the previous cumulative snapshot and the sealed
 * window (the last complete one). `sumCumulative(out)` fills `out` with Σ over threads of their
 * cumulative bucket counts; `quantiles` defaults to `quantilesFromCounts` (the native backend
 * passes its C++ twin).
 *
 * Why every recorded value lands in exactly one window, even while another thread records during
 * `rotate`: the per-thread counts are never cleared, so there is no clear that could race a write
 * and erase it. A window is S_k − S_{k−1} for successive snapshots S; the windows telescope, so
 * the sum of all windows up to rotation k is exactly S_k − 0. A write that a snapshot misses
 * (still in flight on another core) is simply seen by the next snapshot and counted in the next
 * window. Counts are integers far below 2^53, so every sum and difference is exact. (Each cell
 * has one writer and is 8-byte aligned: on the platforms Node supports such loads and stores are
 * single-copy atomic and a reader never sees a cell go backwards.)
 */
export class LatencyWindow {
  readonly #sumCumulative: (out: Float64Array) => void
  readonly #quantiles: QuantilesFromCounts
  #previous = new Float64Array(LATENCY_BUCKETS) // cumulative sum at the last rotation (S_{k−1})
  #now = new Float64Array(LATENCY_BUCKETS) // scratch for the next snapshot (S_k)
  readonly #sealed = new Float64Array(LATENCY_BUCKETS) // S_k − S_{k−1}
  #sealedCount = 0
  #rotated = false

  constructor(sumCumulative: (out: Float64Array) => void, quantiles: QuantilesFromCounts = quantilesFromCounts) {
    if (typeof sumCumulative !== 'function') {
      throw new TypeError(`sumCumulative must be a function, got ${typeof sumCumulative}`)
    }
    if (typeof quantiles !== 'function') {
      throw new TypeError(`quantiles must be a function, got ${typeof quantiles}`)
    }
    this.#sumCumulative = sumCumulative
    this.#quantiles = quantiles
  }

  /** Seal the window since the previous rotation (or since the start) and begin the next one. */
  rotate(): void {
    const now = this.#now
    const previous = this.#previous
    const sealed = this.#sealed
    this.#sumCumulative(now)
    let total = 0
    for (let i = 0; i < LATENCY_BUCKETS; i++) {
      const inWindow = now[i] - previous[i]
      sealed[i] = inWindow
      total += inWindow
    }
    this.#sealedCount = total
    this.#previous = now // the snapshot just taken becomes S_{k−1} for the next rotation
    this.#now = previous // reused as scratch: rotate allocates nothing
    this.#rotated = true
  }

  /**
   * Quantiles of the sealed window; before the first rotation, of everything recorded so far
   * (design §9: a fresh broker shows latency at once). null when that window is empty.
   */
  quantiles(): LatencyQuantiles | null {
    return this.#quantiles(this.#readWindow(), 0)
  }

  /** @internal Samples in the sealed window (0 before the first rotation); for tests. */
  sealedCount(): number {
    return this.#sealedCount
  }

  /** @internal A copy of the per-bucket counts that `quantiles()` reads right now; for tests. */
  windowCounts(): Float64Array {
    return this.#readWindow().slice()
  }

  #readWindow(): Float64Array {
    if (this.#rotated) return this.#sealed
    // The live partial window is S_now − 0. #now is only scratch between rotations.
    this.#sumCumulative(this.#now)
    return this.#now
  }
}

export interface LatencyEstimator {
  /** Records one publish-to-ack latency in milliseconds (a no-op while e2e_latency is off). */
  record(ms: number): void
  /** Seals the current window and starts the next (the surface does this every 60 s). */
  rotate(): void
  /** p50/p90/p99 of the last complete window (the partial one before the first rotation). */
  quantiles(): LatencyQuantiles | null
}

/**
 * A thread's estimator over `row`, the chunk of its own row whose slots [0, LATENCY_BUCKETS) hold
 * its buckets; `control` is the shared control block (C_CLOSED is set by close(), whichever thread
 * records). `window` turns the buckets into quantiles (the main thread's; a worker only records).
 */
export function latencyEstimator(row: Float64Array, control: Int32Array, enabled: boolean, window: LatencyWindow): LatencyEstimator {
  return {
    record: enabled
      ? (ms: number) => {
          if (control[C_CLOSED] === 1) throw new ClosedError('this mq-metrics surface')
          recordLatency(row, 0, ms)
        }
      : (ms: number) => {
          // Disabled: nothing is recorded, but misuse is as loud as when it is on (STYLE: never
          // swallow): a broker must not learn of a bad value only once it turns latency on.
          if (control[C_CLOSED] === 1) throw new ClosedError('this mq-metrics surface')
          latencyBucketIndex(ms)
        },
    rotate: () => {
      if (control[C_CLOSED] === 1) throw new ClosedError('this mq-metrics surface')
      if (enabled) window.rotate()
    },
    quantiles: () => {
      if (control[C_CLOSED] === 1) throw new ClosedError('this mq-metrics surface')
      return enabled ? window.quantiles() : null
    },
  }
}
