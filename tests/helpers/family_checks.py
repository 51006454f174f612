"""Helpers shared by the attention-family test modules: tolerances and comparisons.

Not a test module (no ``test_`` prefix). The tolerances follow the rule of
``attention_checks``: the error of the same math done in the compute dtype (float32 for
float16 inputs), never float64's. For every normaliser the weights are a function of the
scores, so a bound ``score_err`` on the absolute error of every score gives

* weights: a score shift of ``d`` changes a softmax weight relatively by ``d`` and the
  normalising sum by at most ``d``, so ``|dw| <= 2 * score_err * w`` plus the rounding of
  the exponentials and the ``Lk``-term sums: ``4 * score_err + eps * (32 + Lk)``;
* output: a convex combination of value rows: that times ``max|v|``;
* float16 results add two float16 rounding steps of ``max|v|`` (one of 1 for weights).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from .attention_checks import LAYOUTS, with_layout

DTYPES = {"f2": np.float16, "f4": np.float32, "f8": np.float64}


def fixture_ok(factor: float = 1.0):
    """Settings for a test that takes the function-scoped ``isa`` fixture (it only switches
    the ISA), with ``factor`` x the profile's examples."""
    return settings(
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        max_examples=max(1, round(settings.default.max_examples * factor)),
    )


def compute_eps(*arrays) -> tuple[float, bool]:
    """(eps of the compute dtype, whether the result is float16)."""
    result = np.result_type(*[np.asarray(a).dtype for a in arrays])
    compute = np.dtype(np.float32) if result == np.float16 else result
    return float(np.finfo(compute).eps), result == np.float16


def finite_max(a) -> float:
    a = np.asarray(a, dtype=np.float64)
    return float(np.abs(np.where(np.isfinite(a), a, 0.0)).max(initial=0.0))


def row_norm_max(a) -> float:
    a = np.asarray(a, dtype=np.float64)
    a = np.where(np.isfinite(a), a, 0.0)
    return float(np.sqrt((a * a).sum(axis=-1)).max(initial=0.0))


def additive_score_error(q, k, w_q, w_k, w_v, attn_mask=None) -> float:
    """Bound on the error of every additive score ``w_v . tanh(q w_q + k w_k) (+ mask)``:
    the projections carry ``eps * D * (|x| @ |w|)``, tanh is 1-Lipschitz and evaluated to a
    few ulp, the hidden sum adds ``H`` roundings."""
    eps, _ = compute_eps(q, k, w_q, w_k, w_v)

    def proj_bound(x, w):
        x = np.abs(np.where(np.isfinite(x), x, 0.0).astype(np.float64))
        return float((x @ np.abs(np.asarray(w, np.float64))).max(initial=0.0))

    hidden = w_v.shape[0]
    err = (
        eps
        * float(np.abs(np.asarray(w_v, np.float64)).sum())
        * (
            16
            + hidden
            + (q.shape[-1] + 2) * proj_bound(q, w_q)
            + (k.shape[-1] + 2) * proj_bound(k, w_k)
        )
    )
    if attn_mask is not None and np.asarray(attn_mask).dtype.kind == "f":
        err += eps * 4 * finite_max(attn_mask)
    return err


def tolerances(score_err: float, num_keys: int, v_max: float, eps: float, f16: bool):
    """(output tolerance, weights tolerance)."""
    w_tol = 4.0 * score_err + eps * (32.0 + num_keys)
    out_tol = w_tol * v_max
    if f16:
        f16_eps = float(np.finfo(np.float16).eps)
        out_tol += 2.0 * f16_eps * v_max
        w_tol += f16_eps
    return out_tol, w_tol


