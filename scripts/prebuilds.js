'use strict'
// `npm run prebuilds` (and `npm pack`, through prepack): builds the native core from source and
// places it where the package ships it and the loader looks first, prebuilds/<platform>-<arch>/.
// Node-API 8 (binding.gyp): the one binary serves every Node.js from 20 on, on this platform.
const { execFileSync } = require('node:child_process')
const fs = require('node:fs')
const path = require('node:path')

const root = path.join(__dirname, '..')
execFileSync(process.execPath, [path.join(__dirname, '..', 'native', 'install.js')], { cwd: root, stdio: 'inherit', env: { ...process.env, MQ_METRICS_FORCE_BUILD: '1' } })
const built = path.join(root, 'build', 'Release', 'mq_metrics.node')
if (!fs.existsSync(built)) {
  console.error('prebuild: the build from source failed (see above)')
  process.exit(1)
}
const dir = path.join(root, 'prebuilds', `${process.platform}-${process.arch}`)
fs.mkdirSync(dir, { recursive: true })
fs.copyFileSync(built, path.join(dir, 'mq_metrics.node'))
console.log(`prebuild: ${path.relative(root, path.join(dir, 'mq_metrics.node'))}`)
