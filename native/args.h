// Argument checks for the exported functions: lib/ validates every argument first, and these make
// sure that no call, however wrong, touches memory out of bounds. Each returns false after
// throwing a JS TypeError or RangeError that names the function and the argument.
// Plain Node-API (node_api.h, shipped with every Node.js): nothing to install besides node-gyp.
#pragma once
#include <node_api.h>

#include <cmath>
#include <cstdint>
#include <string>

namespace args {

// One call's arguments (every export takes at most 2; a few more are read to count them).
struct Call {
  napi_env env;
  size_t argc = 4;
  napi_value argv[4] = {};
};

inline bool Read(napi_env env, napi_callback_info info, Call* call) {
  call->env = env;
  return napi_get_cb_info(env, info, &call->argc, call->argv, nullptr, nullptr) == napi_ok;
}

inline napi_value Undefined(napi_env env) {
  napi_value value = nullptr;
  napi_get_undefined(env, &value);
  return value;
}

inline bool Count(const Call& call, size_t count, const char* function) {
  if (call.argc >= count) return true;
  std::string message = std::string(function) + ": expected " + std::to_string(count) + " arguments, got " + std::to_string(call.argc);
  napi_throw_type_error(call.env, nullptr, message.c_str());
  return false;
}

// An integer from `min` to `max` (inclusive), as a double that holds it exactly.
inline bool Integer(const Call& call, size_t index, const char* function, const char* name, double min, double max, uint64_t* out) {
  napi_valuetype type;
  double number = 0;
  if (napi_typeof(call.env, call.argv[index], &type) != napi_ok || type != napi_number ||
      napi_get_value_double(call.env, call.argv[index], &number) != napi_ok) {
    napi_throw_type_error(call.env, nullptr, (std::string(function) + ": " + name + " must be a number").c_str());
    return false;
  }
  if (!(number >= min && number <= max) || std::floor(number) != number) {
    std::string message = std::string(function) + ": " + name + " must be an integer from " + std::to_string(static_cast<uint64_t>(min)) + " to " +
                          std::to_string(static_cast<uint64_t>(max));
    napi_throw_range_error(call.env, nullptr, message.c_str());
    return false;
  }
  *out = static_cast<uint64_t>(number);
  return true;
}

// Registers `function` as exports[name].
inline bool Export(napi_env env, napi_value exports, const char* name, napi_callback function) {
  napi_value value;
  return napi_create_function(env, name, NAPI_AUTO_LENGTH, function, nullptr, &value) == napi_ok &&
         napi_set_named_property(env, exports, name, value) == napi_ok;
}

}  // namespace args
