// What a bool mask leaves visible, summarised once per call so that the driver and the
// engines skip what it hides (issue: masks that exclude whole blocks cost nothing). Per
// distinct mask row (broadcast axes counted once), the summary holds
//   - the first and one-past-last visible key, and whether every key between them is
//     visible (the row is an interval: then the row's key range says all, and the mask
//     itself is not read again);
//   - per chunk of kChunk keys (at multiples of kChunk, whatever the plan), a bit "some key
//     visible" and a bit "every key visible".
// It is built from one visible-key bitmap per chunk (a compare and a movemask per
// vector: match_bits64). Skipping changes no arithmetic on kept keys: a hidden key's probability is
// exactly 0, which adds nothing to a row's sum or output, and the blocked kernels keep columns at
// the same lane positions and keys in the same order whatever they skip. Per ISA (include only
// inside a TU that defines FASTATTN_ISA_NS).
#pragma once  // per translation unit

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "api/params.h"
#include "kernels/attention-inl.h"
#include "kernels/parallel-inl.h"
#include "simd/vec-inl.h"

namespace fastattn {
namespace FASTATTN_ISA_NS {

constexpr int64_t kChunk = 64;  // keys per summary chunk
static_assert(kChunk % kColTile<double> == 0 && kChunk % kColTile<float> == 0,
              "chunks must start on register-tile columns");

// Header words of a summary row, then `words` "some visible" chunk words, then `words`
// "all visible" chunk words (chunk c is bit c % 64 of word c / 64).
enum : int64_t { kSumFirst = 0, kSumLast = 1, kSumInterval = 2, kSumChunky = 3, kSumHeader = 4 };

// The summary of one call's mask; rows are found like the mask's own rows (a
// broadcast axis has stride 0).
struct MaskSummary {
  uint64_t* data = nullptr;  // null: no summary (no mask, or it could not be allocated)
  bool is_float = false;     // of the float mask (whose finite entries an interval row still adds)
  int64_t words = 0;         // chunk words per kind
  int64_t row_words = 0;     // kSumHeader + 2 * words
  int64_t batch_stride[kMaxBatchDims] = {};
  int64_t head_stride = 0, row_stride = 0;
  int64_t rows = 0;    // distinct mask rows
  bool owned = false;  // data was allocated here (std::free it); else the call's prebuilt one
};

// Whether chunk c is set in a chunk bit set.
inline bool chunk_bit(const uint64_t* bits, int64_t c) { return (bits[c / 64] >> (c % 64)) & 1; }

// Whether some chunk c in [c0, c1) has its bit set in the words word(0), word(1), ...
template <typename F>
inline bool any_chunk(int64_t c0, int64_t c1, F word) {
  for (int64_t w = c0 / 64; c0 < c1 && w * 64 < c1; ++w) {
    uint64_t keep = ~uint64_t(0);
    if (w == c0 / 64) keep &= ~uint64_t(0) << (c0 % 64);
    if (w == (c1 - 1) / 64) keep &= ~uint64_t(0) >> (63 - (c1 - 1) % 64);
    if (word(w) & keep) return true;
  }
  return false;
}

// Bit j set where the mask entry m[(c0 + j) * cs] leaves its key visible, j < n <= kChunk
// (a true bool; a float other than -inf, which removes its key exactly as False does:
// docs/semantics.md#float-mask). A whole contiguous chunk is one bitmap compare
// (match_bits64); a strided row or the short last chunk goes entry by entry.
template <typename E>
inline uint64_t visible_bits(const E* m, int64_t cs, int64_t c0, int64_t n) {
  static_assert(kChunk == 64, "one 64-bit word per chunk");
  const E hidden = std::is_same_v<E, uint8_t> ? E(0) : -E(__builtin_inf());
  if (cs == 1 && n == kChunk) return ~match_bits64(m + c0, hidden);
  uint64_t b = 0;
  for (int64_t j = 0; j < n; ++j) b |= uint64_t(m[(c0 + j) * cs] != hidden) << j;
  return b;
}

// Summarises the mask row m (len keys, column stride cs; bool bytes or float entries) into
// dst (row_words words), from each chunk's visible-key bitmap: its some/all bits, and the
// row's first and last visible keys and whether it is an interval from the bitmaps of the
// first and last chunks that keep a key.
template <typename E>
inline void summarise_row(const E* m, int64_t cs, int64_t len, int64_t words, uint64_t* dst) {
  uint64_t* some = dst + kSumHeader;
  uint64_t* all = some + words;
  for (int64_t w = 0; w < 2 * words; ++w) some[w] = 0;  // a word or two: no memset call
  int64_t first_chunk = -1, last_chunk = -1;
  uint64_t first_bits = 0, last_bits = 0;
  for (int64_t c0 = 0; c0 < len; c0 += kChunk) {
    const int64_t n = imin(kChunk, len - c0);
    const uint64_t bits = visible_bits(m, cs, c0, n);
    if (!bits) continue;
    const int64_t c = c0 / kChunk;
    some[c / 64] |= uint64_t(1) << (c % 64);
    if (bits == (n == 64 ? ~uint64_t(0) : (uint64_t(1) << n) - 1))
      all[c / 64] |= uint64_t(1) << (c % 64);
    if (first_chunk < 0) {
      first_chunk = c;
      first_bits = bits;
    }
    last_chunk = c;
    last_bits = bits;
  }
  if (first_chunk < 0) {
    dst[kSumFirst] = dst[kSumLast] = 0;
    dst[kSumInterval] = 1;
    dst[kSumChunky] = 0;
    return;
  }
  const int lo_bit = __builtin_ctzll(first_bits), hi_bit = 63 - __builtin_clzll(last_bits);
  const int64_t first = first_chunk * kChunk + lo_bit, last = last_chunk * kChunk + hi_bit + 1;
  // An interval iff every key in [first, last) is kept: the visible bits of the first
  // chunk run unbroken from lo_bit (to its end, or to hi_bit when it is also the last),
  // the last chunk's from 0 to hi_bit, and every chunk between is whole.
  bool interval;
  if (first_chunk == last_chunk) {
    const uint64_t run = first_bits >> lo_bit;
    interval = (run & (run + 1)) == 0;
  } else {
    interval = !any_chunk(first_chunk + 1, last_chunk, [&](int64_t w) { return ~all[w]; }) &&
               (first_bits >> lo_bit) == (~uint64_t(0) >> lo_bit) &&
               (last_bits & (last_bits + 1)) == 0;
  }
  // Whether the chunk bits can save work inside [first, last): some chunk there is hidden
  // or whole. If not (a mask mixed all through), the row takes the plain mask pass.
  const bool chunky =
      any_chunk(first_chunk, last_chunk + 1, [&](int64_t w) { return ~some[w] | all[w]; });
  dst[kSumFirst] = uint64_t(first);
  dst[kSumLast] = uint64_t(last);
  dst[kSumInterval] = interval;
  dst[kSumChunky] = chunky;
}

// The row layout of the summary of p's mask (its bool mask, else its float mask: the
// mask the summary reads): distinct rows in C order over the mask's non-broadcast axes.
inline const StridedView& summary_layout(const AttnParams& p, MaskSummary* sum) {
  sum->is_float = !p.bool_mask.data;
  const StridedView& bm = sum->is_float ? p.float_mask : p.bool_mask;
  sum->words = ((p.len_k + kChunk - 1) / kChunk + 63) / 64;
  sum->row_words = kSumHeader + 2 * sum->words;
  int64_t rows = 1;
  sum->row_stride = bm.row_stride ? rows : 0;
  rows *= bm.row_stride ? p.len_q : 1;
  sum->head_stride = bm.head_stride ? rows : 0;
  rows *= bm.head_stride ? p.num_heads_q : 1;
  for (int64_t d = p.batch_ndim - 1; d >= 0; --d) {
    sum->batch_stride[d] = bm.batch_stride[d] ? rows : 0;
    rows *= bm.batch_stride[d] ? p.batch_shape[d] : 1;
  }
  sum->rows = rows;
  return bm;
}

// Fills rows [r0, r1) of dst (sum.rows x sum.row_words words, laid out by summary_layout)
// from p's mask.
template <typename T>
inline void fill_summary_rows(const AttnParams& p, const StridedView& bm, const MaskSummary& sum,
                              int64_t r0, int64_t r1, uint64_t* dst) {
  const int64_t nh = bm.head_stride ? p.num_heads_q : 1, nr = bm.row_stride ? p.len_q : 1;
  int64_t coord[kMaxBatchDims];
  int64_t last_head = -1, head_off = 0;  // the offset of the (batch, head) of idx
  for (int64_t idx = r0; idx < r1; ++idx) {
    // idx -> (batch coords over non-broadcast axes, head, row), C order; the batch
    // coords only when the head changes (rows of a head are consecutive)
    const int64_t bh = idx / nr, i = idx % nr;
    if (bh != last_head) {
      int64_t rest = bh / nh;
      for (int64_t d = p.batch_ndim - 1; d >= 0; --d) {
        const int64_t ext = bm.batch_stride[d] ? p.batch_shape[d] : 1;
        coord[d] = rest % ext;
        rest /= ext;
      }
      head_off = batch_offset(bm.batch_stride, coord, p.batch_ndim) + bh % nh * bm.head_stride;
      last_head = bh;
    }
    const int64_t off = head_off + i * bm.row_stride;
    uint64_t* row = dst + idx * sum.row_words;
    if (sum.is_float)
      summarise_row(static_cast<const T*>(bm.data) + off, bm.col_stride, p.len_k, sum.words, row);
    else
      summarise_row(static_cast<const uint8_t*>(bm.data) + off, bm.col_stride, p.len_k, sum.words,
                    row);
  }
}

// Every row of dst, split among the call's threads in runs of 64 rows.
template <typename T>
inline void fill_summary(const AttnParams& p, const StridedView& bm, const MaskSummary& sum,
                         uint64_t* dst) {
  const int64_t runs = (sum.rows + 63) / 64;
  const int threads = int(imax(1, imin(p.num_threads, runs)));
  parallel_region(threads, [&] {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < runs; ++r)
      fill_summary_rows<T>(p, bm, sum, r * 64, imin(sum.rows, r * 64 + 64), dst);
  });
}

inline void release_summary(MaskSummary* sum) {
  if (sum->owned) std::free(sum->data);
  sum->data = nullptr;
}

// Whether a summary row lets the kernel skip work: its visible range leaves out a whole
// chunk, or some chunk in it is hidden, or (bool masks) the row is an interval (its mask
// is not read again) or has a whole chunk (read without its mask). A float mask is added
// to every visible key, so only hidden keys save work there.
inline bool row_saves_work(const uint64_t* row, int64_t len_k, int64_t words, bool is_float) {
  const int64_t first = int64_t(row[kSumFirst]), last = int64_t(row[kSumLast]);
  if (first >= last || first >= kChunk || last <= len_k - kChunk) return true;
  const uint64_t* some = row + kSumHeader;
  const int64_t c1 = (last + kChunk - 1) / kChunk;
  if (any_chunk(first / kChunk, c1, [&](int64_t w) { return ~some[w]; })) return true;
  return !is_float && (row[kSumInterval] || row[kSumChunky]);
}

// The summary of p's mask (summary->data null if there is none or allocation failed; free
// with release_summary): its bool mask, else its float mask (in the compute type T; -inf
// hides). With both, the bool mask's alone (the float pass still removes the -inf keys).
// A summary built ahead (p.mask_summary) is taken as it is when it is of this very mask.
template <typename T>
inline void summarise_mask(const AttnParams& p, MaskSummary* sum) {
  sum->data = nullptr;
  sum->owned = false;
  const StridedView& bm = summary_layout(p, sum);
  if (!bm.data || p.len_k == 0 || sum->rows == 0) return;
  const PrebuiltSummary& pre = p.mask_summary;
  if (pre.words && !sum->is_float && pre.of == bm.data && pre.rows == sum->rows &&
      pre.row_words == sum->row_words && pre.len_k == p.len_k && bm.col_stride == 1) {
    sum->data = const_cast<uint64_t*>(pre.words);  // read only
    return;
  }
  sum->data = static_cast<uint64_t*>(
      std::aligned_alloc(64, size_t(round_up(sum->rows * sum->row_words * 8, 64))));
  if (!sum->data) return;
  sum->owned = true;
  // A mask that hides nothing the kernel could skip (dense, mixed all through) costs its
  // summary for nothing: evenly spaced sample rows are summarised first, and if none of
  // them saves work, the call goes without a summary (the plain mask pass, as before
  // tiles were skipped). Skipping changes no arithmetic, so this only decides speed.
  constexpr int64_t kSampleRows = 16;
  if (sum->rows >= 8 * kSampleRows) {
    bool saves = false;
    for (int64_t k = 0; k < kSampleRows && !saves; ++k) {
      const int64_t idx = k * (sum->rows - 1) / (kSampleRows - 1);
      uint64_t* row = sum->data + idx * sum->row_words;
      fill_summary_rows<T>(p, bm, *sum, idx, idx + 1, sum->data);
      saves = row_saves_work(row, p.len_k, sum->words, sum->is_float);
    }
    if (!saves) {
      release_summary(sum);
      return;
    }
  }
  fill_summary<T>(p, bm, *sum, sum->data);
}

// The summary row of (batch coords, query head h, query row i).
inline const uint64_t* summary_row(const MaskSummary& sum, int64_t batch_ndim, const int64_t* coord,
                                   int64_t h, int64_t i) {
  return sum.data + (batch_offset(sum.batch_stride, coord, batch_ndim) + h * sum.head_stride +
                     i * sum.row_stride) *
                        sum.row_words;
}

// Narrows the task's rows to the keys their mask rows leave visible (a row that keeps
// nothing gets an empty range); an interval row drops its bool mask. A row whose chunk bits can
// save work gets them in row.chunks. Updates the union [*klo, *khi).
template <typename T, typename S>
inline void narrow_task_rows(const AttnParams& p, const MaskSummary& sum, const TaskCoord& c,
                             const int64_t* coord, RowRef<T, S>* rows, int64_t* klo, int64_t* khi) {
  int64_t lo_all = p.len_k, hi_all = 0;  // empty
  // Per head, the first row's summary, then one step per query row (no index arithmetic
  // per row: short rows, as key padding gives, would pay it on every one).
  const int64_t step = sum.row_stride * sum.row_words;
  for (int64_t h = 0; h < c.heads; ++h) {
    const uint64_t* s = summary_row(sum, p.batch_ndim, coord, c.h0 + h, c.i0);
    for (int64_t i = 0; i < c.nq; ++i, s += step) {
      RowRef<T, S>& row = rows[h * c.nq + i];
      row.lo = imax(row.lo, int64_t(s[kSumFirst]));
      row.hi = imax(imin(row.hi, int64_t(s[kSumLast])), row.lo);
      if (s[kSumInterval] && !sum.is_float) row.bmask = nullptr;
      row.chunks = !s[kSumInterval] && s[kSumChunky] ? s + kSumHeader : nullptr;
      if (row.lo < row.hi) {
        lo_all = imin(lo_all, row.lo);
        hi_all = imax(hi_all, row.hi);
      }
    }
  }
  *klo = lo_all;
  *khi = hi_all;
}

// The columns [a, b) of a key block starting at key kb that the rows [r0, r1) must
// compute: runs of chunks where some row sees a key (a row without chunk bits sees all
// its range). Writes up to max_segs runs, in order, clipped to [c0, c1); returns the count.
template <typename T, typename S>
inline int64_t visible_segments(const RowRef<T, S>* rows, int64_t r0, int64_t r1, int64_t kb,
                                int64_t c0, int64_t c1, int64_t* seg_a, int64_t* seg_b) {
  bool any_dense = false;
  for (int64_t r = r0; r < r1 && !any_dense; ++r)
    any_dense = rows[r].lo < rows[r].hi && !rows[r].chunks;
  if (any_dense) {
    seg_a[0] = c0;
    seg_b[0] = c1;
    return 1;
  }
  int64_t nseg = 0;
  const int64_t ch0 = (kb + c0) / kChunk, ch1 = (kb + c1 + kChunk - 1) / kChunk;
  for (int64_t ch = ch0; ch < ch1; ++ch) {
    const int64_t k0 = ch * kChunk, k1 = k0 + kChunk;
    bool seen = false;
    for (int64_t r = r0; r < r1 && !seen; ++r) {
      const RowRef<T, S>& row = rows[r];
      seen =
          row.chunks && row.lo < row.hi && row.lo < k1 && k0 < row.hi && chunk_bit(row.chunks, ch);
    }
    if (!seen) continue;
    const int64_t a = imax(k0 - kb, c0), b = imin(k1 - kb, c1);
    if (nseg > 0 && seg_b[nseg - 1] == a) {
      seg_b[nseg - 1] = b;
    } else {
      seg_a[nseg] = a;
      seg_b[nseg] = b;
      ++nseg;
    }
  }
  return nseg;
}

// mask_row (attention-inl.h) over the columns [a, b) only, for a row with chunk bits:
// runs of chunks the row sees whole skip the bool mask, runs it sees nothing of become
// -inf, and the rest take mask_row itself over the whole run (its loops, vectorised alike).
// Key kb + j is s[j]; [jlo, jhi) are the row's visible columns.
template <typename T, typename S>
inline void mask_row_chunked(const AttnParams& p, const RowRef<T, S>& row, int64_t kb, int64_t jlo,
                             int64_t jhi, int64_t a, int64_t b, T* s) {
  constexpr T kNegInf = -T(__builtin_inf());
  const uint64_t* all = row.chunks + (p.len_k + kChunk * 64 - 1) / (kChunk * 64);
  // 0: hidden, 1: whole chunk visible, 2: mixed.
  auto kind = [&](int64_t ch) {
    return !chunk_bit(row.chunks, ch) ? 0 : chunk_bit(all, ch) ? 1 : 2;
  };
  for (int64_t r0 = a; r0 < b;) {
    const int64_t ch0 = (kb + r0) / kChunk, k = kind(ch0);
    int64_t ch = ch0 + 1;
    while (ch * kChunk - kb < b && kind(ch) == k) ++ch;
    const int64_t r1 = imin(b, ch * kChunk - kb), n = r1 - r0;
    if (k == 0) {
      for (int64_t j = r0; j < r1; ++j) s[j] = kNegInf;
    } else {
      const int64_t lo = imin(imax(jlo - r0, 0), n), hi = imax(imin(jhi - r0, n), lo);
      mask_row(p, row.fmask, k == 2 ? row.bmask : nullptr, kb + r0, lo, hi, n, s + r0);
    }
    r0 = r1;
  }
}

}  // namespace FASTATTN_ISA_NS
}  // namespace fastattn
