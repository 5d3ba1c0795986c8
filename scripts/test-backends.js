'use strict'
// Says, before `npm test`, which backends the suite will run on: every test runs on both when the
// native core is built (or prebuilt), on the TypeScript backend alone otherwise. A clone on a
// machine with no C++ compiler passes that way, and this line says what it did not test.
const path = require('node:path')
const root = path.join(__dirname, '..')
const candidates = [path.join(root, 'prebuilds', `${process.platform}-${process.arch}`, 'mq_metrics.node'), path.join(root, 'build', 'Release', 'mq_metrics.node')]
let reason = ''
for (const file of candidates) {
  try {
    require(file)
    console.log(`mq-metrics tests: both backends (native core ${path.relative(root, file)}, and TypeScript)`)
    process.exit(0)
  } catch (error) {
    reason ||= error.code === 'MODULE_NOT_FOUND' ? '' : ` (${error.message.split('\n')[0]})`
  }
}
console.log(`mq-metrics tests: the TypeScript backend only: the native core is not built${reason}. To test it too, install a C++ compiler, make and python3, then \`npm run prebuilds\` (docs/development.md)`)
