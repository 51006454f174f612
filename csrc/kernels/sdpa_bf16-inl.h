// The bfloat16 dot-product products of the tiled SDPA engine (sdpa-inl.h): Q K^T and P V
// on bfloat16 operands with float32 accumulation, the softmax itself in float32: vdpbf16ps
// (AVX512-BF16) in the avx512bf16 TU, BFDOT (Arm FEAT_BF16) in the neon_bf16 one. Only those
// TUs (kernels/sdpa_bf16.cpp, which defines FASTATTN_DPBF16) define them and turn kDotBf16
// on; every other ISA widens bfloat16 to float32 and sees declarations only (never
// instantiated there).
//
// Both instructions multiply pairs of bfloat16 and add both products to a float32 lane, so
// the operands are packed in pairs along the summed axis: Q and K^T along head_dim (one
// 32-bit word = elements e, e + 1), V and P along the keys (keys j, j + 1; j even).
// Odd lengths pad the pair with a zero. P is rounded to bfloat16 (nearest even) for P V,
// as FlashAttention does, as the exp pass writes it; the row sum l stays the float32 sum
// of the unrounded P. The two differ in rounding only (both flush denormals): vdpbf16ps
// adds the two products to the lane one after the other, rounding to nearest even; BFDOT
// sums the two products, then adds the sum to the lane, rounding each step to odd. Each is
// a float32 accumulation, held to the same accuracy rule (docs/semantics.md).
#pragma once  // per translation unit

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/attention-inl.h"
#include "simd/storage.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

#if defined(FASTATTN_DPBF16)
template <typename S>
constexpr bool kDotBf16 = std::is_same_v<S, BFloat16>;
#else
template <typename S>
constexpr bool kDotBf16 = false;
#endif

// Query rows -> pair words (row r at q + r * ceil(E/2)), unscaled: the softmax scale is
// applied to the float32 scores. Rows [nrows, tile_rows) are zero (padding).
template <typename RowRefT>
inline void pack_queries_bf16(const RowRefT* rows, int64_t nrows, int64_t tile_rows,
                              int64_t head_dim, uint32_t* q);
// Keys [0, n) as pair panels: column tile c (kColTile keys) holds, for each pair of head_dim
// elements ep, kColTile words (one per key); zero-padded to ncols keys.
inline void pack_keys_bf16(const BFloat16* k, int64_t row_stride, int64_t n, int64_t ncols,
                           int64_t head_dim, uint32_t* kt);
// Values [0, n) as pair panels: column chunk c (kColTile of the head_dim_v columns) holds,
// for each key pair, kColTile words (one per column); panel_rows / 2 pairs per chunk, a
// missing odd key zero. Returns whether every value is finite (as pack_values).
inline bool pack_values_bf16(const BFloat16* v, int64_t row_stride, int64_t n, int64_t head_dim_v,
                             int64_t panel_rows, uint32_t* vp);
// s[r, 0:ncols) = scale * (q[r] . K^T[:, 0:ncols)), as scores_tile (rmax likewise).
inline void scores_tile_bf16(const uint32_t* q, int64_t head_dim, const uint32_t* kt, float scale,
                             float* s, int64_t s_ld, int64_t nrows, int64_t ncols, float* rmax);
// dst[0:L) = the float32 lanes of x rounded to bfloat16 (nearest even): the exp pass writes
// P this way, so a row of P is a row of bfloat16 pairs along the keys (key j in the low
// half of word j / 2) without a pass of its own.
template <typename V>
inline void store_bf16(uint16_t* dst, V x);
// acc[r, :] += P[r, 0:n) V for kRowTile rows, as pv_tile, with P already bfloat16 pairs
// (row r at pb + r * pb_ld; pairs start at key 0 of vp; a pair past n holds a zero P).
inline void pv_tile_bf16(const uint32_t* pb, int64_t pb_ld, int64_t n, const uint32_t* vp,
                         int64_t panel_pairs, int64_t dv_pad, float* acc, int64_t acc_ld);

#if defined(FASTATTN_DPBF16)

inline uint32_t bf16_pair(const BFloat16* x, int64_t e, int64_t len) {
  return uint32_t(x[e].bits) | (e + 1 < len ? uint32_t(x[e + 1].bits) << 16 : 0u);
}

