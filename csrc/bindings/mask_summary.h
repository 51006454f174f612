// fastattn.block_mask's tile summary of its bool mask as the bindings hold it
// (_core.MaskSummary, made by _core.mask_summary in register_sdpa.cpp) and as an attention
// call reads it (the mask_summary argument of _core.sdpa and _core.sdpa_backward).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <vector>

#include "api/params.h"

namespace fastattn {

// The words (kernels/mask_summary-inl.h) and the mask they summarise, held so that its
// data outlives the summary.
struct PrebuiltMaskSummary {
  pybind11::array mask;
  std::vector<uint64_t> words;
  int64_t rows = 0, row_words = 0, len_k = 0;  // len_k: the mask's last axis
};

// The summary a call reads from its mask_summary argument (None: none). The kernel takes
// it only when it is of the very mask the call passes (summarise_mask checks).
inline PrebuiltSummary prebuilt_summary(const pybind11::object& mask_summary) {
  if (mask_summary.is_none()) return {};
  const auto& s = mask_summary.cast<const PrebuiltMaskSummary&>();
  return {s.words.data(), s.mask.data(), s.rows, s.row_words, s.len_k};
}

}  // namespace fastattn
