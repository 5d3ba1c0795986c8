// Thread identity from /proc: which thread owns a row, whether it still runs, what it has done.
// A tid alone is not enough: Linux hands a freed tid to a later thread, so an identity is the tid
// with the thread's start time (clock ticks since boot, field 22 of /proc/<tid>/stat), which no
// two threads with the same tid share. Without /proc (not Linux) every answer is 'unknown'.
import { readFileSync } from 'node:fs'

/** What /proc says of a thread: running, exited, or nothing provable. */
export type ThreadState = 'alive' | 'gone' | 'unknown'

export interface ThreadIdentity {
  tid: number
  start: number
}

let thisThread: ThreadIdentity | null | undefined // per thread: each worker loads its own module

/** The calling thread's identity, or undefined where /proc is not available. */
export function threadIdentity(): ThreadIdentity | undefined {
  if (thisThread === undefined) {
    try {
      thisThread = parseStat(readFileSync('/proc/thread-self/stat', 'latin1')) ?? null
    } catch {
      thisThread = null // not Linux, or /proc not mounted: rows are simply not reused
    }
  }
  return thisThread ?? undefined
}

/** tid and start time from a /proc/<pid>/task/<tid>/stat line; undefined if it is not one. */
export function parseStat(text: string): ThreadIdentity | undefined {
  const tid = Number(text.slice(0, text.indexOf(' ')))
  // Field 2 is the thread's name in parentheses and may itself hold ') ': fields resume after
  // the last ')'. What follows is field 3 (the state) onwards, so field 22 is the 20th.
  const end = text.lastIndexOf(')')
  const start = Number(text.slice(end + 2).split(' ')[19])
  if (end < 0 || !Number.isSafeInteger(tid) || tid <= 0 || !Number.isSafeInteger(start) || start < 0) return undefined
  return { tid, start }
}

/** What a thread has done so far: CPU time it has run, how often it blocked, and if it is asleep. */
export interface ThreadProgress {
  cpuNs: number
  blocked: number
  /** In the kernel, waiting (state S). */
  sleeping: boolean
}

/** ThreadProgress of this process's thread `tid` from /proc (undefined: gone, or no /proc). The bench's CPU accounting. */
export function threadProgress(tid: number): ThreadProgress | undefined {
  try {
    const cpuNs = Number(readFileSync(`/proc/self/task/${tid}/schedstat`, 'latin1').split(' ')[0])
    const status = readFileSync(`/proc/self/task/${tid}/status`, 'latin1')
    const blocked = /\nvoluntary_ctxt_switches:\s*(\d+)/.exec(status)
    const state = /\nState:\s*(\S)/.exec(status)
    if (!Number.isSafeInteger(cpuNs) || blocked === null || state === null) return undefined
    return { cpuNs, blocked: Number(blocked[1]), sleeping: state[1] === 'S' }
  } catch {
    return undefined
  }
}

/** Linux's limit on pids and tids (pid_max can be at most 2^22). */
export const MAX_TID = 2 ** 22

/**
 * The stat line of this process's thread `tid`; 'gone' if there is no such thread; 'unknown' if
 * /proc could not say (ESRCH, for one, is a thread still exiting).
 */
export function taskStat(tid: number): string | 'gone' | 'unknown' {
  try {
    return readFileSync(`/proc/self/task/${tid}/stat`, 'latin1')
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'ENOENT' ? 'gone' : 'unknown'
  }
}

/** Whether this process has a thread `tid` (undefined: /proc could not say). */
export function threadExists(tid: number): boolean | undefined {
  const stat = taskStat(tid)
  return stat === 'gone' ? false : stat === 'unknown' ? undefined : true
}

/** Whether the thread `tid` that started at `start` still exists in this process. */
export function threadState(tid: number, start: number): ThreadState {
  const text = taskStat(tid)
  if (text === 'gone' || text === 'unknown') return text
  const stat = parseStat(text)
  return stat === undefined ? 'unknown' : stat.start === start ? 'alive' : 'gone'
}

/** threadState, for a caller that only needs to know whether the thread may still run. */
export function threadAlive(tid: number, start: number): boolean {
  return threadState(tid, start) !== 'gone'
}