template <typename RowRefT>
inline void pack_queries_bf16(const RowRefT* rows, int64_t nrows, int64_t tile_rows,
                              int64_t head_dim, uint32_t* q) {
  const int64_t E2 = (head_dim + 1) / 2, whole = head_dim / 2;
  for (int64_t r = 0; r < nrows; ++r) {  // a row's whole pairs are its words (e low), as is
    std::memcpy(q + r * E2, rows[r].q, size_t(whole) * sizeof(uint32_t));
    if (whole < E2) q[r * E2 + whole] = bf16_pair(rows[r].q, 2 * whole, head_dim);
  }
  std::memset(q + nrows * E2, 0, size_t((tile_rows - nrows) * E2) * sizeof(uint32_t));
}

#if defined(FASTATTN_NEON)
// BFDOT (vbfdotq_laneq_f32): four float32 lanes, each plus the pair product of its pair word
// of a panel vector with one pair word of a row (a lane of a 4-word vector), broadcast. A
// column tile is kColTile = 8 keys (value columns): two vectors.
static_assert(kColTile<float> == 8 && kLanes<float> == 4, "a column tile is two 4-word vectors");

inline uint32x4_t load_words(const void* p) {  // 4 words at any 2-byte alignment
  return vreinterpretq_u32_u8(vld1q_u8(static_cast<const uint8_t*>(p)));
}

// acc[r][u] += rows[r] . panel over `steps` pair words: row r's words at a + r * a_ld,
// the panel's kColTile words per step (vector u: words 4u..4u+3). The rows' words are read
// four at a time and taken by lane, so the 8 rows' 4-word vectors, the 16 accumulators and
// the two panel vectors fit the 32 registers.
inline void bfdot_tile(const uint32_t* a, int64_t a_ld, int64_t steps, const uint32_t* panel,
                       float32x4_t (&acc)[kRowTile][2]) {
  constexpr int RT = kRowTile, CT = kColTile<float>;
  int64_t t = 0;
  for (; t + 4 <= steps; t += 4) {
    uint32x4_t w[RT];
    for (int rr = 0; rr < RT; ++rr) w[rr] = vld1q_u32(a + rr * a_ld + t);
#define FASTATTN_BFDOT_LANE(l)                                                           \
  {                                                                                      \
    const bfloat16x8_t k0 = vreinterpretq_bf16_u32(vld1q_u32(panel + (t + l) * CT));     \
    const bfloat16x8_t k1 = vreinterpretq_bf16_u32(vld1q_u32(panel + (t + l) * CT + 4)); \
    for (int rr = 0; rr < RT; ++rr) {                                                    \
      const bfloat16x8_t x = vreinterpretq_bf16_u32(w[rr]);                              \
      acc[rr][0] = vbfdotq_laneq_f32(acc[rr][0], k0, x, l);                              \
      acc[rr][1] = vbfdotq_laneq_f32(acc[rr][1], k1, x, l);                              \
    }                                                                                    \
  }
    FASTATTN_BFDOT_LANE(0)
    FASTATTN_BFDOT_LANE(1)
    FASTATTN_BFDOT_LANE(2)
    FASTATTN_BFDOT_LANE(3)
#undef FASTATTN_BFDOT_LANE
  }
  for (; t < steps; ++t) {
    const bfloat16x8_t k0 = vreinterpretq_bf16_u32(vld1q_u32(panel + t * CT));
    const bfloat16x8_t k1 = vreinterpretq_bf16_u32(vld1q_u32(panel + t * CT + 4));
    for (int rr = 0; rr < RT; ++rr) {
      const bfloat16x8_t x = vreinterpretq_bf16_u32(vld1q_dup_u32(a + rr * a_ld + t));
      acc[rr][0] = vbfdotq_laneq_f32(acc[rr][0], k0, x, 0);
      acc[rr][1] = vbfdotq_laneq_f32(acc[rr][1], k1, x, 0);
    }
  }
}

// A 4 x 4 transpose of words: out[w] = {r0[w], r1[w], r2[w], r3[w]}.
inline void transpose_words(uint32x4_t (&r)[4]) {
  const uint32x4x2_t p0 = vtrnq_u32(r[0], r[1]), p1 = vtrnq_u32(r[2], r[3]);
  r[0] = vcombine_u32(vget_low_u32(p0.val[0]), vget_low_u32(p1.val[0]));
  r[1] = vcombine_u32(vget_low_u32(p0.val[1]), vget_low_u32(p1.val[1]));
  r[2] = vcombine_u32(vget_high_u32(p0.val[0]), vget_high_u32(p1.val[0]));
  r[3] = vcombine_u32(vget_high_u32(p0.val[1]), vget_high_u32(p1.val[1]));
}

