// fastattn's CUDA kernels: the forward pass of scaled dot-product attention, additive
// attention and the masked softmax, for the CuPy path (fastattn/_cuda.py).
//
// Compiled at run time by NVRTC through cupy.RawModule with -std=c++17; the template
// instances are named by fastattn._cuda.KERNELS (name_expressions). NVRTC sees no host
// headers, so this file includes none: float16 conversions are one PTX instruction each,
// infinities come from bit patterns, and the math functions are NVRTC's built-ins.
//
// Layout contract (one params block of int64 per launch, written by fastattn/_cuda.py):
// sizes, flags and the within-group row/column strides first (AttentionParam /
// SoftmaxParam, in elements, any sign), then one row of element offsets per group
// (AttentionSlot / SoftmaxSlot). A group is one (batch..., query head) score matrix
// for attention and one run of rows for the softmax. Every array is addressed as
// base + group offset + row * row stride + column * column stride, so broadcast
// (stride 0), transposed, reversed and sliced inputs are read in place.
//
// The attention kernel is the plain flash-attention forward: one CTA owns kBlockQ query
// rows of one group (and kBlockV value columns), streams the visible keys in tiles of
// kBlockK through shared memory, computes the scores a feature chunk at a time,
// applies scale, softcap and masks, and keeps a running max and sum per row (online
// softmax) so no Lq x Lk buffer exists. float16 inputs are read into float32 tiles;
// all arithmetic is in the accumulation type Acc (float32, or float64 for float64).
// Correctness first: one thread per row does the softmax bookkeeping, no warp shuffles.

namespace fastattn_cuda {

// --------------------------------------------------------------------------------------
// Types and scalar helpers

struct half_t {
  unsigned short bits;  // IEEE binary16, as NumPy's float16 stores it
};

#if defined(FASTATTN_CUDA_EMULATION)
// The test suite's host emulation (tests/cuda_emulation.h) supplies the conversions.
__device__ __forceinline__ float half_to_float(half_t h) {
  return fastattn_emulation_half_to_float(h.bits);
}
__device__ __forceinline__ half_t float_to_half(float f) {
  return half_t{fastattn_emulation_float_to_half(f)};
}
#else
__device__ __forceinline__ float half_to_float(half_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
}
__device__ __forceinline__ half_t float_to_half(float f) {
  half_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));  // round to nearest even
  return h;
}
#endif

template <typename Acc>
__device__ __forceinline__ Acc load(const half_t* p, long long i) {
  return Acc(half_to_float(p[i]));
}
template <typename Acc>
__device__ __forceinline__ Acc load(const float* p, long long i) {
  return Acc(p[i]);
}
template <typename Acc>
__device__ __forceinline__ Acc load(const double* p, long long i) {
  return Acc(p[i]);
}

__device__ __forceinline__ void store(half_t* p, long long i, float x) { p[i] = float_to_half(x); }
__device__ __forceinline__ void store(float* p, long long i, float x) { p[i] = x; }
__device__ __forceinline__ void store(double* p, long long i, double x) { p[i] = x; }

