#!/usr/bin/env bash
# 500 clients that never read a ~14 MB /metrics body (bench/slow-readers.js): the broker's RSS
# must grow at most 100 MB, and a normal scrape meanwhile must be answered 200. One test point.
set -u
cd "$(dirname "$0")/../.."
timeout 300 node bench/slow-readers.js --bounded-only