inline void pack_keys_bf16(const BFloat16* k, int64_t row_stride, int64_t n, int64_t ncols,
                           int64_t head_dim, uint32_t* kt) {
  constexpr int CT = kColTile<float>;
  const int64_t E2 = (head_dim + 1) / 2, whole = head_dim / 2;
  for (int64_t j0 = 0; j0 < ncols; j0 += CT) {
    uint32_t* dst = kt + (j0 / CT) * E2 * CT;
    int64_t ep0 = 0;
    if (j0 + CT <= n)  // whole tiles: 4 keys x 4 pair words at a time, transposed
      for (; ep0 + 4 <= whole; ep0 += 4)
        for (int half = 0; half < 2; ++half) {
          uint32x4_t r[4];
          for (int i = 0; i < 4; ++i)
            r[i] = load_words(k + (j0 + 4 * half + i) * row_stride + 2 * ep0);
          transpose_words(r);
          for (int w = 0; w < 4; ++w) vst1q_u32(dst + (ep0 + w) * CT + 4 * half, r[w]);
        }
    for (int64_t j = 0; j < CT; ++j) {  // the rest one word at a time; keys past n zero
      if (j0 + j < n) {
        const BFloat16* kr = k + (j0 + j) * row_stride;
        for (int64_t ep = ep0; ep < E2; ++ep) dst[ep * CT + j] = bf16_pair(kr, 2 * ep, head_dim);
      } else {
        for (int64_t ep = ep0; ep < E2; ++ep) dst[ep * CT + j] = 0;
      }
    }
  }
}

inline bool pack_values_bf16(const BFloat16* v, int64_t row_stride, int64_t n, int64_t head_dim_v,
                             int64_t panel_rows, uint32_t* vp) {
  constexpr int CT = kColTile<float>;  // 8 columns: one vector of bfloat16 per key row
  const uint16x8_t exp_bits = vdupq_n_u16(0x7f80);
  uint16x8_t bad = vdupq_n_u16(0);  // a lane that held an inf or NaN (exponent all ones)
  const int64_t pairs = (n + 1) / 2;
  for (int64_t c = 0; c < head_dim_v; c += CT) {
    const int64_t w = imin(CT, head_dim_v - c);
    uint32_t* dst = vp + (c / CT) * (panel_rows / 2) * CT;
    auto row = [&](int64_t j) {  // key j's columns [c, c + w), zero past w
      if (w == CT) return vld1q_u16(reinterpret_cast<const uint16_t*>(v + j * row_stride + c));
      uint16_t x[CT] = {};
      std::memcpy(x, v + j * row_stride + c, size_t(w) * sizeof(uint16_t));
      return vld1q_u16(x);
    };
    for (int64_t jp = 0; jp < pairs; ++jp) {
      const int64_t j = 2 * jp;
      const uint16x8_t a = row(j), b = j + 1 < n ? row(j + 1) : vdupq_n_u16(0);
      bad = vorrq_u16(bad, vceqq_u16(vandq_u16(a, exp_bits), exp_bits));
      bad = vorrq_u16(bad, vceqq_u16(vandq_u16(b, exp_bits), exp_bits));
      // Word i: column i of key j in the low 16 bits, of key j + 1 in the high ones.
      vst1q_u16(reinterpret_cast<uint16_t*>(dst + jp * CT), vzip1q_u16(a, b));
      vst1q_u16(reinterpret_cast<uint16_t*>(dst + jp * CT + CT / 2), vzip2q_u16(a, b));
    }
  }
  return vmaxvq_u16(bad) == 0;
}

