// Entry point of the native core. Each part registers its functions; see arena.cc (slot memory)
// and latency.cc (the latency estimator's read side).
#include <napi.h>

void InitArena(Napi::Env env, Napi::Object exports);
void InitLatency(Napi::Env env, Napi::Object exports);

static Napi::Object Init(Napi::Env env, Napi::Object exports) {
  InitArena(env, exports);
  InitLatency(env, exports);
  return exports;
}

NODE_API_MODULE(mq_metrics, Init)
