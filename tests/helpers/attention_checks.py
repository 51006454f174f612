"""Helpers shared by the test modules: memory layouts and the one attention tolerance.

Not a test module (no ``test_`` prefix); imported as ``helpers.attention_checks``.
"""

from __future__ import annotations

import math

import numpy as np

LAYOUTS = ("c", "swap", "slice", "lastaxis", "fortran", "reversed", "bcast")


def with_layout(x: np.ndarray, layout: str) -> np.ndarray:
    """An array with ``x``'s shape, dtype and (except for "bcast") values, laid out as asked.

    c         C-contiguous copy
    swap      a (..., L, H, E) buffer viewed with swapaxes(-2, -3), as from a (B, L, H, E)
              projection (falls back to "c" below 3 dims)
    slice     every other row of a buffer twice as long along axis -2: x[..., ::2, :]
              (the rows in between hold NaN, so reading them would show)
    lastaxis  every other element of a buffer twice as long along the last axis
              (non-unit last stride; the gaps hold NaN)
    fortran   Fortran-ordered copy
    reversed  a view with a negative stride on axis -2
    bcast     stride 0: the first entry of the first leading axis of size > 1 (or else of
              axis -2) broadcast along it, so the values repeat along that axis
    """
    x = np.asarray(x)
    if layout == "c":
        return np.ascontiguousarray(x)
    if layout == "swap":
        if x.ndim < 3:
            return np.ascontiguousarray(x)
        return np.ascontiguousarray(np.swapaxes(x, -2, -3)).swapaxes(-2, -3)
    if layout == "slice":
        shape = list(x.shape)
        shape[-2] *= 2
        base = np.full(shape, np.nan, dtype=x.dtype)
        base[..., ::2, :] = x
        return base[..., ::2, :]
    if layout == "lastaxis":
        shape = list(x.shape)
        shape[-1] *= 2
        base = np.full(shape, np.nan, dtype=x.dtype)
        base[..., ::2] = x
        return base[..., ::2]
    if layout == "fortran":
        return np.asfortranarray(x)
    if layout == "reversed":
        return np.ascontiguousarray(x[..., ::-1, :])[..., ::-1, :]
    if layout == "bcast":
        axes = [ax for ax in range(x.ndim - 2) if x.shape[ax] > 1] or [x.ndim - 2]
        first = np.take(x, [0], axis=axes[0])
        return np.broadcast_to(first, x.shape)
    raise AssertionError(f"unknown layout {layout!r}")


def unpack(result, return_lse: bool = False, return_weights: bool = False):
    """(output, lse or None, weights or None) from what scaled_dot_product_attention returned."""
    if not (return_lse or return_weights):
        assert isinstance(result, np.ndarray), type(result)
        return result, None, None
    assert isinstance(result, tuple), type(result)
    assert len(result) == 1 + return_lse + return_weights
    out, rest = result[0], list(result[1:])
    lse = rest.pop(0) if return_lse else None
    weights = rest.pop(0) if return_weights else None
    return out, lse, weights


def _finite_f64(a) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return np.where(np.isfinite(a), a, 0.0)


def attention_tolerances(query, key, value, *, attn_mask=None, scale=None, softcap=None):
    """Absolute tolerances (output, lse, weights) for one call, and the dtypes involved.

    The bound is the error of the same math done in the compute dtype (float32 for float16
    inputs), not float64:

    * every score ``s = scale * q.k`` is bounded by Cauchy-Schwarz,
      ``|s| <= score_bound = |scale| * max_i ||q_i|| * max_j ||k_j||``, plus the softcap (the
      capped score is at most ``softcap``; its tanh adds error ~ eps * softcap) and the largest
      finite float-mask entry (added to the score);
    * computing ``s`` in the compute dtype (and folding ``scale * log2(e)`` into q, exp2,
      a polynomial exp) perturbs it by a few ``eps * score_bound``; a shift ``d`` in the
      exponent changes a weight relatively by ``d``, so weights carry an absolute error of a
      few ``eps * score_bound``, plus O(eps) from the sums/normalisation (the constant 32);
    * the row sums (of probabilities and of probability-weighted values) run over ``Lk``
      terms; recursive summation in the compute dtype can be off by up to ``Lk * eps / 2``
      relative each (the classical gamma_n bound), and that worst case is real: with all
      keys and values identical (a stride-0 broadcast along the keys) the rounding errors
      never cancel and the kernels' error grows like ``Lk / 8`` eps. So ``Lk`` joins the
      constant: ``growth = 32 + 8 * score_bound + Lk``;
    * the output is a convex combination of value rows, so its error is that weight error
      times ``max|v|``; a float16 result adds its own rounding (2 float16 eps of ``max|v|``);
    * the log-sum-exp ``max + log(sum)`` is off by the same absolute amount.

    Non-finite entries (NaN padding that must not be read) are left out of the maxima.
    """
    q, k, v = (np.asarray(a) for a in (query, key, value))
    result = np.result_type(q.dtype, k.dtype, v.dtype)
    compute = np.dtype(np.float32) if result == np.float16 else result
    eps = float(np.finfo(compute).eps)
    s = abs(1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale))
    q_norm = float(np.linalg.norm(_finite_f64(q), axis=-1).max(initial=0.0))
    k_norm = float(np.linalg.norm(_finite_f64(k), axis=-1).max(initial=0.0))
    score_bound = s * q_norm * k_norm
    if softcap is not None:
        score_bound += float(softcap)
    if attn_mask is not None and np.asarray(attn_mask).dtype.kind == "f":
        score_bound += float(np.abs(_finite_f64(attn_mask)).max(initial=0.0))
    v_max = float(np.abs(_finite_f64(v)).max(initial=0.0))
    num_keys = k.shape[-2]
    growth = 32.0 + 8.0 * score_bound + num_keys
    out_tol = eps * v_max * growth
    weights_tol = eps * growth
    if result == np.float16:
        f16 = float(np.finfo(np.float16).eps)
        out_tol += f16 * v_max * 2
        weights_tol += f16 * 2
    lse_tol = eps * growth
    return out_tol, lse_tol, weights_tol


