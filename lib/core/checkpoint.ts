// A checkpoint: the entries that restate this thread's picture (picture.ts) at the start of a new
// log generation — every topic, partition, group, floor and window alive, the topics and groups
// still retiring, retired totals, labels' carries, folds past 2^53 and the free queues with their
// epochs — so that the log is bounded by what is alive, not by what ever existed
// (docs/reclamation.md, "Memory bounded by what is alive"). The registry measures it, then writes
// it into the other directory and publishes it (Registry.compact()); a thread replaying it over its
// picture keeps the entities its handles hold and lets go of what it does not name
// (Picture.beginCheckpoint()). The order is part of the format: the replay relies on it.
import { carriesEntries } from './carry'
import { Blocks } from './blocks'
import { TopicEntity } from './entities'
import { LOG_CHUNK_INTS } from './layout'
import { Entry, amountRows, entryLength, wide } from './log'
import { Picture } from './picture'

/** Freed blocks one Free entry of a checkpoint lists (3 cells each: an entry fits a log chunk). */
const FREE_PER_ENTRY = 4096

/**
 * The checkpoint of `picture` (its free queues: `blocks`), entry by entry through `write` (given
 * each entry's length and where the checkpoint ends so far; returns where it ends after the
 * entry): its end.
 */
export function checkpoint(picture: Picture, blocks: Blocks, write: (length: number, end: number, type: Entry, fields: number[], text?: string) => number): number {
  let end = 0
  const put = (type: Entry, fields: number[], text?: string) => {
    end = write(entryLength(fields.length, text), end, type, fields, text)
  }
  const restate = (topic: TopicEntity, retiring: boolean) => {
    const topicId = wide(topic.id)
    put(Entry.Topic, [...topicId, topic.slot], topic.name)
    for (let p = 0; p < topic.partitionNumbers.length; p++) put(Entry.Partition, [...topicId, topic.partitionNumbers[p], topic.partitionSlots[p]])
    for (const group of [...topic.groups, ...topic.retiring]) {
      const groupId = wide(group.id)
      put(Entry.Group, [...topicId, ...groupId, group.slot, group.maxInFlight, group.window], group.name)
      for (let f = 0; f < group.floorPartitions.length; f++) put(Entry.Floor, [...groupId, group.floorPartitions[f], group.floorSlots[f]])
      for (let w = 0; w < group.windowPartitions.length; w++) put(Entry.Window, [...groupId, group.windowPartitions[w], group.windowSlots[w], group.windowHeaders[w]])
      // A retiring topic's groups all retire with it (those removed with it, at its epoch).
      if (group.retireEpoch !== 0 || retiring) put(Entry.RemoveGroup, [...groupId, ...wide(group.retireEpoch || topic.retireEpoch), group.carries ? 1 : 0])
    }
    if (topic.retiredDelivered !== 0 || topic.retiredDropped !== 0 || topic.retiredDlq !== 0) {
      for (const amounts of amountRows([BigInt(topic.retiredDelivered), BigInt(topic.retiredDropped), BigInt(topic.retiredDlq)])) {
        put(Entry.Retired, [...topicId, 0, 0, ...amounts.flatMap((a) => wide(a))])
      }
    }
  }
  // Retiring topics first: each one's removal (keep) retires it whatever else the checkpoint
  // names, and a live topic of the same name, restated after it, takes the name back.
  for (const topic of picture.retiringTopics.values()) {
    restate(topic, true)
    put(Entry.RemoveTopic, [...wide(topic.id), ...wide(topic.retireEpoch), 1])
    for (const [type, fields] of carriesEntries(topic.id, [...topic.carriedPartitions!])) put(type, fields)
  }
  for (const topic of picture.topicsById.values()) restate(topic, false)
  // The carries, each on a live topic of its label (there is one while the carry exists).
  for (const [label, carry] of picture.carries) for (const [type, fields, text] of carry.entries(picture.liveWithLabel(label)[0].id)) put(type, fields, text)
  for (const [slot, amount] of picture.folds) for (const [part] of amountRows([amount])) put(Entry.Fold, [slot, ...wide(part)])
  // Freed blocks, many to an entry (3 cells each: no more than the registration that held the
  // block took, so what removals free never makes a checkpoint larger than the log they were made in).
  for (const [key, queue] of blocks.queues()) {
    for (let i = queue.head; i < queue.slots.length; ) {
      // As many as what is left of the chunk holds (an entry that does not fit would skip the rest of it).
      const room = Math.floor((LOG_CHUNK_INTS - (end % LOG_CHUNK_INTS) - 2) / 3)
      const n = Math.min(FREE_PER_ENTRY, queue.slots.length - i, room >= 1 ? room : FREE_PER_ENTRY)
      const fields = [key]
      for (let j = i; j < i + n; j++) fields.push(queue.slots[j], ...wide(queue.epochs[j]))
      put(Entry.Free, fields)
      i += n
    }
  }
  put(Entry.CheckpointEnd, [])
  return end
}
