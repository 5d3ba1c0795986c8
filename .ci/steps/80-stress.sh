#!/usr/bin/env bash
# The stress tests kept out of `npm test` (it stays quick): thread rows churned by hundreds of
# workers, workers terminated mid-attach, and the short soak. `npm run test:stress` locally.
set -u
cd "$(dirname "$0")/../.."
timeout 1500 npx tap --reporter=tap test/*.stress.js > "${CI_TAP_OUT:-/dev/stdout}"