def assert_close(name: str, got, expected, tol: float, rows=None) -> None:
    """Same shape and dtype; NaN/+inf/-inf at the same places; finite entries within tol.
    ``rows`` (bool over the leading axes of the output rows) limits the check."""
    assert isinstance(got, np.ndarray), f"{name}: got {type(got).__name__}"
    assert got.shape == expected.shape, f"{name}: shape {got.shape} != {expected.shape}"
    assert got.dtype == expected.dtype, f"{name}: dtype {got.dtype} != {expected.dtype}"
    g = got.astype(np.float64)
    e = expected.astype(np.float64)
    if rows is not None:
        keep = np.broadcast_to(np.asarray(rows)[..., None], g.shape)
        g, e = np.where(keep, g, 0.0), np.where(keep, e, 0.0)
    for what, pred in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        bad = pred(g) != pred(e)
        assert not bad.any(), (
            f"{name}: {what} positions differ at {np.argwhere(bad)[:5].tolist()} "
            f"(got {g[bad][:5]}, expected {e[bad][:5]})"
        )
    finite = np.isfinite(e)
    if finite.any():
        err = np.abs(np.where(finite, g, 0.0) - np.where(finite, e, 0.0))
        worst = np.unravel_index(np.argmax(err), err.shape)
        assert err[worst] <= tol, (
            f"{name}: max abs error {err[worst]:.3g} > tol {tol:.3g} at {worst}: "
            f"got {g[worst]!r}, expected {e[worst]!r}"
        )


def bits(a) -> np.ndarray:
    """The bytes of ``a`` (C order), for comparisons that tell -0.0 from 0.0 and NaNs apart."""
    return np.ascontiguousarray(a).view(np.uint8)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` have the same shape, dtype and bits."""
    return a.shape == b.shape and a.dtype == b.dtype and bits(a).tobytes() == bits(b).tobytes()


def assert_same_bits(got, want) -> None:
    """``got`` and ``want`` (arrays, or tuples of them) have the same dtypes, shapes and
    bits."""
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
        np.testing.assert_array_equal(bits(a), bits(b))


def assert_close_attention(
    got, expected, query, key, value, *, attn_mask=None, scale=None, softcap=None
) -> None:
    """Check a fastattn result against the reference, within :func:`attention_tolerances`.

    ``got`` and ``expected`` are ``(output, lse, weights)`` triples (see :func:`unpack`);
    ``lse``/``weights`` may be None in ``got`` (not asked for). Shapes, dtypes and the
    positions of NaN/+inf/-inf must match exactly. Rows the reference finds fully masked
    (lse -inf) must be exactly 0 in the output and the weights.
    """
    out_tol, lse_tol, w_tol = attention_tolerances(
        query, key, value, attn_mask=attn_mask, scale=scale, softcap=softcap
    )
    got_out, got_lse, got_w = got
    exp_out, exp_lse, exp_w = expected
    assert_close("output", got_out, exp_out, out_tol)
    if got_lse is not None:
        assert_close("lse", got_lse, exp_lse, lse_tol)
    if got_w is not None:
        assert_close("weights", got_w, exp_w, w_tol)
    if exp_lse is not None:
        empty = np.isneginf(exp_lse)
        if empty.any():
            assert (got_out[empty] == 0).all(), "output of a fully masked row is not 0"
            if got_w is not None:
                assert (got_w[empty] == 0).all(), "weights of a fully masked row are not 0"
            if got_lse is not None:
                assert np.isneginf(got_lse[empty]).all()
