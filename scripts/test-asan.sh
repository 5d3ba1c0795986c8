#!/usr/bin/env bash
# Builds the native core with AddressSanitizer and UndefinedBehaviorSanitizer (into its own
# directory: build/Release stays the optimised build) and runs the native-backend tests against it.
# Any sanitizer report stops the process (halt_on_error) and fails the run. Leak detection is off:
# V8 and Node keep memory until exit by design, and every report would be theirs.
set -eu
cd "$(dirname "$0")/.."
out=build-asan
rm -rf "$out"
mkdir -p "$out"
cp binding.gyp "$out/"
cp -r native "$out/"
nodedir=$(dirname "$(dirname "$(command -v node)")")
gyp=$(node -p "require.resolve('node-gyp/bin/node-gyp.js')")
flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -O1 -g"
nodedir_arg=""
[ -f "$nodedir/include/node/node_api.h" ] && nodedir_arg="--nodedir=$nodedir"
( cd "$out" && NODE_PATH="$PWD/../node_modules" CXXFLAGS="$flags" LDFLAGS="-fsanitize=address,undefined" \
    node "$gyp" rebuild $nodedir_arg > gyp.log 2>&1 ) || { cat "$out/gyp.log"; exit 1; }
addon="$PWD/$out/build/Release/mq_metrics.node"
libasan=$(g++ -print-file-name=libasan.so)
libubsan=$(g++ -print-file-name=libubsan.so)
echo "sanitizer build: $addon"
export MQ_METRICS_ADDON_PATH="$addon"
export LD_PRELOAD="$libasan $libubsan"
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=86"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=87"
npx tap --disable-coverage --timeout 600 "$@" \
  test/native-guards.test.js test/recording.test.js test/workers.test.js test/removal.test.js \
  test/latency.test.js test/closed.test.js test/invariants.test.js test/groups.test.js test/carry.test.js
