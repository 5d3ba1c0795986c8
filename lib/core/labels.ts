// design §3: label values are sanitized on the write side, then escaped on the output side.

/** design §3.6: the longest topic or group name, in UTF-16 code units. */
export const MAX_NAME_LENGTH = 1024

/**
 * design §3.1: every character outside [A-Za-z0-9_-] becomes `_`, per Unicode code point — an emoji
 * (a surrogate pair) or a lone surrogate is one `_`. Many-to-one by design.
 */
export function sanitizeLabelValue(raw: string): string {
  // Most names are already valid label values: return the same string (no second copy to keep).
  if (/^[A-Za-z0-9_-]*$/.test(raw)) return raw
  let out = ''
  for (let i = 0; i < raw.length; i++) {
    const c = raw.charCodeAt(i)
    if ((c >= 48 && c <= 57) || (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || c === 95 || c === 45) {
      out += raw[i]
    } else {
      // A high surrogate followed by a low surrogate is one code point: one `_`.
      if (c >= 0xd800 && c <= 0xdbff && i + 1 < raw.length) {
        const next = raw.charCodeAt(i + 1)
        if (next >= 0xdc00 && next <= 0xdfff) i++
      }
      out += '_'
    }
  }
  return out
}

/** design §3.2: `\` → `\\`, `"` → `\"`, newline → `\n`. A no-op after sanitizing; it still runs. */
export function escapeLabelValue(value: string): string {
  if (!/[\\"\n]/.test(value)) return value
  return value.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n')
}

/** design §3.3: HELP text escapes only `\` and newline; double quotes stay. */
export function escapeHelp(text: string): string {
  return text.replace(/\\/g, '\\\\').replace(/\n/g, '\\n')
}

/** design §3.6: topic and group names are non-empty strings of at most 1024 characters. */
export function validateName(what: string, name: unknown): string {
  if (typeof name !== 'string') {
    throw new TypeError(`${what} must be a string, got ${describe(name)}`)
  }
  if (name.length === 0 || name.length > MAX_NAME_LENGTH) {
    throw new RangeError(`${what} must be 1 to ${MAX_NAME_LENGTH} characters long (UTF-16 code units, as String length counts them), got ${name.length}`)
  }
  return name
}

/** An object as an options or filter argument must be: not null, not an array (it would read as no options). */
export function isPlainObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value)
}

/**
 * An options object's own `key`, or `fallback` when it is absent or undefined: a key inherited from
 * a prototype (or a polluted Object.prototype) is not something the caller wrote, as the
 * configuration reads it. null is a value, not absence: the caller's check refuses it.
 */
export function ownOption(options: object, key: string, fallback?: unknown): unknown {
  const value = Object.prototype.hasOwnProperty.call(options, key) ? (options as Record<string, unknown>)[key] : undefined
  return value === undefined ? fallback : value
}

export function describe(value: unknown): string {
  if (typeof value === 'string') return `the string ${JSON.stringify(value.length > 40 ? value.slice(0, 40) + '…' : value)}`
  if (typeof value === 'bigint') return `the bigint ${value}n`
  if (typeof value === 'number') return String(value)
  if (value === null) return 'null'
  if (Array.isArray(value)) return 'an array'
  return typeof value === 'object' ? 'an object' : String(value)
}
