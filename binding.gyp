{
  "targets": [
    {
      "target_name": "mq_metrics",
      "sources": ["native/addon.cc", "native/arena.cc", "native/latency.cc"],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": ["NAPI_VERSION=8", "NAPI_DISABLE_CPP_EXCEPTIONS", "NODE_ADDON_API_DISABLE_DEPRECATED", "NODE_API_SWALLOW_UNTHROWABLE_EXCEPTIONS"],
      "cflags_cc": ["-std=c++17", "-O3", "-fno-exceptions", "-Wall", "-Wextra", "-Werror"],
      "cflags_cc!": ["-fno-rtti"],
      "xcode_settings": {"CLANG_CXX_LANGUAGE_STANDARD": "c++17", "GCC_ENABLE_CPP_EXCEPTIONS": "NO"}
    }
  ]
}
