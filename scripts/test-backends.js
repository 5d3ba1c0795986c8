'use strict'
// Which backends the test suite runs on: both when the native core is built (or prebuilt), the
// TypeScript backend alone otherwise. test/helpers.js backends() asks here; run as a script (before
// `npm test`), it says which, so that a clone on a machine with no C++ compiler, which passes that
// way, is told what it did not test.
const path = require('node:path')
const root = path.join(__dirname, '..')

/** The native core file that loads, as { file }, or { reason } why none does. */
function nativeCore() {
  const candidates = [path.join(root, 'prebuilds', `${process.platform}-${process.arch}`, 'mq_metrics.node'), path.join(root, 'build', 'Release', 'mq_metrics.node')]
  let reason = ''
  for (const file of candidates) {
    try {
      require(file)
      return { file }
    } catch (error) {
      reason ||= error.code === 'MODULE_NOT_FOUND' ? '' : ` (${error.message.split('\n')[0]})`
    }
  }
  return { reason }
}

module.exports = { nativeCore }

if (require.main === module) {
  const { file, reason } = nativeCore()
  if (file !== undefined) console.log(`mq-metrics tests: both backends (native core ${path.relative(root, file)}, and TypeScript)`)
  else console.log(`mq-metrics tests: the TypeScript backend only: the native core is not built${reason}. To test it too, install a C++ compiler, make and python3, then \`npm run prebuilds\` (docs/development.md)`)
}
