// design §8: configuration is read once, at startup. Unknown keys and wrongly-typed values are a
// ConfigError naming the key; the result is frozen, so nothing can change afterwards.
import { ConfigError } from './errors'
import { describe, isPlainObject, ownOption } from './labels'

export interface Config {
  metrics_enabled?: boolean
  max_in_flight?: number
  max_attempts?: number
  e2e_latency?: boolean
  e2e_latency_timer?: boolean
  metrics_auth_token?: string
  max_topics?: number
  max_partitions_per_topic?: number
  max_groups_per_topic?: number
}

export interface ResolvedConfig {
  readonly metrics_enabled: boolean
  readonly max_in_flight: number
  readonly max_attempts: number
  readonly e2e_latency: boolean
  /** false: the surface never rotates the latency window; the broker calls surface.latency.rotate() on its own clock. */
  readonly e2e_latency_timer: boolean
  readonly metrics_auth_token: string | undefined
  readonly max_topics: number
  readonly max_partitions_per_topic: number
  readonly max_groups_per_topic: number
}

/** The largest max_in_flight a configuration or a group may set (design §5: the in-flight bound). */
export const MAX_IN_FLIGHT_LIMIT = 0x7fffffff

type Kind = 'boolean' | 'positive integer' | 'token'
const KEYS: Record<keyof Config, { kind: Kind; default: unknown; max?: number }> = {
  metrics_enabled: { kind: 'boolean', default: true },
  max_in_flight: { kind: 'positive integer', default: 1000, max: MAX_IN_FLIGHT_LIMIT },
  max_attempts: { kind: 'positive integer', default: 5 },
  e2e_latency: { kind: 'boolean', default: false },
  e2e_latency_timer: { kind: 'boolean', default: true },
  metrics_auth_token: { kind: 'token', default: undefined },
  max_topics: { kind: 'positive integer', default: 10000, max: 1_000_000 },
  max_partitions_per_topic: { kind: 'positive integer', default: 4096, max: 1_000_000 },
  max_groups_per_topic: { kind: 'positive integer', default: 256, max: 100_000 },
}

/**
 * Checks that `input` (named `what`; undefined reads as {}) is a plain object with no key outside
 * `known` (ConfigError naming the first one, with `unknown` as its message) and returns a reader
 * of its own properties: a key inherited from a prototype (or a polluted Object.prototype) is not
 * something the caller wrote, and reads as undefined.
 */
export function ownFields(input: unknown, what: string, known: readonly string[], unknown: string): (key: string, fallback?: unknown) => unknown {
  if (input === undefined) input = {}
  if (!isPlainObject(input)) {
    throw new ConfigError(what, `must be an object, got ${describe(input)}`)
  }
  const given = input as Record<string, unknown>
  for (const key of Object.keys(given)) {
    if (!known.includes(key)) throw new ConfigError(key, unknown)
  }
  return (key, fallback) => ownOption(given, key, fallback)
}

export function resolveConfig(input: unknown): ResolvedConfig {
  const known = Object.keys(KEYS)
  const own = ownFields(input, 'config', known, `unknown configuration key (known keys: ${known.join(', ')})`)
  const out: Record<string, unknown> = {}
  for (const [key, rule] of Object.entries(KEYS)) {
    const value = own(key)
    out[key] = value === undefined ? rule.default : check(key, rule.kind, value, rule.max)
  }
  return Object.freeze(out) as unknown as ResolvedConfig
}

function check(key: string, kind: Kind, value: unknown, max?: number): unknown {
  switch (kind) {
    case 'boolean':
      if (typeof value !== 'boolean') throw new ConfigError(key, `must be a boolean, got ${describe(value)}`)
      return value
    case 'positive integer':
      // Safe integers only: past 2^53 an integer bound is no longer exact (2^53 + 1 reads as 2^53).
      if (typeof value !== 'number' || !Number.isSafeInteger(value)) {
        throw new ConfigError(key, `must be a positive integer, got ${describe(value)}`)
      }
      if (value < 1 || (max !== undefined && value > max)) {
        throw new ConfigError(key, `must be a positive integer from 1 to ${max ?? Number.MAX_SAFE_INTEGER}, got ${value}`)
      }
      return value
    case 'token':
      if (typeof value !== 'string') throw new ConfigError(key, `must be a string, got ${describe(value)}`)
      if (value.length === 0 || value.length > 4096 || /[^\x21-\x7e]/.test(value)) {
        throw new ConfigError(key, 'must be 1 to 4096 visible ASCII characters (it is sent in an Authorization header)')
      }
      return value
  }
}
