// Entry point of the native core. Each part registers its functions; see arena.cc (slot memory)
// and latency.cc (the latency estimator's read side). Plain Node-API, version 8: one binary per
// platform and architecture serves every Node.js from 20 on.
#include <node_api.h>

bool InitArena(napi_env env, napi_value exports);
bool InitLatency(napi_env env, napi_value exports);

NAPI_MODULE_INIT() {
  if (!InitArena(env, exports) || !InitLatency(env, exports)) return nullptr;
  return exports;
}