inline void scores_tile_bf16(const uint32_t* q, int64_t head_dim, const uint32_t* kt, float scale,
                             float* s, int64_t s_ld, int64_t nrows, int64_t ncols, float* rmax) {
  constexpr int RT = kRowTile, CT = kColTile<float>;
  const int64_t E2 = (head_dim + 1) / 2;
  const float32x4_t sc = vdupq_n_f32(scale);
  for (int64_t r = 0; r < nrows; r += RT) {
    Vec<float> vm[RT];
    for (int rr = 0; rr < RT; ++rr) vm[rr] = Vec<float>{} - __builtin_inff();
    for (int64_t c = 0; c < ncols; c += CT) {
      float32x4_t acc[RT][2];
      for (int rr = 0; rr < RT; ++rr) acc[rr][0] = acc[rr][1] = vdupq_n_f32(0);
      bfdot_tile(q + r * E2, E2, E2, kt + (c / CT) * E2 * CT, acc);
      for (int rr = 0; rr < RT; ++rr)
        for (int u = 0; u < 2; ++u) {
          const Vec<float> x = Vec<float>(vmulq_f32(acc[rr][u], sc));
          vstore(s + (r + rr) * s_ld + c + 4 * u, x);
          // vm = x > vm ? x : vm (a NaN x leaves vm), as the softmax's max pass compares.
          vm[rr] = x > vm[rr] ? x : vm[rr];
        }
    }
    if (rmax)
      for (int rr = 0; rr < RT; ++rr) {
        const float m = reduce_max<float>(vm[rr]);
        rmax[r + rr] = m > rmax[r + rr] ? m : rmax[r + rr];
      }
  }
}

template <typename V>
inline void store_bf16(uint16_t* dst, V x) {
  static_assert(sizeof(V) == 16, "one vector of float32 lanes");
  // BFCVTN: nearest even (the FPCR's rounding mode, which nothing here changes).
  vst1_u16(dst, vreinterpret_u16_bf16(vcvt_bf16_f32(float32x4_t(x))));
}

inline void pv_tile_bf16(const uint32_t* pb, int64_t pb_ld, int64_t n, const uint32_t* vp,
                         int64_t panel_pairs, int64_t dv_pad, float* acc, int64_t acc_ld) {
  constexpr int RT = kRowTile, CT = kColTile<float>;
  const int64_t pairs = (n + 1) / 2;
  for (int64_t c = 0; c < dv_pad; c += CT) {
    float32x4_t a[RT][2];
    for (int rr = 0; rr < RT; ++rr)
      for (int u = 0; u < 2; ++u) a[rr][u] = vld1q_f32(acc + rr * acc_ld + c + 4 * u);
    bfdot_tile(pb, pb_ld, pairs, vp + (c / CT) * panel_pairs * CT, a);
    for (int rr = 0; rr < RT; ++rr)
      for (int u = 0; u < 2; ++u) vst1q_f32(acc + rr * acc_ld + c + 4 * u, a[rr][u]);
  }
}

#else  // FASTATTN_NEON: AVX512-BF16

inline void pack_keys_bf16(const BFloat16* k, int64_t row_stride, int64_t n, int64_t ncols,
                           int64_t head_dim, uint32_t* kt) {
  constexpr int CT = kColTile<float>;
  const int64_t E2 = (head_dim + 1) / 2, whole = head_dim / 2;
  int64_t j0 = 0;
  // Whole column tiles: 16 keys x 16 pair words at a time, one load per key and a 16 x 16
  // word transpose in registers (transpose_lanes). A gather per 16 words did the same, but
  // gathers are slow (Zen 4: about 5 % of a 1x8 2048^2 E64 call's time went to them).
  static_assert(CT == 32 && kLanes<float> == 16, "a column tile is two 16-word halves");
  for (; j0 + CT <= n; j0 += CT) {
    uint32_t* dst = kt + (j0 / CT) * E2 * CT;
    for (int half = 0; half < 2; ++half) {
      const BFloat16* kh = k + (j0 + 16 * half) * row_stride;
      for (int64_t ep0 = 0; ep0 < whole; ep0 += 16) {
        const int64_t cnt = imin(16, whole - ep0);
        const __mmask16 m = __mmask16((uint32_t(1) << cnt) - 1);
        Vec<float> r[16];  // pair words as float lanes: moved, never computed on
        for (int i = 0; i < 16; ++i)
          r[i] = (Vec<float>)_mm512_maskz_loadu_epi32(m, kh + i * row_stride + 2 * ep0);
        transpose_lanes<float>(r);
        for (int64_t w = 0; w < cnt; ++w)
          _mm512_storeu_si512(dst + (ep0 + w) * CT + 16 * half, (__m512i)r[w]);
      }
    }
    if (whole < E2)
      for (int64_t j = 0; j < CT; ++j)
        dst[whole * CT + j] = k[(j0 + j) * row_stride + head_dim - 1].bits;
  }
  for (int64_t j = j0; j < ncols; ++j) {
    uint32_t* dst = kt + (j / CT) * E2 * CT + (j % CT);
    if (j < n) {
      const BFloat16* kr = k + j * row_stride;
      for (int64_t ep = 0; ep < whole; ++ep) {
        uint32_t w;
        std::memcpy(&w, kr + 2 * ep, sizeof(w));  // two bfloat16, little-endian: e low
        dst[ep * CT] = w;
      }
      if (whole < E2) dst[whole * CT] = kr[head_dim - 1].bits;
    } else {
      for (int64_t ep = 0; ep < E2; ++ep) dst[ep * CT] = 0;
    }
  }
}

