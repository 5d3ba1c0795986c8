#!/usr/bin/env bash
# The stress tests kept out of `npm test` (it stays quick): thread rows churned by hundreds of
# workers, workers terminated mid-attach, a /metrics body past the longest string (553 MB), the counter memory filled (1 GiB), and the
# short soak, one file at a time (each loads both
# cores; run side by side they starve each other past their bounds). `npm run test:stress` locally.
set -u
cd "$(dirname "$0")/../.."
timeout 1500 npx tap --jobs 1 --reporter=tap test/*.stress.js > "${CI_TAP_OUT:-/dev/stdout}"