__device__ __forceinline__ float exp_of(float x) { return expf(x); }
__device__ __forceinline__ double exp_of(double x) { return exp(x); }
__device__ __forceinline__ float log_of(float x) { return logf(x); }
__device__ __forceinline__ double log_of(double x) { return log(x); }
__device__ __forceinline__ float tanh_of(float x) { return tanhf(x); }
__device__ __forceinline__ double tanh_of(double x) { return tanh(x); }
// fmax ignores a NaN operand; a NaN score still reaches its row through exp(NaN) = NaN.
__device__ __forceinline__ float max_of(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double max_of(double a, double b) { return fmax(a, b); }

__device__ __forceinline__ float minus_infinity(float) {
  return __int_as_float(static_cast<int>(0xff800000u));
}
__device__ __forceinline__ double minus_infinity(double) {
  return __longlong_as_double(static_cast<long long>(0xfff0000000000000ull));
}

__device__ __forceinline__ long long min_of(long long a, long long b) { return a < b ? a : b; }
__device__ __forceinline__ long long max_of(long long a, long long b) { return a > b ? a : b; }

// The shift that keeps exp() finite: the running max, or 0 while the row has seen nothing
// (max -inf), so exp(-inf - 0) = 0 instead of exp(-inf + inf) = NaN.
template <typename Acc>
__device__ __forceinline__ Acc safe_shift(Acc row_max) {
  return row_max == minus_infinity(Acc()) ? Acc(0) : row_max;
}

// --------------------------------------------------------------------------------------
// Attention

enum AttentionParam : int {
  kGroups = 0,     // batch... x query heads
  kQueries,        // Lq
  kKeys,           // Lk
  kFeatures,       // E (query/key features; additive: hidden units)
  kValueFeatures,  // Ev
  kCausal,         // 0 or 1
  kDiagOffset,     // 0 (top-left) or Lk - Lq (bottom-right)
  kLeft,           // window sides, -1 = unbounded
  kRight,
  kQueryRow,
  kQueryCol,
  kKeyRow,
  kKeyCol,
  kValueRow,
  kValueCol,
  kMaskRow,
  kMaskCol,
  kLensRow,
  kOutRow,
  kOutCol,
  kLseRow,
  kWeightsRow,
  kWeightsCol,
  kAttentionHeader
};

enum AttentionSlot : int {
  kSlotQuery = 0,
  kSlotKey,
  kSlotValue,
  kSlotMask,
  kSlotLens,
  kSlotOut,
  kSlotLse,
  kSlotWeights,
  kAttentionSlots
};

constexpr int kThreads = 128;
constexpr int kBlockQ = 16;  // query rows per CTA
constexpr int kBlockK = 32;  // keys per tile
constexpr int kBlockE = 32;  // features per chunk of the score product
constexpr int kBlockV = 64;  // value columns per CTA (the grid covers Ev in chunks)
constexpr int kScoresPerThread = kBlockQ * kBlockK / kThreads;
constexpr int kOutPerThread = kBlockQ * kBlockV / kThreads;
static_assert(kBlockQ * kBlockK % kThreads == 0, "score tile must split evenly");
static_assert(kBlockQ * kBlockV % kThreads == 0, "output tile must split evenly");
static_assert(kBlockQ <= kThreads && kBlockE <= kThreads, "one thread per row / feature");

// out = softmax(score(q, k) + mask) v, per group and query row; score is
// scale * q.k (softcapped when softcap > 0) or, for kAdditive, w . tanh(q + k) with q and
// k the projected queries and keys and w = score_weights. bool_mask/float_mask share the
// mask strides (only one is given). lse and weights are optional (null).
template <typename TQK, typename TV, typename Acc, bool kAdditive>
__global__ void __launch_bounds__(kThreads)
    attention_forward(const TQK* __restrict__ q, const TQK* __restrict__ k,
                      const TV* __restrict__ v, const unsigned char* __restrict__ bool_mask,
                      const Acc* __restrict__ float_mask, const long long* __restrict__ valid_lens,
                      const Acc* __restrict__ score_weights, TV* __restrict__ out,
                      Acc* __restrict__ lse, TV* __restrict__ weights,
                      const long long* __restrict__ params, double scale, double softcap) {
  __shared__ Acc q_tile[kBlockQ][kBlockE + 1];
  __shared__ Acc k_tile[kBlockK][kBlockE + 1];
  __shared__ Acc w_tile[kBlockE];
  __shared__ Acc v_tile[kBlockK][kBlockV];
  __shared__ Acc p_tile[kBlockQ][kBlockK + 1];
  __shared__ Acc row_max[kBlockQ];
  __shared__ Acc row_sum[kBlockQ];
  __shared__ Acc row_rescale[kBlockQ];
  __shared__ long long row_begin[kBlockQ];  // visible keys of each row: [begin, end)
  __shared__ long long row_end[kBlockQ];
  __shared__ long long keys_begin[1];  // the union over the CTA's rows
  __shared__ long long keys_end[1];

  const long long groups = params[kGroups], lq = params[kQueries], lk = params[kKeys];
  const long long features = params[kFeatures], value_features = params[kValueFeatures];
  const bool causal = params[kCausal] != 0;
  const long long diag = params[kDiagOffset], left = params[kLeft], right = params[kRight];
  const long long q_row = params[kQueryRow], q_col = params[kQueryCol];
  const long long k_row = params[kKeyRow], k_col = params[kKeyCol];
  const long long v_row = params[kValueRow], v_col = params[kValueCol];
  const long long m_row = params[kMaskRow], m_col = params[kMaskCol];
  const long long lens_row = params[kLensRow];
  const long long o_row = params[kOutRow], o_col = params[kOutCol];
  const long long lse_row = params[kLseRow];
  const long long w_row = params[kWeightsRow], w_col = params[kWeightsCol];

  const Acc neg_inf = minus_infinity(Acc());
  const Acc score_scale = Acc(scale), cap = Acc(softcap);
  const int tid = threadIdx.x;
  const long long q_tiles = (lq + kBlockQ - 1) / kBlockQ;
  const long long v_chunks = value_features > 0 ? (value_features + kBlockV - 1) / kBlockV : 1;
  const long long items = groups * q_tiles * v_chunks;

  for (long long item = blockIdx.x; item < items; item += gridDim.x) {
    const long long chunk = item % v_chunks;
    const long long i0 = (item / v_chunks) % q_tiles * kBlockQ;
    const long long c0 = chunk * kBlockV;
    const long long* off = params + kAttentionHeader + item / v_chunks / q_tiles * kAttentionSlots;
    const TQK* q_g = q + off[kSlotQuery];
    const TQK* k_g = k + off[kSlotKey];
    const TV* v_g = v + off[kSlotValue];
    const unsigned char* bmask_g = bool_mask ? bool_mask + off[kSlotMask] : nullptr;
    const Acc* fmask_g = float_mask ? float_mask + off[kSlotMask] : nullptr;
    const long long* lens_g = valid_lens ? valid_lens + off[kSlotLens] : nullptr;
    TV* out_g = out + off[kSlotOut];
    Acc* lse_g = lse ? lse + off[kSlotLse] : nullptr;
    TV* weights_g = weights ? weights + off[kSlotWeights] : nullptr;

    __syncthreads();  // the previous item is done with the shared row state
    if (tid < kBlockQ) {
      // valid_lens, causal and window leave each row one contiguous range of keys.
      const long long i = i0 + tid;
      long long begin = 0, end = 0;
      if (i < lq) {
        end = lk;
        if (lens_g) end = min_of(end, lens_g[i * lens_row]);
        const long long d = i + diag;
        if (causal) end = min_of(end, d + 1);
        if (right >= 0) end = min_of(end, d + right + 1);
        if (left >= 0) begin = max_of(begin, d - left);
        if (end < begin) end = begin;
      }
      row_begin[tid] = begin;
      row_end[tid] = end;
      row_max[tid] = neg_inf;
      row_sum[tid] = Acc(0);
    }
    __syncthreads();
    if (tid == 0) {
      long long begin = lk, end = 0;
      for (int r = 0; r < kBlockQ; ++r) {
        if (row_begin[r] < row_end[r]) {
          begin = min_of(begin, row_begin[r]);
          end = max_of(end, row_end[r]);
        }
      }
      if (end <= begin) begin = end = 0;
      keys_begin[0] = begin;
      keys_end[0] = end;
    }
    __syncthreads();
    const long long key_begin = keys_begin[0], key_end = keys_end[0];

    Acc o[kOutPerThread];
    for (int t = 0; t < kOutPerThread; ++t) o[t] = Acc(0);

    // Pass 0 streams the visible keys through the online softmax and writes out (and lse);
    // pass 1, only when weights are asked for, recomputes every key's score and writes
    // its weight with the final max and sum.
    const int passes = chunk == 0 && weights_g ? 2 : 1;
    for (int pass = 0; pass < passes; ++pass) {
      const long long first = pass == 0 ? key_begin : 0, last = pass == 0 ? key_end : lk;
      for (long long j0 = first; j0 < last; j0 += kBlockK) {
        // Scores of keys j0 .. j0 + kBlockK - 1 for this thread's (row, key) pairs.
        Acc s[kScoresPerThread];
        for (int t = 0; t < kScoresPerThread; ++t) s[t] = Acc(0);
        for (long long e0 = 0; e0 < features; e0 += kBlockE) {
          __syncthreads();  // everyone is done with the previous chunk
          for (int idx = tid; idx < kBlockQ * kBlockE; idx += kThreads) {
            const int r = idx / kBlockE, c = idx % kBlockE;
            const long long i = i0 + r, e = e0 + c;
            q_tile[r][c] =
                (i < lq && e < features) ? load<Acc>(q_g, i * q_row + e * q_col) : Acc(0);
          }
          for (int idx = tid; idx < kBlockK * kBlockE; idx += kThreads) {
            const int r = idx / kBlockE, c = idx % kBlockE;
            const long long j = j0 + r, e = e0 + c;
            k_tile[r][c] =
                (j < lk && e < features) ? load<Acc>(k_g, j * k_row + e * k_col) : Acc(0);
          }
          if constexpr (kAdditive) {
            if (tid < kBlockE) w_tile[tid] = e0 + tid < features ? score_weights[e0 + tid] : Acc(0);
          }
          __syncthreads();
          for (int t = 0; t < kScoresPerThread; ++t) {
            const int idx = tid + t * kThreads, r = idx / kBlockK, c = idx % kBlockK;
            Acc sum = s[t];
#pragma unroll 4
            for (int e = 0; e < kBlockE; ++e) {
              if constexpr (kAdditive) {
                sum += w_tile[e] * tanh_of(q_tile[r][e] + k_tile[c][e]);
              } else {
                sum += q_tile[r][e] * k_tile[c][e];
              }
            }
            s[t] = sum;
          }
        }
        // Scale, softcap, masks: -inf where the key is not visible. Rows past Lq have an
        // empty range, so no mask entry outside the arrays is read.
        for (int t = 0; t < kScoresPerThread; ++t) {
          const int idx = tid + t * kThreads, r = idx / kBlockK, c = idx % kBlockK;
          const long long i = i0 + r, j = j0 + c;
          bool visible = j >= row_begin[r] && j < row_end[r];
          if (visible && bmask_g) visible = bmask_g[i * m_row + j * m_col] != 0;
          Acc x = s[t] * score_scale;
          if (cap > Acc(0)) x = cap * tanh_of(x / cap);
          if (visible && fmask_g) {  // a -inf entry removes the key, as False does
            const Acc f = fmask_g[i * m_row + j * m_col];
            visible = f != neg_inf;
            x += f;
          }
          s[t] = visible ? x : neg_inf;
        }

        if (pass == 1) {
          for (int t = 0; t < kScoresPerThread; ++t) {
            const int idx = tid + t * kThreads, r = idx / kBlockK, c = idx % kBlockK;
            const long long i = i0 + r, j = j0 + c;
            if (i < lq && j < lk) {
              const Acc total = row_sum[r];
              const Acc w =
                  total == Acc(0) ? Acc(0) : exp_of(s[t] - safe_shift(row_max[r])) / total;
              store(weights_g, i * w_row + j * w_col, w);
            }
          }
          continue;  // the next tile starts with a barrier (features >= 1)
        }

        for (int t = 0; t < kScoresPerThread; ++t) {
          const int idx = tid + t * kThreads;
          p_tile[idx / kBlockK][idx % kBlockK] = s[t];
        }
        for (int idx = tid; idx < kBlockK * kBlockV; idx += kThreads) {
          const int r = idx / kBlockV, c = idx % kBlockV;
          const long long j = j0 + r, col = c0 + c;
          v_tile[r][c] =
              (j < lk && col < value_features) ? load<Acc>(v_g, j * v_row + col * v_col) : Acc(0);
        }
        __syncthreads();
        if (tid < kBlockQ) {  // online softmax: one thread per row
          const int r = tid;
          const Acc old_max = row_max[r];
          Acc new_max = old_max;
          for (int c = 0; c < kBlockK; ++c) new_max = max_of(new_max, p_tile[r][c]);
          const Acc shift = safe_shift(new_max);
          Acc sum = Acc(0);
          for (int c = 0; c < kBlockK; ++c) {
            const Acc p = exp_of(p_tile[r][c] - shift);
            p_tile[r][c] = p;
            sum += p;
          }
          const Acc rescale = exp_of(old_max - shift);  // exactly 1 while the max holds
          row_rescale[r] = rescale;
          row_sum[r] = row_sum[r] * rescale + sum;
          row_max[r] = new_max;
        }
        __syncthreads();
        for (int t = 0; t < kOutPerThread; ++t) {
          const int idx = tid + t * kThreads, r = idx / kBlockV, c = idx % kBlockV;
          Acc acc = o[t] * row_rescale[r];
#pragma unroll 4
          for (int j = 0; j < kBlockK; ++j) {
            const Acc p = p_tile[r][j];
            if (p != Acc(0)) acc += p * v_tile[j][c];  // unseen keys' values may be NaN
          }
          o[t] = acc;
        }
        __syncthreads();  // p_tile and v_tile are rewritten by the next tile
      }

      if (pass == 0) {
        for (int t = 0; t < kOutPerThread; ++t) {
          const int idx = tid + t * kThreads, r = idx / kBlockV, c = idx % kBlockV;
          const long long i = i0 + r, col = c0 + c;
          if (i < lq && col < value_features) {
            const Acc total = row_sum[r];
            store(out_g, i * o_row + col * o_col, total == Acc(0) ? Acc(0) : o[t] / total);
          }
        }
        if (chunk == 0 && lse_g && tid < kBlockQ && i0 + tid < lq) {
          const Acc total = row_sum[tid];
          lse_g[(i0 + tid) * lse_row] = total == Acc(0) ? neg_inf : row_max[tid] + log_of(total);
        }
      }
    }
  }
}

// --------------------------------------------------------------------------------------
// Masked softmax

enum SoftmaxParam : int {
  kRowGroups = 0,  // groups of rows (all axes but the last two of the moved x)
  kRowsPerGroup,
  kRowLength,  // entries per row (x.shape[axis])
  kInRow,
  kInCol,
  kKeepRow,  // the bool mask
  kKeepCol,
  kRowLensStride,
  kResultRow,
  kResultCol,
  kSoftmaxHeader
};

enum SoftmaxSlot : int { kSlotIn = 0, kSlotKeep, kSlotRowLens, kSlotResult, kSoftmaxSlots };

// y = softmax(x) over each row's kept entries (j < valid_len and mask true); rows with
// nothing kept are 0. One CTA per row: each thread keeps a running (max, sum) over its
// entries, the CTA merges them in a fixed tree, then every entry is written.
template <typename T, typename Acc>
__global__ void __launch_bounds__(kThreads)
    masked_softmax_forward(const T* __restrict__ x, const unsigned char* __restrict__ keep,
                           const long long* __restrict__ valid_lens, T* __restrict__ y,
                           const long long* __restrict__ params) {
  __shared__ Acc part_max[kThreads];
  __shared__ Acc part_sum[kThreads];

  const long long per_group = params[kRowsPerGroup], n = params[kRowLength];
  const long long rows = params[kRowGroups] * per_group;
  const long long x_row = params[kInRow], x_col = params[kInCol];
  const long long keep_row = params[kKeepRow], keep_col = params[kKeepCol];
  const long long lens_stride = params[kRowLensStride];
  const long long y_row = params[kResultRow], y_col = params[kResultCol];
  const Acc neg_inf = minus_infinity(Acc());
  const int tid = threadIdx.x;

  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    const long long i = row % per_group;
    const long long* off = params + kSoftmaxHeader + row / per_group * kSoftmaxSlots;
    const T* x_r = x + off[kSlotIn] + i * x_row;
    const unsigned char* keep_r = keep ? keep + off[kSlotKeep] + i * keep_row : nullptr;
    T* y_r = y + off[kSlotResult] + i * y_row;
    const long long end =
        valid_lens ? min_of(n, valid_lens[off[kSlotRowLens] + i * lens_stride]) : n;

    Acc m = neg_inf, l = Acc(0);
    for (long long j = tid; j < end; j += kThreads) {
      if (keep_r && keep_r[j * keep_col] == 0) continue;
      const Acc s = load<Acc>(x_r, j * x_col);
      const Acc new_max = max_of(m, s);
      const Acc shift = safe_shift(new_max);
      l = l * exp_of(m - shift) + exp_of(s - shift);  // a NaN or +inf entry makes l NaN
      m = new_max;
    }
    __syncthreads();  // the previous row's readers of part_* are done
    part_max[tid] = m;
    part_sum[tid] = l;
    for (int width = kThreads / 2; width > 0; width /= 2) {
      __syncthreads();
      if (tid < width) {
        const Acc m1 = part_max[tid], m2 = part_max[tid + width];
        const Acc new_max = max_of(m1, m2);
        const Acc shift = safe_shift(new_max);
        part_sum[tid] =
            part_sum[tid] * exp_of(m1 - shift) + part_sum[tid + width] * exp_of(m2 - shift);
        part_max[tid] = new_max;
      }
    }
    __syncthreads();
    const Acc total = part_sum[0], shift = safe_shift(part_max[0]);
    for (long long j = tid; j < n; j += kThreads) {
      const bool kept = j < end && (!keep_r || keep_r[j * keep_col] != 0);
      const Acc s = kept ? load<Acc>(x_r, j * x_col) : neg_inf;
      store(y_r, j * y_col, total == Acc(0) ? Acc(0) : exp_of(s - shift) / total);
    }
  }
}

}  // namespace fastattn_cuda
