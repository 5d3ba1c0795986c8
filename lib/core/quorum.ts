// design §6: the quorum tier, re-evaluated after every replication round. The tier lives in one
// Int32 cell of the shared control block — the gauge, /healthz, /stats, mq-stats and
// admitWrite() all read that cell, so there is no second copy to drift (and worker threads see
// read_only at once).
import { describe, isPlainObject, ownOption } from './labels'
import { C_QUORUM } from './layout'
import type { QuorumState } from './snapshot'

export const READ_ONLY_DEGRADED = 0x6002
export const FOLLOWER_LAG = 0x6004

export const TIER_NAMES = ['healthy', 'soft', 'read_only'] as const
export type TierName = (typeof TIER_NAMES)[number]
/** Runbook level per tier: 2 healthy, 1 soft, 0 read_only. */
export const RUNBOOK_LEVELS = [2, 1, 0] as const

export type WriteAnswer =
  | { readonly ok: true; readonly durability: 'quorum' }
  | { readonly ok: true; readonly durability: 'quorum'; readonly code: typeof FOLLOWER_LAG; readonly name: 'FOLLOWER_LAG' }
  | { readonly ok: false; readonly code: typeof READ_ONLY_DEGRADED; readonly name: 'READ_ONLY_DEGRADED' }

// Frozen constants: admitWrite() allocates nothing on the producer's path.
const ANSWERS: readonly WriteAnswer[] = [
  Object.freeze({ ok: true, durability: 'quorum' } as const),
  Object.freeze({ ok: true, durability: 'quorum', code: FOLLOWER_LAG, name: 'FOLLOWER_LAG' } as const),
  Object.freeze({ ok: false, code: READ_ONLY_DEGRADED, name: 'READ_ONLY_DEGRADED' } as const),
]

export interface QuorumEvent {
  from: QuorumState
  to: QuorumState
  replicas: number
  inSync: number
  /** The replicas out of sync, as the round named them ([] when it said none lags); null when it did not name them (see Quorum.lagging). */
  lagging: readonly string[] | null
  at: string
}

/** The longest name of a replica that `lagging` takes. */
export const REPLICA_NAME_MAX = 256

/** design §6: no majority → read_only; a majority but not all → soft; all in sync → healthy. */
export function tierFor(replicas: number, inSync: number): QuorumState {
  if (inSync * 2 <= replicas) return 2
  return inSync < replicas ? 1 : 0
}

export class Quorum {
  readonly #control: Int32Array
  replicas = 0
  inSync = 0
  /**
   * The replicas out of sync by name, as the last round gave them (frozen; replicas − inSync of
   * them), so that /healthz and mq-stats can say which follower lags; null when it did not name them.
   */
  lagging: readonly string[] | null = null

  constructor(control: Int32Array) {
    this.#control = control
  }

  get state(): QuorumState {
    return Atomics.load(this.#control, C_QUORUM) as QuorumState
  }

  admitWrite(): WriteAnswer {
    return ANSWERS[this.#control[C_QUORUM]]
  }

  /** Validates the round, stores the new tier, and returns the change (or null if none). */
  round(round: unknown): QuorumEvent | null {
    if (!isPlainObject(round)) {
      throw new TypeError(`replicationRound expects { replicas, inSync, lagging? }, got ${describe(round)}`)
    }
    for (const key of Object.keys(round)) {
      if (key !== 'replicas' && key !== 'inSync' && key !== 'lagging') throw new TypeError(`unknown replicationRound field ${JSON.stringify(key)} (known: replicas, inSync, lagging)`)
    }
    const replicas = ownOption(round, 'replicas')
    const inSync = ownOption(round, 'inSync')
    // api.md: a TypeError for a value that is not a number (a missing field too), a RangeError for NaN, a fraction, out of range.
    if (typeof replicas !== 'number' || !Number.isSafeInteger(replicas) || replicas < 1) {
      throw new (typeof replicas === 'number' ? RangeError : TypeError)(`replicas must be an integer ≥ 1 (it counts the leader), got ${describe(replicas)}`)
    }
    if (typeof inSync !== 'number' || !Number.isSafeInteger(inSync) || inSync < 0 || inSync > replicas) {
      throw new (typeof inSync === 'number' ? RangeError : TypeError)(`inSync must be an integer from 0 to replicas (${replicas}), got ${describe(inSync)}`)
    }
    const lagging = laggingOf(ownOption(round, 'lagging'), replicas - inSync)
    const from = this.state
    const to = tierFor(replicas, inSync)
    this.replicas = replicas
    this.inSync = inSync
    this.lagging = lagging
    Atomics.store(this.#control, C_QUORUM, to)
    return from === to ? null : { from, to, replicas, inSync, lagging, at: new Date().toISOString() }
  }
}

/** A character a replica name cannot hold: a control character, a line or paragraph separator, half a surrogate pair. */
const UNPRINTABLE = /[\u0000-\u001f\u007f-\u009f\u2028\u2029]|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/

/**
 * A round's `lagging`: undefined or null (not named: null), or the names of the replicas out of
 * sync, exactly `out` of them (replicas − inSync), each a distinct string of length 1 to
 * REPLICA_NAME_MAX (UTF-16 code units) that an operator can read on one line of a terminal: no
 * UNPRINTABLE character, no space at either end. A copy, frozen.
 */
function laggingOf(lagging: unknown, out: number): readonly string[] | null {
  if (lagging === undefined || lagging === null) return null
  if (!Array.isArray(lagging)) throw new TypeError(`lagging must be an array of the names of the replicas out of sync, got ${describe(lagging)}`)
  const names = [...lagging]
  for (const name of names) {
    if (typeof name !== 'string') throw new TypeError(`lagging must hold replica names (strings), got ${describe(name)}`)
    if (name.length === 0 || name.length > REPLICA_NAME_MAX) throw new RangeError(`a replica name in lagging must be of length 1 to ${REPLICA_NAME_MAX}, got ${name.length}`)
    if (UNPRINTABLE.test(name)) throw new RangeError(`a replica name in lagging must have no control character, line separator or lone surrogate, got ${JSON.stringify(name)}`)
    if (name.trim() !== name) throw new RangeError(`a replica name in lagging must not begin or end with a space, got ${JSON.stringify(name)}`)
  }
  if (new Set(names).size !== names.length) throw new RangeError(`lagging names a replica twice: ${JSON.stringify(names)}`)
  if (names.length !== out) throw new RangeError(`lagging must name the ${out} replica${out === 1 ? '' : 's'} out of sync (replicas − inSync), got ${names.length}: ${JSON.stringify(names)}`)
  return Object.freeze(names)
}
