"""The thin (decoding) path serves a GQA group's query rows together (csrc/kernels/decode-inl.h):
each K/V row read once for up to eight rows. Its per-element arithmetic is that of a row alone,
so a grouped call must equal the same heads computed one at a time bit for bit, on every ISA,
for float and int8 K/V, with and without keys a row does not attend (which take the
row-by-row branch), and match the float64 twin."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import fastattn
from fastattn import reference

sdpa = fastattn.scaled_dot_product_attention


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**32 - 1),
    hkv=st.integers(1, 3),
    group=st.integers(1, 8),
    lq=st.integers(1, 2),
    lk=st.integers(1, 700),
    e=st.sampled_from([4, 13, 64, 128]),
    ev=st.sampled_from([5, 64, 128]),
    kind=st.sampled_from(["float32", "float64", "int8"]),
    masked=st.booleans(),
)
def test_grouped_rows_equal_rows_alone(isa, seed, hkv, group, lq, lk, e, ev, kind, masked):
    assume(group * lq < 8)  # thin both ways (8 rows and more per task are tiled)
    rng = np.random.default_rng(seed)
    hq = hkv * group
    dtype = np.float64 if kind == "float64" else np.float32
    q = rng.standard_normal((1, hq, lq, e)).astype(dtype)
    k = rng.standard_normal((1, hkv, lk, e)).astype(dtype)
    v = rng.standard_normal((1, hkv, lk, ev)).astype(dtype)
    kw = {}
    k_true, v_true = k, v
    if kind == "int8":
        k, ks = fastattn.quantize_kv(k)
        v, vs = fastattn.quantize_kv(v)
        kw = {"key_scale": ks, "value_scale": vs}
        k_true = k.astype(np.float64) * ks[..., None]
        v_true = v.astype(np.float64) * vs[..., None]
    # A mask hiding a random third of the keys, different per query head: those rows'
    # probabilities hold zeros, which must skip their keys.
    mask = rng.random((hq, lq, lk)) < 0.67 if masked else None
    out = np.full((1, hq, lq, ev), np.nan, dtype=dtype)  # poisoned: every element written
    got = sdpa(q, k, v, mask, out=out, num_threads=2, **kw)
    assert got is out
    assert np.array_equal(got, sdpa(q, k, v, mask, num_threads=1, **kw), equal_nan=True)
    for h in range(hq):  # each query head alone: one row per task, no grouping
        g = h // group
        kw_h = {}
        if kind == "int8":
            kw_h = {"key_scale": ks[:, g : g + 1], "value_scale": vs[:, g : g + 1]}
        alone = sdpa(
            q[:, h : h + 1],
            k[:, g : g + 1],
            v[:, g : g + 1],
            None if mask is None else mask[h : h + 1],
            num_threads=1,
            **kw_h,
        )
        assert np.array_equal(got[:, h : h + 1], alone, equal_nan=True), h
    expected = reference.scaled_dot_product_attention(
        q.astype(np.float64),
        np.repeat(k_true, group, axis=1),
        np.repeat(v_true, group, axis=1),
        mask,
    )
    # float32: rounding of E- and Lk-term sums of O(1) terms; float64 likewise.
    tol = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol * np.sqrt(max(e, lk)))