def unambiguous_rows(weights: np.ndarray, k: int, gap: float) -> np.ndarray:
    """Rows whose top-``k`` selection cannot flip under score errors below ``gap / 2``.

    ``weights`` are the reference's *softmax* weights of the same scores: their logs are
    the visible scores up to a per-row constant (masked keys give -inf), so the gap between
    the k-th and (k+1)-th largest is readable from them. Rows with NaN count as ambiguous
    only if they are not entirely NaN (a NaN row is NaN either way)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.log(weights.astype(np.float64))
    lk = s.shape[-1]
    if lk <= k:
        return np.ones(s.shape[:-1], dtype=bool)
    nan_rows = np.isnan(s).all(axis=-1)
    ordered = -np.sort(-np.where(np.isnan(s), -np.inf, s), axis=-1)
    kth, nxt = ordered[..., k - 1], ordered[..., k]
    with np.errstate(invalid="ignore"):
        # nxt = -inf: fewer than k+1 visible keys, or one whose weight underflowed (then the
        # k-th must be well clear of the underflow threshold, e^-745).
        clear = (kth - nxt > gap) | (np.isneginf(nxt) & ((kth > -700) | np.isneginf(kth)))
    return clear | nan_rows


# --------------------------------------------------------------------------------------
# Random attention layouts (shapes, heads, dtypes, memory layouts, masks) for the family


@dataclass
class Spec:
    """A plain-data attention case; :func:`build` makes the arrays from ``seed``."""

    seed: int
    q_shape: tuple
    k_shape: tuple
    v_shape: tuple
    dtypes: tuple = ("f4", "f4", "f4")
    layouts: tuple = ("c", "c", "c")
    magnitude: tuple = (1.0, 1.0, 1.0)
    mask: dict | None = None
    valid_lens: dict | None = None
    kwargs: dict = field(default_factory=dict)
    return_weights: bool = False
    out: bool = False  # pass a NaN-filled out= buffer

    @property
    def scores_shape(self) -> tuple:
        nd = max(len(self.q_shape), len(self.k_shape), len(self.v_shape))
        q3, k3, v3 = ((1,) * (3 - len(s)) + s for s in (self.q_shape, self.k_shape, self.v_shape))
        batch = np.broadcast_shapes(q3[:-3], k3[:-3], v3[:-3])
        full = batch + (q3[-3], q3[-2], k3[-2])
        return full[len(full) - nd :]


def _sub_shape(draw, shape: tuple, *, keep_all: bool = False) -> tuple:
    drop = 0 if keep_all else draw(st.integers(0, len(shape)))
    kept = shape[drop:]
    return tuple(1 if draw(st.booleans()) else n for n in kept)


@st.composite
def specs(
    draw,
    *,
    same_features: bool = True,
    budget: int = 40_000,
    masks: str = "maybe",
    max_len: int = 40,
    max_feat: int = 12,
) -> Spec:
    """Shapes (2-D, 3-D with heads, 4-D with batch; GQA), dtypes, layouts, masks, flags.
    ``budget`` bounds batch * Hq * Lq * Lk * (features + 8)."""
    seed = draw(st.integers(0, 2**32 - 1))
    form = draw(st.sampled_from(["2d", "3d", "nd"]))
    lq = draw(st.integers(1, max_len))
    lk = draw(st.one_of(st.just(lq), st.integers(0, 3), st.integers(1, max_len)))
    e = draw(st.integers(1, max_feat))
    ek = e if same_features else draw(st.integers(1, max_feat))
    # value widths on both sides of the narrow / register-tiled P V split (16 floats on AVX2)
    ev = draw(st.one_of(st.integers(1, max_feat), st.integers(15, 40)))
    if form == "2d":
        batch, hkv, group = (), 1, 1
    else:
        hkv, group = draw(st.integers(1, 2)), draw(st.integers(1, 2))
        batch = (
            () if form == "3d" else tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
        )
    hq = hkv * group
    heads = hq * math.prod(batch)
    while heads * lq * max(lk, 1) * (max(e, ek) + 8) > budget and max(lq, lk) > 1:
        if lq >= lk:
            lq = max(1, lq // 2)
        else:
            lk = max(1, lk // 2)

    def array_shape(heads_: int, length: int, feat: int) -> tuple:
        if form == "2d":
            return (length, feat)
        lead = _sub_shape(draw, batch) if batch else ()
        return lead + (heads_, length, feat)

    spec = Spec(seed, array_shape(hq, lq, e), array_shape(hkv, lk, ek), array_shape(hkv, lk, ev))
    if draw(st.booleans()):
        spec.dtypes = (draw(st.sampled_from(sorted(DTYPES))),) * 3
    else:
        spec.dtypes = tuple(draw(st.sampled_from(sorted(DTYPES))) for _ in range(3))
    spec.layouts = tuple(
        draw(st.sampled_from(LAYOUTS)) if draw(st.booleans()) else "c" for _ in range(3)
    )
    spec.magnitude = tuple(draw(st.sampled_from([1.0, 1.0, 0.01, 3.0])) for _ in range(3))
    scores = spec.scores_shape
    p = {"always": 6, "maybe": 3, "never": 0}[masks]
    if draw(st.integers(1, 7)) <= p:
        kind = draw(st.sampled_from(["bool", "float"]))
        spec.mask = {"kind": kind, "shape": _sub_shape(draw, scores)}
        if kind == "bool":
            spec.mask["density"] = draw(st.sampled_from([0.1, 0.6, 1.0]))
        else:
            spec.mask["scale"] = draw(st.sampled_from([0.1, 1.0, 10.0]))
            spec.mask["p_neginf"] = draw(st.sampled_from([0.0, 0.3]))
    if draw(st.integers(1, 7)) <= p:
        rows = scores[:-1]
        n = draw(st.integers(0, len(rows)))
        spec.valid_lens = {
            "shape": _sub_shape(draw, rows[:n], keep_all=True),
            "low": draw(st.sampled_from([0, lk // 2, lk])),
        }
    kwargs = {}
    if draw(st.integers(1, 7)) <= p:
        kwargs["is_causal"] = True
        kwargs["causal_alignment"] = draw(st.sampled_from(["top_left", "bottom_right"]))
    if draw(st.integers(1, 7)) <= p:
        side = st.one_of(st.none(), st.integers(0, lk + 1))
        kwargs["window"] = (draw(side), draw(side))
    if draw(st.integers(0, 2)) == 0:
        kwargs["num_threads"] = draw(st.integers(1, 3))
    spec.kwargs = kwargs
    spec.return_weights = draw(st.booleans())
    spec.out = draw(st.integers(0, 3)) == 0
    return spec


def build(spec: Spec):
    """(query, key, value, kwargs): random values (never all zeros); the values of keys
    past every valid length are NaN (they must never be read)."""
    rng = np.random.default_rng(spec.seed)
    arrays = []
    for shape, dt, lay, mag in zip(
        (spec.q_shape, spec.k_shape, spec.v_shape), spec.dtypes, spec.layouts, spec.magnitude
    ):
        x = (rng.standard_normal(shape) * mag).astype(DTYPES[dt])
        arrays.append(with_layout(x, lay if x.size else "c"))
    kwargs = dict(spec.kwargs)
    if spec.mask is not None:
        m = spec.mask
        if m["kind"] == "bool":
            kwargs["attn_mask"] = np.asarray(rng.random(m["shape"]) < m["density"])
        else:
            mask = np.asarray(rng.standard_normal(m["shape"]) * m["scale"])
            mask[rng.random(m["shape"]) < m["p_neginf"]] = -np.inf
            kwargs["attn_mask"] = mask.astype(np.float32)
    if spec.valid_lens is not None:
        lk = spec.k_shape[-2]
        vl = np.asarray(rng.integers(spec.valid_lens["low"], lk + 1, size=spec.valid_lens["shape"]))
        kwargs["valid_lens"] = vl
        if vl.size and vl.max() < lk and spec.layouts[2] != "bcast":
            v = np.array(arrays[2])  # a writeable copy with NaN past the longest length
            v[..., int(vl.max()) :, :] = np.nan
            arrays[2] = v
    return (*arrays, kwargs)


def out_buffer(expected_out: np.ndarray) -> np.ndarray:
    """A NaN-poisoned out= buffer shaped and typed like the expected output."""
    return np.full(expected_out.shape, np.nan, expected_out.dtype)
