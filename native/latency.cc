// The latency estimator's read side (design §9): nearest-rank p50/p90/p99 over one window of
// log-linear bucket counts. Recording stays in JavaScript (lib/core/latency.ts: a Float64Array store,
// ~2 ns, where an N-API call alone costs 10–25 ns). This is the C++ twin of
// `quantilesFromCounts` in lib/core/latency.ts and must return the very same doubles: same bucket
// layout, same grouping of the sums, same rank formula, same bit-built bucket midpoint.
// The caller (lib/, which validates) passes a Float64Array holding kBuckets counts from offset.
#include <node_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "args.h"

namespace {

// 32 octaves, [2^-10, 2^22) ms, each split into 64 sub-buckets (lib/core/latency.ts: the layout).
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
napi_value LatencyQuantiles(napi_env env, napi_callback_info info) {
  args::Call call;
  if (!args::Read(env, info, &call) || !args::Count(call, 2, "latencyQuantiles")) return args::Undefined(env);
  bool isTypedArray = false;
  napi_typedarray_type type;
  size_t length = 0;
  void* data = nullptr;
  if (napi_is_typedarray(env, call.argv[0], &isTypedArray) != napi_ok || !isTypedArray ||
      napi_get_typedarray_info(env, call.argv[0], &type, &length, &data, nullptr, nullptr) != napi_ok || type != napi_float64_array) {
    napi_throw_type_error(env, nullptr, "latencyQuantiles: counts must be a Float64Array");
    return args::Undefined(env);
  }
  uint64_t offset;
  if (!args::Integer(call, 1, "latencyQuantiles", "offset", 0, static_cast<double>(UINT32_MAX), &offset)) return args::Undefined(env);
  if (offset + kBuckets > length) {
    napi_throw_range_error(env, nullptr, ("latencyQuantiles: counts must hold " + std::to_string(kBuckets) + " buckets from offset").c_str());
    return args::Undefined(env);
  }
  const double* counts = static_cast<const double*>(data) + offset;

  // Four running sums, grouped as in the TypeScript (see there why this is exact).
  double sum0 = 0, sum1 = 0, sum2 = 0, sum3 = 0;
  for (uint32_t i = 0; i < kBuckets; i += 4) {
    sum0 += counts[i];
    sum1 += counts[i + 1];
    sum2 += counts[i + 2];
    sum3 += counts[i + 3];
  }
  const double count = sum0 + sum1 + (sum2 + sum3);
  napi_value result;
  if (!(count > 0)) {
    napi_get_null(env, &result);
    return result;
  }
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
  napi_create_object(env, &result);
  const char* names[] = {"p50", "p90", "p99", "count"};
  const double values[] = {BucketMidpoint(p50), BucketMidpoint(p90), BucketMidpoint(p99), count};
  for (int i = 0; i < 4; i++) {
    napi_value number;
    if (napi_create_double(env, values[i], &number) != napi_ok || napi_set_named_property(env, result, names[i], number) != napi_ok) {
      return args::Undefined(env);
    }
  }
  return result;
}

}  // namespace

bool InitLatency(napi_env env, napi_value exports) {
  napi_value buckets;
  return args::Export(env, exports, "latencyQuantiles", LatencyQuantiles) && napi_create_uint32(env, kBuckets, &buckets) == napi_ok &&
         napi_set_named_property(env, exports, "latencyBuckets", buckets) == napi_ok;
}
