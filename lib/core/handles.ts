// The handles one thread has given out: same name → same topic handle (design §12), until the
// topic is removed; a removal replayed from the log (whichever thread removed it) lets the
// handle go, so a thread that met many topics later removed keeps no dead handle for each.
import type { GroupEntity, TopicEntity } from './entities'
import { Group } from './group'
import { validateName } from './labels'
import type { Recorder } from './recording'
import { Topic } from './topic'

export class Handles {
  readonly recorder: Recorder
  readonly #topics = new Map<string, Topic>()

  constructor(recorder: Recorder) {
    this.recorder = recorder
    // Replay is in log order, so the handle under a removed topic's name can only be that topic's.
    recorder.registry.onTopicRemoved = (topic) => this.forget(topic.name, topic)
    recorder.registry.onGroupRemoved = (group) => this.forgetGroup(group)
  }

  /** design §12: same name → same handle (until the topic is removed). */
  topic(name: string): Topic {
    validateName('topic name', name)
    const known = this.#topics.get(name)
    if (known !== undefined && this.recorder.registry.isLive(known.entity)) return known
    const handle = new Topic(this.recorder, this.recorder.registry.topic(name))
    this.#topics.set(name, handle)
    return handle
  }

  /** Lets the handle of a removed topic go (only that topic's: the name may be registered again). */
  forget(name: string, topic?: TopicEntity): void {
    if (topic === undefined || this.#topics.get(name)?.entity === topic) this.#topics.delete(name)
  }

  /**
   * In_flight of a live group repaired to 0 if it is below 0 (see Group.repairInFlight), through
   * a handle made for the purpose: nothing is registered, whatever happened to the names since.
   */
  repairInFlight(group: GroupEntity): boolean {
    if (!this.recorder.registry.isGroupLive(group)) return false
    return new Group(this.recorder, new Topic(this.recorder, group.topic), group).repairInFlight()
  }

  /** A group was removed (by any thread): its topic's handle lets the group's handle go. */
  forgetGroup(group: GroupEntity): void {
    const topic = this.#topics.get(group.topic.name)
    if (topic !== undefined && topic.entity === group.topic) topic.dropGroupHandle(group)
  }
}
