// The argument checks and cell offsets every recording handle shares (recording.ts, topic.ts,
// group.ts). The offsets are const enums: the compiler writes the numbers in place, so a hot
// method pays nothing to name them (see Chunk below).
import { ClosedError, RemovedTopicError } from './errors'
import { describe } from './labels'
import { C_CLOSED, C_QUORUM, SLOTS_PER_CHUNK } from './layout'
import { G_DELIVERED, G_DLQ, G_DROPPED, G_IN_FLIGHT, G_RETRIES } from './entities'

/** A handle's topic is gone: ClosedError once the surface is closed, else RemovedTopicError. */
export function goneError(control: Int32Array, topic: string): Error {
  return control[C_CLOSED] === 1 ? new ClosedError('this mq-metrics surface') : new RemovedTopicError(topic)
}

export const MAX_SAFE = Number.MAX_SAFE_INTEGER
const MAX_PARTITION = 0x7fffffff
// A slot's chunk and its index in it, as a shift and a mask (slots are < 2^31). A const enum, so
// the compiler writes the numbers in place: produced() must stay under V8's 460-byte inlining
// limit for bytecode, and each module-level const costs a context load and a hole check there.
export const enum Chunk {
  Shift = 13,
  Mask = (1 << 13) - 1,
}
/** layout.ts C_QUORUM, as a literal for the same reason (an imported const cost produced() 12 bytes). */
export const enum Control {
  Quorum = 4,
}
if ((Control.Quorum as number) !== C_QUORUM) throw new Error('internal: Control.Quorum does not match C_QUORUM')
if (1 << Chunk.Shift !== SLOTS_PER_CHUNK) throw new Error('internal: Chunk.Shift does not match SLOTS_PER_CHUNK')

// A group's cells, as offsets from its slot: entities.ts's G_* written in place. Read through the
// import, each offset is a load from the other module's exports object (TypeScript assigns each
// export twice, so V8 cannot treat it as a constant); the `delivered()` row of `npm run bench`
// shows the difference.
export const enum GroupCell {
  Delivered = 0,
  Dropped = 1,
  Dlq = 2,
  Retries = 3,
  InFlight = 4,
}
if (
  GroupCell.Delivered !== G_DELIVERED || GroupCell.Dropped !== G_DROPPED || GroupCell.Dlq !== G_DLQ ||
  GroupCell.Retries !== G_RETRIES || GroupCell.InFlight !== G_IN_FLIGHT
) {
  throw new Error('internal: the group cell offsets differ from entities.ts')
}

/** design §5: counter increments and sequence numbers are non-negative safe integers. */
export function checkCount(what: string, value: unknown): number {
  if (typeof value !== 'number') throw new TypeError(`${what} must be a non-negative integer, got ${describe(value)}`)
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new RangeError(`${what} must be a non-negative integer no larger than 2^53 - 1, got ${describe(value)}`)
  }
  return value
}

/** The seq of a per-message call: a message's, so from 1 (the first message of a partition has seq 1). */
export function checkSeq(value: unknown): number {
  const rule = 'seq must be an integer from 1 to 2^53 - 1 (the first message of a partition has seq 1)'
  if (typeof value !== 'number') throw new TypeError(`${rule}, got ${describe(value)}`)
  if (!Number.isSafeInteger(value) || value < 1) throw new RangeError(`${rule}, got ${describe(value)}`)
  return value
}

export function checkPartition(value: unknown): number {
  if (typeof value !== 'number') throw new TypeError(`partition must be an integer, got ${describe(value)}`)
  if (!Number.isInteger(value) || value < 0 || value > MAX_PARTITION) {
    throw new RangeError(`partition must be an integer from 0 to ${MAX_PARTITION}, got ${describe(value)}`)
  }
  return value
}