inline bool pack_values_bf16(const BFloat16* v, int64_t row_stride, int64_t n, int64_t head_dim_v,
                             int64_t panel_rows, uint32_t* vp) {
  constexpr int CT = kColTile<float>;  // 32 columns: one zmm of bfloat16 per key row
  static_assert(CT == 32, "one 512-bit register holds a chunk's 32 bfloat16");
  // Word i of the low (high) half: column i (16 + i) of key j in the low 16 bits, of key
  // j + 1 in the high ones.
  alignas(64) static constexpr uint16_t kLo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                   37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                   11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr uint16_t kHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                                   53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58,
                                                   27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo_idx = _mm512_load_si512(kLo), hi_idx = _mm512_load_si512(kHi);
  const __m512i exp_bits = _mm512_set1_epi16(0x7f80);
  __mmask32 bad = 0;  // a lane that held an inf or NaN (exponent all ones)
  const int64_t pairs = (n + 1) / 2;
  for (int64_t c = 0; c < head_dim_v; c += CT) {
    const int64_t w = imin(CT, head_dim_v - c);
    const __mmask32 cols = w == CT ? ~__mmask32(0) : (__mmask32(1) << w) - 1;
    uint32_t* dst = vp + (c / CT) * (panel_rows / 2) * CT;
    for (int64_t jp = 0; jp < pairs; ++jp) {
      const int64_t j = 2 * jp;
      const __m512i a = _mm512_maskz_loadu_epi16(cols, v + j * row_stride + c);
      const __m512i b = j + 1 < n ? _mm512_maskz_loadu_epi16(cols, v + (j + 1) * row_stride + c)
                                  : _mm512_setzero_si512();
      bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(a, exp_bits), exp_bits) |
             _mm512_cmpeq_epi16_mask(_mm512_and_si512(b, exp_bits), exp_bits);
      _mm512_storeu_si512(dst + jp * CT, _mm512_permutex2var_epi16(a, lo_idx, b));
      _mm512_storeu_si512(dst + jp * CT + CT / 2, _mm512_permutex2var_epi16(a, hi_idx, b));
    }
  }
  return bad == 0;
}

// acc + the pair products of x with the pair word *w broadcast to every lane, the broadcast
// folded into vdpbf16ps's memory operand ({1to16}). Through _mm512_set1_epi32, GCC loads
// each row's word into a register with a vpbroadcastd of its own, which took 14 % of a
// bfloat16 call's samples; folded: 1x8 1024^2 E64 one thread, min CPU 12.1 ms against
// 12.4-13.2 (6 interleaved rounds). The pair products are symmetric, so the result is the
// same bits.
inline __m512 dpbf16_bcast(__m512 acc, __m512i x, const uint32_t* w) {
  __asm__("vdpbf16ps %[w]%{1to16%}, %[x], %[acc]" : [acc] "+v"(acc) : [x] "v"(x), [w] "m"(*w));
  return acc;
}

// One register tile: kRowTile rows x NV vectors of 16 columns.
template <int NV>
inline void scores_tile_bf16_cols(const uint32_t* q, int64_t E2, const uint32_t* panel,
                                  __m512 scale, float* s, int64_t s_ld, __m512* vm) {
  constexpr int RT = kRowTile, CT = kColTile<float>;
  __m512 acc[RT][NV];
  for (int rr = 0; rr < RT; ++rr)
    for (int u = 0; u < NV; ++u) acc[rr][u] = _mm512_setzero_ps();
  for (int64_t ep = 0; ep < E2; ++ep) {
    __m512i k[NV];
    // NV / 2 column tiles side by side: vectors 2t, 2t + 1 of tile t.
    for (int u = 0; u < NV; ++u)
      k[u] = _mm512_loadu_si512(panel + (u / 2) * E2 * CT + ep * CT + (u % 2) * 16);
    for (int rr = 0; rr < RT; ++rr)
      for (int u = 0; u < NV; ++u) acc[rr][u] = dpbf16_bcast(acc[rr][u], k[u], q + rr * E2 + ep);
  }
  for (int rr = 0; rr < RT; ++rr)
    for (int u = 0; u < NV; ++u) {
      const __m512 x = _mm512_mul_ps(acc[rr][u], scale);
      _mm512_storeu_ps(s + rr * s_ld + u * 16, x);
      // vm = x > vm ? x : vm (a NaN x leaves vm), as the softmax's max pass compares.
      if (vm) vm[rr] = (__m512)vmax((Vec<float>)x, (Vec<float>)vm[rr]);
    }
}

