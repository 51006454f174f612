"""pytest-benchmark: varlen_attention on skewed packed batches against the per-sequence loop
and against padding to the longest sequence with valid_lens (fastattn.bench._varlen).

Run: python -m pytest bench/test_bench_varlen.py   (see docs/development.md). Every benchmark
also checks its answer against varlen_attention's (bit-identical for the loop, within rounding
for the padded batch).
"""

from __future__ import annotations

import numpy as np
import pytest

import fastattn
from fastattn.bench._varlen import (
    lognormal_lengths,
    one_long_many_short,
    packed_inputs,
    padded,
    padded_bytes,
    per_sequence_loop,
)

# (lengths, Hq, Hkv, E), causal self-attention, float32
WORKLOADS = {
    "varlen 32 lognormal seqs (median 200) H8/2 E64 causal": (
        lognormal_lengths(32, 200, 1.0, 2048),
        8,
        2,
        64,
    ),
    "varlen 1x8192 + 1000x16 H8/2 E64 causal": (one_long_many_short(8192, 16, 1000), 8, 2, 64),
}
IMPLS = ["varlen_attention", "per-sequence loop", "padded + valid_lens"]
PADDED_LIMIT = 2 << 30  # bytes of padded buffers beyond which the padded run is skipped


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_varlen(record, benchmark, workload, impl):
    lens, hq, hkv, e = WORKLOADS[workload]
    benchmark.group = workload
    q, k, v, cu = packed_inputs(lens, hq, hkv, e, np.float32)
    flops = sum(2.0 * hq * n * n * (2 * e) for n in lens) / 2  # causal: about half the keys
    if impl == "varlen_attention":
        fn = lambda: fastattn.varlen_attention(q, k, v, cu, cu, is_causal=True)  # noqa: E731
    elif impl == "per-sequence loop":
        fn = lambda: per_sequence_loop(q, k, v, cu, is_causal=True)  # noqa: E731
    else:
        need = padded_bytes(lens, hq, hkv, e, 4)
        if need > PADDED_LIMIT:
            pytest.skip(f"padding to the longest sequence needs {need / 2**30:.1f} GiB")
        fn = lambda: padded(q, k, v, cu, is_causal=True)  # noqa: E731
    out = record(impl, flops, fn)
    expected = fastattn.varlen_attention(q, k, v, cu, cu, is_causal=True)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
