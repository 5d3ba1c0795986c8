// The latency estimator's read side (design §9): nearest-rank p50/p90/p99 over one window of
// log-linear bucket counts. Recording stays in JavaScript (lib/latency.ts: a Float64Array store,
// ~2 ns, where an N-API call alone costs 10–25 ns). This is the C++ twin of
// `quantilesFromCounts` in lib/latency.ts and must return the very same doubles: same bucket
// layout, same grouping of the sums, same rank formula, same bit-built bucket midpoint.
// The caller (lib/, which validates) passes a Float64Array holding kBuckets counts from offset.
#include <napi.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "args.h"

namespace {

// 32 octaves, [2^-10, 2^22) ms, each split into 64 sub-buckets (lib/latency.ts: the layout).
constexpr int kSubBucketBits = 6;
constexpr int kFirstExponent = -10;
constexpr int kOctaves = 32;
constexpr uint32_t kBuckets = kOctaves << kSubBucketBits;  // 2048
// (biased exponent of the first octave) << 6: a bucket's index is bits 62..46 of its values minus this.
constexpr uint64_t kIndexBias = static_cast<uint64_t>(kFirstExponent + 1023) << kSubBucketBits;
constexpr int kDroppedMantissaBits = 52 - kSubBucketBits;

// The bucket's midpoint 2^e · (1 + (s + ½)/64): its index bits followed by a single 1 bit,
// exactly as latencyBucketValue builds it in TypeScript.
double BucketMidpoint(uint32_t index) {
  uint64_t bits = ((index + kIndexBias) << kDroppedMantissaBits) | (uint64_t{1} << (kDroppedMantissaBits - 1));
  double value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// latencyQuantiles(counts: Float64Array, offset: number) → { p50, p90, p99, count } | null
Napi::Value LatencyQuantiles(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!args::Count(info, 2, "latencyQuantiles")) return env.Undefined();
  if (!info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_float64_array) {
    Napi::TypeError::New(env, "latencyQuantiles: counts must be a Float64Array").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  Napi::Float64Array array = info[0].As<Napi::Float64Array>();
  uint64_t offset;
  if (!args::Integer(info, 1, "latencyQuantiles", "offset", 0, static_cast<double>(UINT32_MAX), &offset)) return env.Undefined();
  if (offset + kBuckets > array.ElementLength()) {
    Napi::RangeError::New(env, "latencyQuantiles: counts must hold " + std::to_string(kBuckets) + " buckets from offset").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  const double* counts = array.Data() + offset;

  // Four running sums, grouped as in the TypeScript (see there why this is exact).
  double sum0 = 0, sum1 = 0, sum2 = 0, sum3 = 0;
  for (uint32_t i = 0; i < kBuckets; i += 4) {
    sum0 += counts[i];
    sum1 += counts[i + 1];
    sum2 += counts[i + 2];
    sum3 += counts[i + 3];
  }
  const double count = sum0 + sum1 + (sum2 + sum3);
  if (!(count > 0)) return env.Null();
  // Same expression as the TypeScript: exact, see the comment there.
  const double rank50 = std::ceil((count * 50) / 100);
  const double rank90 = std::ceil((count * 90) / 100);
  const double rank99 = std::ceil((count * 99) / 100);
  // Three consecutive stretches of one scan, as in the TypeScript.
  double seen = counts[0];
  uint32_t index = 0;
  while (seen < rank50 && index < kBuckets - 1) seen += counts[++index];
  const uint32_t p50 = index;
  while (seen < rank90 && index < kBuckets - 1) seen += counts[++index];
  const uint32_t p90 = index;
  while (seen < rank99 && index < kBuckets - 1) seen += counts[++index];
  const uint32_t p99 = index;
  Napi::Object result = Napi::Object::New(env);
  result.Set("p50", BucketMidpoint(p50));
  result.Set("p90", BucketMidpoint(p90));
  result.Set("p99", BucketMidpoint(p99));
  result.Set("count", count);
  return result;
}

}  // namespace

void InitLatency(Napi::Env env, Napi::Object exports) {
  exports.Set("latencyQuantiles", Napi::Function::New(env, LatencyQuantiles, "latencyQuantiles"));
  exports.Set("latencyBuckets", Napi::Number::New(env, kBuckets));
}
