// Numbers as the exposition writes them: integers as decimal digits straight into the output
// bytes, anything else in the shortest round-trip form.

const ZERO = 0x30
const INT32_MAX = 0x7fffffff

/** design §2: floats in the shortest round-trip form; NaN and ±Inf as Prometheus spells them. */
export function formatFloat(value: number): string {
  if (value === Infinity) return '+Inf'
  if (value === -Infinity) return '-Inf'
  return String(value) // 'NaN' for NaN; shortest round-trip decimal otherwise
}

export function isSafeCount(value: number): boolean {
  return value >= 0 && value <= Number.MAX_SAFE_INTEGER && Math.floor(value) === value
}

/**
 * The decimal digits of a safe non-negative integer at `pos`; returns the end. Below 2^31 the
 * divisions are int32 (`| 0`), which V8 turns into a multiply; above, float division and floor.
 */
export function writeDigits(out: Uint8Array, pos: number, value: number): number {
  if (value < 10) {
    out[pos] = ZERO + value
    return pos + 1
  }
  if (value <= INT32_MAX) {
    let v = value | 0
    const end = pos + int32Digits(v)
    let at = end
    while (v >= 10) {
      const quotient = (v / 10) | 0
      out[--at] = ZERO + (v - quotient * 10)
      v = quotient
    }
    out[--at] = ZERO + v
    return end
  }
  let digits = 10
  for (let power = 1e10; power <= value; power *= 10) digits++
  const end = pos + digits
  let at = end
  while (value >= 10) {
    const quotient = Math.floor(value / 10)
    out[--at] = ZERO + (value - quotient * 10)
    value = quotient
  }
  out[--at] = ZERO + value
  return end
}

function int32Digits(v: number): number {
  if (v < 100000) return v < 100 ? 2 : v < 1000 ? 3 : v < 10000 ? 4 : 5
  return v < 1000000 ? 6 : v < 10000000 ? 7 : v < 100000000 ? 8 : v < 1000000000 ? 9 : 10
}
