"""pytest-benchmark suite: a training step's attention, forward + backward, fastattn against
PyTorch's CPU SDPA forward + ``.backward()`` and the NumPy formula with its backward written
out (float32); a second group per shape times fastattn's two halves alone (the backward
from a saved output and lse), whose rates give the backward / forward ratio and the
backward's arithmetic rate (counting 2.5x the forward's flops).

Run: python -m pytest bench/test_bench_backward.py   (``fastattn-bench --shapes backward``
has the same rows, with the FMA peak measured in the same run). Every benchmark also checks
its answer against fastattn's own gradients (float32 tolerance).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import attention_flops  # bench/conftest.py

import fastattn
from fastattn.bench import numpy_sdpa_grads
from fastattn.bench._cases import BACKWARD_FLOPS

try:
    import torch
except ImportError:  # torch is optional: the groups then hold fastattn and numpy
    torch = None

# (batch, query heads, kv heads, Lq, Lk, E, causal): the backward targets' shapes
SHAPES = {
    f"{name}{' causal' if causal else ''}": (*dims, causal)
    for name, dims in {
        "B1 H8 1024x1024 E64": (1, 8, 8, 1024, 1024, 64),
        "B1 H8 2048x2048 E64": (1, 8, 8, 2048, 2048, 64),
        "B1 H8 1024x1024 E128": (1, 8, 8, 1024, 1024, 128),
        "B4 H12 512x512 E64 (BERT-base)": (4, 12, 12, 512, 512, 64),
        "B1 H32/8 1024x1024 E128 (GQA prefill)": (1, 32, 8, 1024, 1024, 128),
        "B32 H8 128x128 E64 (short seqs)": (32, 8, 8, 128, 128, 64),
    }.items()
    for causal in (False, True)
}


def make_inputs(shape, seed=0):
    b, hq, hkv, lq, lk, e, _ = shape
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal(s, dtype=np.float32)
        for s in ((b, hq, lq, e), (b, hkv, lk, e), (b, hkv, lk, e), (b, hq, lq, e))
    ]


def fastattn_step(q, k, v, g, causal):
    out, lse = fastattn.scaled_dot_product_attention(q, k, v, is_causal=causal, return_lse=True)
    return fastattn.scaled_dot_product_attention_backward(g, q, k, v, out, lse, is_causal=causal)


def check(grads, expected):
    for got, want in zip(grads, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * np.abs(want).max())


@pytest.mark.parametrize("impl", ["fastattn", "numpy", "torch"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_forward_backward(record, benchmark, name, impl):
    shape = SHAPES[name]
    causal = shape[-1]
    benchmark.group = f"backward {name}"
    q, k, v, g = make_inputs(shape)
    flops = (1 + BACKWARD_FLOPS) * attention_flops(q.shape, k.shape, v.shape, causal)
    if impl == "fastattn":
        grads = record(impl, flops, fastattn_step, q, k, v, g, causal)
    elif impl == "numpy":
        grads = record(impl, flops, numpy_sdpa_grads, q, k, v, g, causal)
    else:
        if torch is None:
            pytest.skip("torch is not installed (pip install torch==2.13.0)")
        tq, tk, tv = (torch.from_numpy(a).requires_grad_() for a in (q, k, v))
        tg = torch.from_numpy(g)
        kw = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}

        def run():
            out = torch.nn.functional.scaled_dot_product_attention(
                tq, tk, tv, is_causal=causal, **kw
            )
            return torch.autograd.grad(out, (tq, tk, tv), tg)

        grads = [t.numpy() for t in record(impl, flops, run)]
    if impl != "fastattn":
        check(grads, fastattn_step(q, k, v, g, causal))


@pytest.mark.parametrize("half", ["forward", "backward"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_halves(record, benchmark, name, half):
    """fastattn's forward (return_lse=True) and backward alone: backward / forward is the
    ratio of their medians, and the backward's GFLOP/s counts 2.5x the forward's flops."""
    shape = SHAPES[name]
    causal = shape[-1]
    benchmark.group = f"backward {name} (fastattn's halves)"
    q, k, v, g = make_inputs(shape)
    flops = attention_flops(q.shape, k.shape, v.shape, causal)
    sdpa = fastattn.scaled_dot_product_attention
    if half == "forward":
        out, lse = record("fa-fwd", flops, sdpa, q, k, v, is_causal=causal, return_lse=True)
        assert np.isfinite(lse).all() and out.shape == q.shape
    else:
        out, lse = sdpa(q, k, v, is_causal=causal, return_lse=True)
        backward = fastattn.scaled_dot_product_attention_backward
        record(
            "fa-bwd",
            BACKWARD_FLOPS * flops,
            backward,
            g,
            q,
            k,
            v,
            out,
            lse,
            is_causal=causal,
        )
