// How the demo is told to stop: SIGINT (Ctrl-C), SIGTERM, or, run by an npm script, its parent
// going away. npm passes a SIGTERM it receives (a container's stop, a process manager) to the
// shell that runs the script, and that shell (dash) ends without passing it on: the demo would
// run on, orphaned, holding its port. So under npm (npm_lifecycle_event set) it also stops once
// its parent process has changed.

/** How often the demo looks at its parent process under npm, in ms. */
const PARENT_CHECK_MS = 250

/** Calls `stop` on SIGINT, SIGTERM, or (under npm) when the parent is gone. Returns the undo. */
export function onStop(stop: (signal: NodeJS.Signals) => void, env: NodeJS.ProcessEnv = process.env): () => void {
  const handler = (signal: NodeJS.Signals) => stop(signal)
  process.on('SIGINT', handler)
  process.on('SIGTERM', handler)
  let timer: NodeJS.Timeout | undefined
  if (env.npm_lifecycle_event !== undefined && process.platform !== 'win32') {
    const parent = process.ppid
    timer = setInterval(() => {
      if (process.ppid === parent) return
      clearInterval(timer)
      stop('SIGTERM')
    }, PARENT_CHECK_MS).unref()
  }
  return () => {
    process.off('SIGINT', handler)
    process.off('SIGTERM', handler)
    clearInterval(timer)
  }
}
