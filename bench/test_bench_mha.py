"""pytest-benchmark: one KV-cache decode step of MultiHeadAttention (B=1, E=512, H=8, 2048
cached positions, one new token) vs the same step written in NumPy (and torch if installed).

Every implementation appends the new token's key/value to a preallocated cache, attends
over all 2048 positions and applies the output projection; the cache is rewound after each
call so every timed step sees the same length. Each benchmark also checks its answer
against ``fastattn.reference.multi_head_attention``.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import attention_flops, numpy_sdpa  # bench/conftest.py

import fastattn

try:
    import torch
except ImportError:  # torch is optional
    torch = None

B, E, H, CACHE = 1, 512, 8, 2048
D = E // H
GROUP = f"MHA decode step B{B} E{E} H{H} cache{CACHE}"


def _setup():
    rng = np.random.default_rng(0)
    layer = fastattn.MultiHeadAttention(E, H, seed=0)
    for proj in (layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj):
        proj.bias = rng.standard_normal(proj.bias.shape).astype(np.float32) * 0.1
    tokens = rng.standard_normal((B, CACHE, E), dtype=np.float32)
    return layer, tokens


def _flops() -> float:
    projections = 4 * 2.0 * B * E * E  # q, k, v, out for one token
    return projections + attention_flops((B, H, 1, D), (B, H, CACHE, D), (B, H, CACHE, D))


@pytest.mark.parametrize("impl", ["fastattn", "numpy", "torch"])
def test_mha_decode_step(record, benchmark, impl):
    benchmark.group = GROUP
    layer, tokens = _setup()
    prompt, step = tokens[:, :-1], tokens[:, -1:]
    w = {n: getattr(layer, n) for n in ("q_proj", "k_proj", "v_proj", "out_proj")}

    if impl == "fastattn":
        cache = layer.new_kv_cache(B, CACHE)
        layer(prompt, kv_cache=cache, is_causal=True)

        def decode():
            out = layer(step, kv_cache=cache, is_causal=True)
            cache.length -= 1  # rewind
            return out

    elif impl == "numpy":
        k_cache = np.zeros((B, CACHE, E), np.float32)
        v_cache = np.zeros((B, CACHE, E), np.float32)
        k_cache[:, :-1] = prompt @ w["k_proj"].weight.T + w["k_proj"].bias
        v_cache[:, :-1] = prompt @ w["v_proj"].weight.T + w["v_proj"].bias
        n = CACHE - 1

        def decode():
            q = step @ w["q_proj"].weight.T + w["q_proj"].bias
            k_cache[:, n : n + 1] = step @ w["k_proj"].weight.T + w["k_proj"].bias
            v_cache[:, n : n + 1] = step @ w["v_proj"].weight.T + w["v_proj"].bias

            def heads(x):
                return x.reshape(B, -1, H, D).swapaxes(1, 2)

            o = numpy_sdpa(heads(q), heads(k_cache), heads(v_cache))
            return o.swapaxes(1, 2).reshape(B, 1, E) @ w["out_proj"].weight.T + w["out_proj"].bias

    else:
        if torch is None:
            pytest.skip("torch is not installed (pip install torch==2.13.0)")
        tw = {n: (torch.from_numpy(p.weight), torch.from_numpy(p.bias)) for n, p in w.items()}
        f = torch.nn.functional
        tprompt, tstep = torch.from_numpy(np.ascontiguousarray(prompt)), torch.from_numpy(step)
        with torch.no_grad():
            k_cache = torch.zeros((B, H, CACHE, D))
            v_cache = torch.zeros((B, H, CACHE, D))
            k_cache[:, :, :-1] = f.linear(tprompt, *tw["k_proj"]).view(B, -1, H, D).transpose(1, 2)
            v_cache[:, :, :-1] = f.linear(tprompt, *tw["v_proj"]).view(B, -1, H, D).transpose(1, 2)
        n = CACHE - 1

        def decode():
            with torch.no_grad():
                q = f.linear(tstep, *tw["q_proj"]).view(B, 1, H, D).transpose(1, 2)
                k_cache[:, :, n:] = f.linear(tstep, *tw["k_proj"]).view(B, 1, H, D).transpose(1, 2)
                v_cache[:, :, n:] = f.linear(tstep, *tw["v_proj"]).view(B, 1, H, D).transpose(1, 2)
                o = f.scaled_dot_product_attention(q, k_cache, v_cache)
                return f.linear(o.transpose(1, 2).reshape(B, 1, E), *tw["out_proj"]).numpy()

    out = record(impl, _flops(), decode)
    # The new token attends to every position: no mask needed in the reference.
    expected = fastattn.reference.multi_head_attention(
        step,
        tokens,
        num_heads=H,
        q_weight=w["q_proj"].weight,
        k_weight=w["k_proj"].weight,
        v_weight=w["v_proj"].weight,
        out_weight=w["out_proj"].weight,
        q_bias=w["q_proj"].bias,
        k_bias=w["k_proj"].bias,
        v_bias=w["v_proj"].bias,
        out_bias=w["out_proj"].bias,
    )
    np.testing.assert_allclose(out, expected, rtol=1e-3, atol=1e-4)
