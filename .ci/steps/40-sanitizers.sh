#!/usr/bin/env bash
# The native core built with AddressSanitizer and UndefinedBehaviorSanitizer, and the native-backend
# tests run against it (scripts/test-asan.sh): any sanitizer finding fails the run.
set -u
cd "$(dirname "$0")/../.."
if [ ! -f build/Release/mq_metrics.node ]; then
  echo "no native build: nothing to sanitize"
  exit 1
fi
raw=$(mktemp)
bash scripts/test-asan.sh --reporter=tap > "$raw" 2>&1
status=$?
cat "$raw"
findings=$(grep -c "ERROR: AddressSanitizer\|runtime error:" "$raw")
[ -n "${CI_TAP_OUT:-}" ] && cp "$raw" "$CI_TAP_OUT"
rm -f "$raw"
echo "sanitizer findings: $findings"
[ "$status" -eq 0 ] && [ "$findings" -eq 0 ]
