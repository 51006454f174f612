// The SIMD layer every kernel is written in: Vec<T> is one register of the ISA this
// translation unit is compiled for, through GCC/Clang vector extensions, which lower to
// SSE2 (baseline), AVX2+FMA, AVX-512 or NEON (aarch64) by the TU's flags alone, and to
// one-lane "vectors" (the scalar reference path) when FASTATTN_VEC_BYTES is 0.
// Arithmetic, comparisons (lane masks) and `mask ? a : b` selects are the operators;
// loads and stores are unaligned. Include only inside an ISA namespace (FASTATTN_ISA_NS):
// every function here is per ISA, so none can leak into another ISA's code.
#pragma once  // per translation unit

namespace fastattn {
namespace FASTATTN_ISA_NS {

template <typename T>
constexpr int kVecBytes = FASTATTN_VEC_BYTES > 0 ? FASTATTN_VEC_BYTES : int(sizeof(T));

template <typename T>
struct VecOf {
  typedef T type __attribute__((vector_size(kVecBytes<T>)));
};

template <typename T>
using Vec = typename VecOf<T>::type;

// Lanes in one Vec<T>.
template <typename T>
constexpr int kLanes = kVecBytes<T> / int(sizeof(T));

template <typename T>
inline Vec<T> vload(const T* p) {
  Vec<T> v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
inline void vstore(T* p, Vec<T> v) {
  __builtin_memcpy(p, &v, sizeof v);
}

template <typename T>
inline Vec<T> vbroadcast(T x) {
  return Vec<T>{} + x;
}

template <typename T>
inline T reduce_add(Vec<T> v) {
  T sum = 0;
  for (int lane = 0; lane < kLanes<T>; ++lane) sum += v[lane];
  return sum;
}

template <typename T>
inline T reduce_max(Vec<T> v) {  // NaN lanes are ignored
  T m = v[0];
  for (int lane = 1; lane < kLanes<T>; ++lane) m = v[lane] > m ? v[lane] : m;
  return m;
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn
