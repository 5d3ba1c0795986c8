// The command line of `mq-demo` (single node and cluster): flags with values, `--flag value` or
// `--flag=value`, each at most once, and -h/--help.

/** A bad flag or option value: the CLI prints it with the usage and exits 64. */
export class UsageError extends Error {
  readonly code = 'USAGE'
  constructor(message: string) {
    super(message)
    this.name = 'UsageError'
  }
}

/** The values of the `known` flags in `argv`, by flag; `help` for -h/--help. Throws UsageError. */
export function scanFlags(argv: readonly string[], known: readonly string[]): { help: boolean; values: Map<string, string> } {
  const values = new Map<string, string>()
  let help = false
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]
    if (arg === '-h' || arg === '--help') {
      help = true
      continue
    }
    const eq = arg.indexOf('=')
    const flag = arg.startsWith('--') && eq > 0 ? arg.slice(0, eq) : arg
    if (!known.includes(flag)) throw new UsageError(arg.startsWith('-') ? `unknown flag ${arg}` : `unexpected argument ${JSON.stringify(arg)}`)
    let value: string | undefined
    if (flag !== arg) value = arg.slice(eq + 1)
    else if (i + 1 < argv.length && !argv[i + 1].startsWith('--')) value = argv[++i]
    if (value === undefined) throw new UsageError(`${flag} needs a value`)
    if (values.has(flag)) throw new UsageError(`${flag} given more than once`)
    values.set(flag, value)
  }
  return { help, values }
}
