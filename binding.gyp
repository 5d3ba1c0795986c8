{
  "targets": [
    {
      "target_name": "mq_metrics",
      "sources": ["native/addon.cc", "native/arena.cc", "native/latency.cc"],
      "defines": ["NAPI_VERSION=8"],
      "cflags_cc": ["-std=c++17", "-O3", "-fno-exceptions", "-Wall", "-Wextra", "-Werror"],
      "xcode_settings": {"CLANG_CXX_LANGUAGE_STANDARD": "c++17", "GCC_ENABLE_CPP_EXCEPTIONS": "NO"}
    }
  ]
}
