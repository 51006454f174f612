#include "api/merge_states.h"

#include <vector>

#include "api/attention.h"
#include "api/errors.h"
#include "api/params.h"
#include "dispatch/isa.h"

namespace fastattn {

void merge_attention_states(const MergeStatesCall& c) {
  const char* fn = "merge_states";
  require(c.out.present() && c.lse.present(), fn, "out and lse must be given");
  require(c.out.kind == 'f' && (c.out.itemsize == 4 || c.out.itemsize == 8), fn,
          "out must be float32 or float64");
  const int64_t itemsize = c.out.itemsize, nd = c.out.ndim();
  require(nd >= 1 && nd - 1 <= kMaxRowDims, fn, "out must have at least one dimension");
  require(c.out.writeable && c.lse.writeable, fn, "out and lse must be writeable");
  const std::vector<int64_t> rows(c.out.shape.begin(), c.out.shape.end() - 1);
  const int64_t parts = int64_t(c.outputs.size());
  require(parts >= 1 && int64_t(c.lses.size()) == parts, fn,
          "outputs and lses must be non-empty and of one length");
  require(c.num_threads >= 1, fn, "num_threads must be >= 1");

  MergeStatesParams p;
  p.row_ndim = nd - 1;
  for (int64_t d = 0; d < nd - 1; ++d) p.row_shape[d] = rows[size_t(d)];
  p.dim_v = c.out.shape[size_t(nd - 1)];
  const bool empty = is_empty(c.out);  // (no row is read or written)
  // A view of (rows..., Ev) with a unit-stride last axis, or of (rows...).
  auto rows_of = [&](const ArrayRef& a, const char* name, bool has_col) {
    require(a.kind == 'f' && a.itemsize == itemsize, fn, name, " must have out's dtype");
    require(has_col ? a.shape == c.out.shape : a.shape == rows, fn, name, " has the wrong shape");
    RowsView v;
    v.data = a.data;
    for (int64_t d = 0; d < nd - 1; ++d) v.row_stride[d] = element_stride(a, d, fn, name);
    if (has_col)
      require(empty || p.dim_v <= 1 || element_stride(a, nd - 1, fn, name) == 1, fn, name,
              " must have a unit-stride last axis");
    return v;
  };
  p.out = rows_of(c.out, "out", true);
  p.lse = rows_of(c.lse, "lse", false);
  std::vector<RowsView> outputs, lses;
  outputs.reserve(size_t(parts));
  lses.reserve(size_t(parts));
  for (int64_t i = 0; i < parts; ++i) {
    outputs.push_back(rows_of(c.outputs[size_t(i)], "outputs[i]", true));
    lses.push_back(rows_of(c.lses[size_t(i)], "lses[i]", false));
  }
  p.num_parts = parts;
  p.outputs = outputs.data();
  p.lses = lses.data();
  p.num_threads = c.num_threads;
  const KernelTable& kernels = active_kernels();
  const bool ok = itemsize == 4 ? kernels.merge_states_f32(p) : kernels.merge_states_f64(p);
  if (!ok) throw ScratchAllocationError(fn);
}

}  // namespace fastattn
