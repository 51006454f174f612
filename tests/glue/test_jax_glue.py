"""fastattn.jax: values and gradients equal jax.nn.dot_product_attention's (JAX computes its
softmax in float32, so both sides are float32 here) and fastattn.reference's float64
gradients for fastattn's own options; works under jit, grad and vmap; clear errors."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import fastattn  # noqa: E402
import fastattn.jax as faj  # noqa: E402

# float32 on O(1) values, sums of a few dozen terms, two implementations rounding
# differently: a few hundred units of float32's epsilon (1.2e-7)
TOL = {"rtol": 5e-5, "atol": 5e-5}


def _rand(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _qkv(q_shape, kv_shape):
    return _rand(q_shape, 1), _rand(kv_shape, 2), _rand(kv_shape, 3)


def _value_and_grads(fn, q, k, v):
    """The output and the gradients of <output, g> for a fixed random g, jitted (JAX's own
    attention compiles op by op otherwise: seconds per call)."""

    @jax.jit
    def run(q, k, v, g):
        out, vjp = jax.vjp(fn, q, k, v)
        return (out, *vjp(g))

    g = _rand(jax.eval_shape(fn, q, k, v).shape, 4)
    return [np.asarray(x) for x in run(q, k, v, g)]


def _mask(shape, seed=5):
    m = np.random.default_rng(seed).random(shape) < 0.7
    m[..., 0] = True  # no empty row: JAX averages the values there, fastattn gives zeros
    return m


JAX_CASES = {
    "plain": ((2, 9, 3, 8), (2, 11, 3, 8), {}),
    "causal gqa": ((2, 12, 6, 8), (2, 12, 2, 8), {"is_causal": True}),
    "mask bias scale": (
        (2, 7, 2, 4),
        (2, 10, 2, 4),
        {"mask": _mask((2, 1, 7, 10)), "bias": _rand((1, 2, 7, 10), 6), "scale": 0.4},
    ),
    "seq lengths window": (
        (3, 8, 2, 4),
        (3, 8, 2, 4),
        {
            "query_seq_lengths": np.array([8, 5, 3], np.int32),
            "key_value_seq_lengths": np.array([8, 6, 2], np.int32),
            "local_window_size": (2, 1),
        },
    ),
    "3-d": ((9, 4, 8), (13, 4, 8), {}),
}


@pytest.mark.parametrize("case", sorted(JAX_CASES))
def test_matches_jax_dot_product_attention(case):
    q_shape, kv_shape, kw = JAX_CASES[case]
    q, k, v = _qkv(q_shape, kv_shape)
    got = _value_and_grads(lambda *a: faj.dot_product_attention(*a, **kw), q, k, v)
    want = _value_and_grads(lambda *a: jax.nn.dot_product_attention(*a, **kw), q, k, v)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, **TOL)


def test_fastattn_options_and_sinks_gradient():
    """Sinks (differentiable), softcap, ALiBi, bottom-right causal: the gradients are
    fastattn.reference's float64 ones, within float32's accuracy."""
    q, k, v = _qkv((2, 5, 4, 8), (2, 9, 2, 8))
    sinks, slopes = _rand((4,), 7), np.array([0.5, 0.3, 0.2, 0.1], np.float32)
    kw = {"is_causal": True, "causal_alignment": "bottom_right", "softcap": 2.5}
    g = _rand((2, 5, 4, 8), 4)

    def loss(q, k, v, sinks):
        out = faj.dot_product_attention(q, k, v, sinks=sinks, alibi_slopes=slopes, **kw)
        return (out * g).sum()

    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, sinks)
    heads = [np.swapaxes(a, 1, 2).astype(np.float64) for a in (q, k, v)]
    ref = fastattn.reference
    out, lse = ref.scaled_dot_product_attention(
        *heads, sinks=sinks.astype(np.float64), alibi_slopes=slopes, return_lse=True, **kw
    )
    want = ref.scaled_dot_product_attention_backward(
        np.swapaxes(g, 1, 2).astype(np.float64),
        *heads,
        out,
        lse,
        sinks=sinks.astype(np.float64),
        alibi_slopes=slopes,
        **kw,
    )
    want = [np.swapaxes(w, 1, 2) for w in want[:3]] + [want[3]]
    for a, b in zip(got, want, strict=True):
        assert a.dtype == np.float32 and a.shape == b.shape
        np.testing.assert_allclose(np.asarray(a), b, **TOL)


def test_vmap_over_a_batch_axis():
    """jax.vmap maps the call (one fastattn call per element) and its gradient."""
    q, k, v = _qkv((3, 2, 6, 2, 4), (3, 2, 7, 2, 4))

    def loss(fn):
        return lambda q, k, v: jax.vmap(lambda *a: fn(*a, is_causal=True))(q, k, v).sum()

    got = jax.jit(jax.grad(loss(faj.dot_product_attention), argnums=(0, 1, 2)))(q, k, v)
    want = jax.jit(jax.grad(loss(jax.nn.dot_product_attention), argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), **TOL)


def test_errors():
    q, k, v = _qkv((1, 3, 2, 4), (1, 5, 2, 4))
    with pytest.raises(ValueError, match="implementation must be None"):
        faj.dot_product_attention(q, k, v, implementation="cudnn")
    with pytest.raises(ValueError, match="local_window_size or window, not both"):
        faj.dot_product_attention(q, k, v, local_window_size=2, window=(1, 1))
    with pytest.raises(ValueError, match=r"query must be 3-D \(T, N, H\) or 4-D"):
        faj.dot_product_attention(q[0, 0], k, v)
    with pytest.raises(TypeError, match="key must be a float array"):
        faj.dot_product_attention(q, k.astype(np.int32), v)
