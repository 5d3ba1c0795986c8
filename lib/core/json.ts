// JSON for /stats and /healthz with exact integers: a `bigint` is written as its bare decimal
// digits (JSON numbers have no size limit; JavaScript's JSON.stringify refuses bigint).

export function toJSON(value: unknown, indent = 0): string {
  return JSON.stringify(value, replaceBigInt, indent).replace(BIGINT_MARK, '$1')
}

// A bigint becomes a marked string during stringify, then the marks (and quotes) are removed.
// The mark cannot occur in JSON produced from ordinary strings because \u0000 is always escaped.
const MARK = '\u0000bigint:'
const BIGINT_MARK = /"\\u0000bigint:(\d+)"/g

function replaceBigInt(_key: string, value: unknown): unknown {
  return typeof value === 'bigint' ? MARK + value.toString() : value
}
