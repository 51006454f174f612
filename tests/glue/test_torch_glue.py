"""fastattn.torch: forward and gradients equal PyTorch's own (its SDPA, and autograd through
the attention formula written with torch ops for fastattn's own options), gradcheck passes
through the glue, tensors are read in place, and bad calls get clear errors."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import fastattn  # noqa: E402
import fastattn.torch as fat  # noqa: E402

F = torch.nn.functional


def _rand(*shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=dtype, generator=g)


def _qkv(q_shape, kv_shape, dtype=torch.float64, ev=None):
    q = _rand(*q_shape, dtype=dtype, seed=1)
    k = _rand(*kv_shape, dtype=dtype, seed=2)
    v = _rand(*kv_shape[:-1], ev or kv_shape[-1], dtype=dtype, seed=3)
    return [t.requires_grad_() for t in (q, k, v)]


def _value_and_grads(fn, inputs, grad_seed=4):
    out = fn(*inputs)
    g = _rand(*out.shape, seed=grad_seed).to(out.dtype)  # the same values in every dtype
    grads = torch.autograd.grad(out, inputs, g)
    return out.detach(), grads


def _assert_close(got, want, dtype):
    # float64: the two differ only in summation order (1e-12 on O(1) values); float32:
    # a few units of float32's epsilon (1.2e-7) over sums of a few dozen terms
    rtol, atol = (1e-10, 1e-12) if dtype == torch.float64 else (2e-5, 2e-5)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def _bool_mask(shape, seed=5):
    m = torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) < 0.7
    m[..., 0] = True  # no row without a key: torch gives NaN there, fastattn zeros
    return m


TORCH_CASES = {
    "plain": ((2, 3, 9, 8), (2, 3, 11, 8), {}),
    "causal": ((2, 3, 12, 8), (2, 3, 12, 8), {"is_causal": True}),
    "bool mask": ((2, 3, 9, 8), (2, 3, 11, 8), {"attn_mask": _bool_mask((2, 1, 9, 11))}),
    "float mask": ((1, 2, 7, 4), (1, 2, 10, 4), {"attn_mask": _rand(7, 10, seed=6)}),
    "gqa scale": ((2, 6, 9, 8), (2, 2, 13, 8), {"enable_gqa": True, "scale": 0.3}),
    "3-d": ((4, 9, 8), (4, 13, 8), {}),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("case", sorted(TORCH_CASES))
def test_matches_torch_sdpa(case, dtype):
    q_shape, kv_shape, kw = TORCH_CASES[case]
    kw = {
        n: (x.to(dtype) if torch.is_tensor(x) and x.is_floating_point() else x)
        for n, x in kw.items()
    }
    inputs = _qkv(q_shape, kv_shape, dtype, ev=5)
    got = _value_and_grads(lambda q, k, v: fat.scaled_dot_product_attention(q, k, v, **kw), inputs)
    want = _value_and_grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw), inputs)
    _assert_close((got[0], *got[1]), (want[0], *want[1]), dtype)


def test_non_contiguous_inputs_and_grad_out():
    """(B, L, H, E) tensors seen as (B, H, L, E) (transposed views, as a model's projections
    give them), and an expanded (stride-0) output gradient: read as they are."""
    base = [_rand(2, 10, 3, 8, seed=s).requires_grad_() for s in (1, 2, 3)]
    views = lambda: [t.transpose(1, 2) for t in base]  # noqa: E731
    got = torch.autograd.grad(
        fat.scaled_dot_product_attention(*views(), is_causal=True).sum(), base
    )
    want = torch.autograd.grad(F.scaled_dot_product_attention(*views(), is_causal=True).sum(), base)
    _assert_close(got, want, torch.float64)


def torch_attention(
    q,
    k,
    v,
    attn_mask=None,
    is_causal=False,
    scale=None,
    *,
    valid_lens=None,
    causal_alignment="top_left",
    window=None,
    softcap=None,
    sinks=None,
    alibi_slopes=None,
):
    """fastattn's semantics (docs/semantics.md) written with torch ops, whole score matrix:
    autograd through it is the independent gradient."""
    group = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(group, -3), v.repeat_interleave(group, -3)
    lq, lk = q.shape[-2], k.shape[-2]
    s = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(lq)[:, None] + (lk - lq if causal_alignment == "bottom_right" else 0)
    j = torch.arange(lk)[None, :]
    if alibi_slopes is not None:
        s = s - alibi_slopes[:, None, None] * (j - i).abs()
    allowed = torch.ones(lq, lk, dtype=torch.bool)
    if is_causal:
        allowed = allowed & (j <= i)
    if window is not None:
        allowed = allowed & (j >= i - window[0]) & (j <= i + window[1])
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            allowed = allowed & attn_mask
        else:
            s = s + attn_mask
    if valid_lens is not None:
        allowed = allowed & (j < valid_lens.view(-1, 1, 1, 1))
    s = s.masked_fill(~allowed, -torch.inf)
    if sinks is None:
        return torch.softmax(s, -1) @ v
    sink = sinks.view(-1, 1, 1).expand(*s.shape[:-1], 1)
    return torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1] @ v


OPTION_CASES = {
    "sinks gqa causal": ((2, 4, 9, 8), (2, 2, 9, 8), {"is_causal": True, "enable_gqa": True}, True),
    "softcap window": ((2, 2, 12, 8), (2, 2, 12, 8), {"softcap": 2.0, "window": (3, 1)}, False),
    "alibi bottom-right": (
        (1, 3, 5, 8),
        (1, 3, 12, 8),
        {
            "is_causal": True,
            "causal_alignment": "bottom_right",
            "alibi_slopes": torch.tensor([0.5, 0.25, 0.125], dtype=torch.float64),
        },
        False,
    ),
    "valid_lens float mask sinks": (
        (3, 2, 6, 4),
        (3, 2, 10, 4),
        {"valid_lens": torch.tensor([10, 3, 7]), "attn_mask": _rand(6, 10, seed=7)},
        True,
    ),
}


@pytest.mark.parametrize("case", sorted(OPTION_CASES))
def test_fastattn_options_match_torch_autograd(case):
    q_shape, kv_shape, kw, with_sinks = OPTION_CASES[case]
    inputs = _qkv(q_shape, kv_shape)
    if with_sinks:
        inputs.append(_rand(q_shape[-3], seed=8).requires_grad_())
    ref_kw = {n: x for n, x in kw.items() if n != "enable_gqa"}

    def ours(q, k, v, *sinks):
        return fat.scaled_dot_product_attention(q, k, v, sinks=sinks[0] if sinks else None, **kw)

    def theirs(q, k, v, *sinks):
        return torch_attention(q, k, v, sinks=sinks[0] if sinks else None, **ref_kw)

    got, want = _value_and_grads(ours, inputs), _value_and_grads(theirs, inputs)
    _assert_close((got[0], *got[1]), (want[0], *want[1]), torch.float64)


def test_gradcheck():
    """torch.autograd.gradcheck (float64 finite differences) through the glue: GQA,
    bottom-right causal, softcap, ALiBi and sinks (whose gradient is checked too)."""
    q, k, v = _qkv((1, 2, 4, 3), (1, 1, 6, 3), ev=2)
    sinks = _rand(2, seed=9).requires_grad_()
    slopes = torch.tensor([0.3, 0.1], dtype=torch.float64)

    def fn(q, k, v, sinks):
        return fat.scaled_dot_product_attention(
            q,
            k,
            v,
            is_causal=True,
            enable_gqa=True,
            causal_alignment="bottom_right",
            softcap=3.0,
            alibi_slopes=slopes,
            sinks=sinks,
        )

    assert torch.autograd.gradcheck(fn, (q, k, v, sinks), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_fully_masked_rows_give_zeros():
    """valid_lens 0 for one batch entry: its output and every gradient reaching it is 0."""
    q, k, v = _qkv((2, 2, 5, 4), (2, 2, 6, 4))
    out = fat.scaled_dot_product_attention(q, k, v, valid_lens=torch.tensor([0, 4]))
    out.pow(2).sum().backward()
    assert (out[0] == 0).all() and out[1].abs().sum() > 0
    for t in (q, k, v):
        assert (t.grad[0] == 0).all() and t.grad[1].abs().sum() > 0
    assert (k.grad[1, :, 4:] == 0).all()  # keys past the length get no gradient


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_low_precision_storage(dtype):
    """float16/bfloat16 tensors: computed in float32, outputs and gradients in their dtype,
    as accurate as that dtype rounds (relative 2^-8 for bfloat16, 2^-11 for float16)."""
    if dtype == torch.bfloat16:
        pytest.importorskip("ml_dtypes")
    low = [t.detach().to(dtype).requires_grad_() for t in _qkv((2, 2, 9, 8), (2, 2, 11, 8))]
    exact = [t.detach().double().requires_grad_() for t in low]
    got = _value_and_grads(lambda *a: fat.scaled_dot_product_attention(*a, is_causal=True), low)
    want = _value_and_grads(lambda *a: F.scaled_dot_product_attention(*a, is_causal=True), exact)
    tol = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10
    for a, b in zip((got[0], *got[1]), (want[0], *want[1])):
        assert a.dtype == dtype
        torch.testing.assert_close(a.double(), b, rtol=tol, atol=tol * b.abs().max().item())


def test_inputs_are_read_in_place(monkeypatch):
    """The forward hands fastattn NumPy views of the tensors' memory (no copy), and the
    output tensor is the array fastattn wrote."""
    seen = {}
    real = fastattn.scaled_dot_product_attention

    def spy(q, k, v, *args, **kw):
        seen["arrays"] = (q, k, v)
        seen["result"] = real(q, k, v, *args, **kw)
        return seen["result"]

    monkeypatch.setattr(fastattn, "scaled_dot_product_attention", spy)
    q, k, v = _qkv((2, 2, 5, 4), (2, 2, 6, 4))
    out = fat.scaled_dot_product_attention(q, k.transpose(-1, -2).transpose(-1, -2), v)
    for t, a in zip((q, k, v), seen["arrays"]):
        assert np.shares_memory(a, t.detach().numpy())
    assert np.shares_memory(out.detach().numpy(), seen["result"][0])


def test_threads_follow_fastattn_setting():
    """fastattn.set_num_threads governs the glue's calls; the results are bit-identical for
    any thread count (forward and backward)."""
    q, k, v = _qkv((2, 4, 64, 16), (2, 4, 64, 16), dtype=torch.float32)
    results = []
    for n in (1, 2):
        with fastattn.set_num_threads(n):
            results.append(_value_and_grads(fat.scaled_dot_product_attention, [q, k, v]))
    for a, b in zip((results[0][0], *results[0][1]), (results[1][0], *results[1][1])):
        assert torch.equal(a, b)


def test_errors():
    q, k, v = _qkv((1, 4, 3, 8), (1, 2, 5, 8))
    with pytest.raises(ValueError, match="dropout_p must be 0.0"):
        fat.scaled_dot_product_attention(q, k, v, dropout_p=0.1, enable_gqa=True)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        fat.scaled_dot_product_attention(q, k, v)
    with pytest.raises(ValueError, match="attn_mask requires grad"):
        fat.scaled_dot_product_attention(q, k, v, _rand(3, 5).requires_grad_(), enable_gqa=True)
    with pytest.raises(ValueError, match="query is on device meta"):
        fat.scaled_dot_product_attention(q.to("meta"), k, v, enable_gqa=True)
    with pytest.raises(TypeError, match="query must be float16, bfloat16, float32 or float64"):
        fat.scaled_dot_product_attention(torch.ones(1, 4, 3, 8, dtype=torch.int32), k, v)
    with pytest.raises(TypeError, match="key must be a torch.Tensor"):
        fat.scaled_dot_product_attention(q, k.detach().numpy(), v, enable_gqa=True)
    # fastattn's own checks name the argument
    with pytest.raises(ValueError, match="window"):
        fat.scaled_dot_product_attention(q, k, v, enable_gqa=True, window=(-2, 0))


def test_inference_and_in_place_changes():
    """Without a gradient to compute (no_grad, or no input requiring one) the call is the
    plain forward; a mask changed in place between forward and backward is an error (the
    backward would read the new one), not a wrong gradient."""
    q, k, v = _qkv((1, 2, 5, 4), (1, 2, 6, 4))
    mask = _bool_mask((5, 6))
    with_grad = fat.scaled_dot_product_attention(q, k, v, mask)
    with torch.no_grad():
        plain = fat.scaled_dot_product_attention(q, k, v, mask)
    assert not plain.requires_grad and torch.equal(plain, with_grad.detach())
    mask[0, 1] = ~mask[0, 1]
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        with_grad.sum().backward()
