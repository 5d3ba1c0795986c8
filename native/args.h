// Argument checks for the exported functions: lib/ validates every argument first, and these make
// sure that no call, however wrong, touches memory out of bounds. Each returns false after
// throwing a JS TypeError or RangeError that names the function and the argument.
#pragma once
#include <napi.h>

#include <cmath>
#include <cstdint>
#include <string>

namespace args {

inline bool Count(const Napi::CallbackInfo& info, size_t count, const char* function) {
  if (info.Length() >= count) return true;
  Napi::TypeError::New(info.Env(), std::string(function) + ": expected " + std::to_string(count) + " arguments, got " +
                                       std::to_string(info.Length()))
      .ThrowAsJavaScriptException();
  return false;
}

// An integer from `min` to `max` (inclusive), as a double that holds it exactly.
inline bool Integer(const Napi::CallbackInfo& info, size_t index, const char* function, const char* name, double min, double max,
                    uint64_t* out) {
  Napi::Value value = info[index];
  if (!value.IsNumber()) {
    Napi::TypeError::New(info.Env(), std::string(function) + ": " + name + " must be a number").ThrowAsJavaScriptException();
    return false;
  }
  double number = value.As<Napi::Number>().DoubleValue();
  if (!(number >= min && number <= max) || std::floor(number) != number) {
    Napi::RangeError::New(info.Env(), std::string(function) + ": " + name + " must be an integer from " + std::to_string(static_cast<uint64_t>(min)) +
                                          " to " + std::to_string(static_cast<uint64_t>(max)))
        .ThrowAsJavaScriptException();
    return false;
  }
  *out = static_cast<uint64_t>(number);
  return true;
}

}  // namespace args
