#!/usr/bin/env bash
# V8 internals the hot path's speed rests on (bench/v8-guards.js): the hot-path calls fit the
# inlining budget, snapshot objects share their hidden classes. One test point.
set -u
cd "$(dirname "$0")/../.."
timeout 300 node bench/v8-guards.js
