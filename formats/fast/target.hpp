// The vector target of a width's file (docs/architecture.md, "Vector widths
// at run time"): EXMY_TARGET_AVX2 or EXMY_TARGET_AVX512 after the file's
// includes, EXMY_TARGET_END at its end. GCC takes `#pragma GCC target`,
// clang (the fuzz build) `#pragma clang attribute`.
#pragma once

#if defined(__clang__)
#define EXMY_TARGET_AVX2 _Pragma("clang attribute push(__attribute__((target(\"avx2,fma\"))), apply_to = function)")
#define EXMY_TARGET_AVX512 \
  _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512dq,avx512vl,avx2,fma\"))), apply_to = function)")
#define EXMY_TARGET_END _Pragma("clang attribute pop")
#else
#define EXMY_TARGET_AVX2 _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma\")")
// (GCC 12's AVX-512 headers start some intrinsics from an undefined vector,
// which -Wmaybe-uninitialized / -Wuninitialized report when the build's
// baseline lacks AVX-512: silenced for the AVX-512 files, GCC only.)
#define EXMY_TARGET_AVX512                                                                      \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx512bw,avx512dq,avx512vl,avx2,fma\")") \
  _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define EXMY_TARGET_END _Pragma("GCC pop_options")
#endif
