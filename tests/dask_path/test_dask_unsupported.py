"""Options the Dask path does not have are refused by name, never dropped: sinks, ALiBi
slopes and int8 key/value (SDPA), attention(sinks=), a layer built with use_sinks=True."""

from __future__ import annotations

import numpy as np
import pytest

import fastattn

da = pytest.importorskip("dask.array")


def _qkv():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 4, 16, 8)).astype(np.float32)
    return (da.from_array(x, chunks=(1, 2, 8, 8)),) * 3


@pytest.mark.parametrize("name", ["sinks", "alibi_slopes"])
def test_sdpa_option_refused(name):
    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match=f"{name} is not supported on Dask arrays"):
        fastattn.scaled_dot_product_attention(q, k, v, **{name: np.ones(4, np.float32)})


def test_attention_sinks_refused():
    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match="sinks is not supported on Dask arrays"):
        fastattn.attention(q, k, v, sinks=np.zeros(4, np.float32))


def test_layer_with_sinks_refused():
    layer = fastattn.MultiHeadAttention(8, 2, use_sinks=True, seed=0)
    x = da.from_array(np.ones((2, 5, 8), np.float32), chunks=(1, 5, 8))
    with pytest.raises(NotImplementedError, match="use_sinks=True"):
        layer(x)
    assert isinstance(layer(np.ones((2, 5, 8), np.float32)), np.ndarray)  # NumPy still runs


def test_int8_kv_refused():
    q, k, v = _qkv()
    scale = np.ones((2, 4, 16), np.float32)
    with pytest.raises(NotImplementedError, match="int8 key/value .* do not run on Dask arrays"):
        fastattn.scaled_dot_product_attention(
            q, k.astype(np.int8), v.astype(np.int8), key_scale=scale, value_scale=scale
        )


@pytest.mark.parametrize("position", range(7))
def test_family_backward_refuses_dask_in_any_array_argument(position):
    """The family's backwards take NumPy arrays only: a Dask array in any array argument
    (the forward's inputs, the weights, the mask) is a TypeError, not a silent compute."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((5, 4)) for _ in range(3))
    w_q, w_k, w_v = rng.standard_normal((4, 6)), rng.standard_normal((4, 6)), np.ones(6)
    call = [np.ones((5, 4)), q, k, v, w_q, w_k, w_v]
    call[position] = da.from_array(call[position])
    with pytest.raises(TypeError, match="additive_attention_backward takes NumPy arrays only"):
        fastattn.additive_attention_backward(*call)
    mask = da.from_array(np.ones((5, 5), bool))
    with pytest.raises(TypeError, match="additive_attention_backward takes NumPy arrays only"):
        fastattn.additive_attention_backward(np.ones((5, 4)), q, k, v, w_q, w_k, w_v, mask)


@pytest.mark.parametrize("position", range(6))
def test_sdpa_backward_refuses_dask_in_any_array_argument(position):
    """scaled_dot_product_attention_backward and varlen_attention_backward run on NumPy
    arrays only: a Dask array among grad_out, query, key, value, out, lse is refused."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 5, 4)) for _ in range(3))
    o, lse = fastattn.scaled_dot_product_attention(q, k, v, return_lse=True)
    call = [np.ones_like(o), q, k, v, o, lse]
    call[position] = da.from_array(call[position])
    with pytest.raises(NotImplementedError, match="runs on NumPy arrays only, got Dask"):
        fastattn.scaled_dot_product_attention_backward(*call)
    packed = [a.swapaxes(0, 1) if a.ndim == 3 else a.T for a in call]  # (tokens, heads, ...)
    cu = np.array([0, 5])
    with pytest.raises(NotImplementedError, match="runs on NumPy arrays only, got Dask"):
        fastattn.varlen_attention_backward(*packed, cu, cu)