inline void scores_tile_bf16(const uint32_t* q, int64_t head_dim, const uint32_t* kt, float scale,
                             float* s, int64_t s_ld, int64_t nrows, int64_t ncols, float* rmax) {
  constexpr int RT = kRowTile, CT = kColTile<float>;
  const int64_t E2 = (head_dim + 1) / 2;
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t r = 0; r < nrows; r += RT) {
    __m512 vm[RT];
    for (int rr = 0; rr < RT; ++rr) vm[rr] = _mm512_set1_ps(-__builtin_inff());
    __m512* pm = rmax ? vm : nullptr;
    int64_t c = 0;
    for (; c + 2 * CT <= ncols; c += 2 * CT)
      scores_tile_bf16_cols<4>(q + r * E2, E2, kt + (c / CT) * E2 * CT, sc, s + r * s_ld + c, s_ld,
                               pm);
    for (; c < ncols; c += CT)
      scores_tile_bf16_cols<2>(q + r * E2, E2, kt + (c / CT) * E2 * CT, sc, s + r * s_ld + c, s_ld,
                               pm);
    if (rmax)
      for (int rr = 0; rr < RT; ++rr) {
        const float m = reduce_max<float>((Vec<float>)vm[rr]);
        rmax[r + rr] = m > rmax[r + rr] ? m : rmax[r + rr];
      }
  }
}

// One register tile of P V: kRowTile rows x NV vectors of 16 columns (NV / 2 chunks).
template <int NV>
inline void pv_tile_bf16_cols(const uint32_t* pb, int64_t pb_ld, int64_t pairs,
                              const uint32_t* panel, int64_t panel_pairs, float* acc,
                              int64_t acc_ld) {
  constexpr int RT = kRowTile, CT = kColTile<float>;
  __m512 a[RT][NV];
  for (int rr = 0; rr < RT; ++rr)
    for (int u = 0; u < NV; ++u) a[rr][u] = _mm512_loadu_ps(acc + rr * acc_ld + u * 16);
  for (int64_t jp = 0; jp < pairs; ++jp) {
    __m512i v[NV];
    for (int u = 0; u < NV; ++u)
      v[u] = _mm512_loadu_si512(panel + (u / 2) * panel_pairs * CT + jp * CT + (u % 2) * 16);
    for (int rr = 0; rr < RT; ++rr)
      for (int u = 0; u < NV; ++u) a[rr][u] = dpbf16_bcast(a[rr][u], v[u], pb + rr * pb_ld + jp);
  }
  for (int rr = 0; rr < RT; ++rr)
    for (int u = 0; u < NV; ++u) _mm512_storeu_ps(acc + rr * acc_ld + u * 16, a[rr][u]);
}

template <typename V>
inline void store_bf16(uint16_t* dst, V x) {
  static_assert(sizeof(V) == 64, "one zmm of float32 lanes");
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), (__m256i)_mm512_cvtneps_pbh((__m512)x));
}

inline void pv_tile_bf16(const uint32_t* pb, int64_t pb_ld, int64_t n, const uint32_t* vp,
                         int64_t panel_pairs, int64_t dv_pad, float* acc, int64_t acc_ld) {
  constexpr int CT = kColTile<float>;
  const int64_t pairs = (n + 1) / 2;
  int64_t c = 0;
  for (; c + 2 * CT <= dv_pad; c += 2 * CT)
    pv_tile_bf16_cols<4>(pb, pb_ld, pairs, vp + (c / CT) * panel_pairs * CT, panel_pairs, acc + c,
                         acc_ld);
  for (; c < dv_pad; c += CT)
    pv_tile_bf16_cols<2>(pb, pb_ld, pairs, vp + (c / CT) * panel_pairs * CT, panel_pairs, acc + c,
                         acc_ld);
}

#endif  // FASTATTN_NEON
#endif  // FASTATTN_DPBF16

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn
