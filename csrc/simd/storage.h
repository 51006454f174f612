// Element types an array may be stored in when it is not the compute type: the 16-bit
// floats (computed in float32) and int8 (a quantised KV cache). Plain bit containers, so
// no arithmetic can happen on them by accident; simd/convert-inl.h widens and narrows.
#pragma once

#include <cstdint>

namespace fastattn {

struct Half {  // IEEE binary16 (NumPy float16)
  uint16_t bits;
};
struct BFloat16 {  // the top half of a float32 (ml_dtypes.bfloat16)
  uint16_t bits;
};

}  // namespace fastattn
