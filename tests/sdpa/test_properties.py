"""Property tests: fastattn.scaled_dot_product_attention against the float64 NumPy reference.

Every test runs once per ISA the CPU supports (the ``isa`` fixture). Hypothesis draws a
plain-data :class:`Spec` (shapes, dtypes, layouts, masks, flags and an RNG seed); the arrays
are built from it with NumPy's generator, so a failing example prints a small, replayable
spec. Tolerances: see ``attention_checks.attention_tolerances``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastattn
from fastattn import reference

from helpers.attention_checks import LAYOUTS, assert_close_attention, unpack, with_layout

DTYPES = {"f2": np.float16, "f4": np.float32, "f8": np.float64}
# Total multiply-adds of one case (batch * Hq * Lq * Lk * (E + Ev)): keeps each example
# at a few milliseconds even on the scalar ISA and in the float64 reference.
WORK_BUDGET = 1_500_000


def fixture_ok(factor: float = 1.0):
    """Settings for a test that uses the function-scoped ``isa`` fixture (it only switches
    the ISA, so sharing it across examples is fine), with ``factor`` x the profile's examples."""
    return settings(
        suppress_health_check=[HealthCheck.function_scoped_fixture],
        max_examples=max(1, round(settings.default.max_examples * factor)),
    )


@dataclass
class Spec:
    seed: int
    q_shape: tuple
    k_shape: tuple
    v_shape: tuple
    dtypes: tuple = ("f4", "f4", "f4")
    layouts: tuple = ("c", "c", "c")
    magnitude: tuple = (1.0, 1.0, 1.0)  # standard deviation of q, k, v
    mask: dict | None = None  # kind, shape, dtype, density / scale, p_neginf, fortran
    valid_lens: dict | None = None  # shape, dtype, low
    kwargs: dict = field(default_factory=dict)  # causal, alignment, window, scale, softcap
    return_lse: bool = False
    return_weights: bool = False

    @property
    def scores_shape(self) -> tuple:
        nd = max(len(self.q_shape), len(self.k_shape), len(self.v_shape))
        q3, k3 = ((1,) * (3 - len(s)) + s for s in (self.q_shape, self.k_shape))
        v3 = (1,) * (3 - len(self.v_shape)) + self.v_shape
        batch = np.broadcast_shapes(q3[:-3], k3[:-3], v3[:-3])
        full = batch + (q3[-3], q3[-2], k3[-2])
        return full[len(full) - nd :]


def _sub_shape(draw, shape: tuple, *, keep_all: bool = False) -> tuple:
    """A shape broadcastable to ``shape``: some leading dims dropped, some dims set to 1."""
    drop = 0 if keep_all else draw(st.integers(0, len(shape)))
    kept = shape[drop:]
    ones = draw(st.lists(st.booleans(), min_size=len(kept), max_size=len(kept)))
    return tuple(1 if one else n for n, one in zip(kept, ones))


@st.composite
def specs(
    draw,
    *,
    masks: str = "maybe",
    huge: bool | None = None,
    layouts: bool = True,
    big: bool = False,
    decode: bool = False,
) -> Spec:
    """A random attention case. masks: "maybe", "always" (each of mask, valid_lens, causal,
    window drawn with high probability) or "never"."""
    seed = draw(st.integers(0, 2**32 - 1))
    form = draw(st.sampled_from(["2d", "3d", "nd"]))
    length = st.one_of(st.integers(1, 12), st.integers(13, 150))
    if big:
        length = st.integers(60, 150)
    lq = draw(length)
    lk = draw(st.one_of(st.just(lq), length))
    if decode:  # a few query rows against a long key/value cache
        lq, lk = draw(st.integers(1, 4)), draw(st.integers(150, 3000))
    e = draw(st.one_of(st.integers(1, 16), st.integers(17, 130)))
    ev = draw(st.one_of(st.just(e), st.integers(1, 80)))

    if form == "2d":
        batch, hkv, group = (), 1, 1
    else:
        hkv = draw(st.integers(1, 3))
        group = draw(st.integers(1, 3))
        batch = (
            () if form == "3d" else tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
        )
    hq = hkv * group

    # Shrink the sizes (largest first) until the case fits the work budget.
    sizes = {"lq": lq, "lk": lk, "e": e, "ev": ev}
    heads = hq * math.prod(batch)
    while heads * sizes["lq"] * sizes["lk"] * (sizes["e"] + sizes["ev"]) > WORK_BUDGET:
        name = max(sizes, key=sizes.get)
        sizes[name] = max(1, sizes[name] // 2 + 1)
    lq, lk, e, ev = sizes["lq"], sizes["lk"], sizes["e"], sizes["ev"]

    def array_shape(heads_: int, length_: int, feat: int) -> tuple:
        if form == "2d":
            return (length_, feat)
        lead = _sub_shape(draw, batch) if batch else ()
        shape = lead + (heads_, length_, feat)
        if not lead and heads_ == 1 and draw(st.integers(0, 3)) == 0:
            shape = shape[1:]  # 2-D among 3-D/4-D ones (one head, implied)
        return shape

    q_shape = array_shape(hq, lq, e)
    k_shape = array_shape(hkv, lk, e)
    v_shape = array_shape(hkv, lk, ev)

    if draw(st.booleans()):
        dtypes = (draw(st.sampled_from(sorted(DTYPES))),) * 3
    else:
        dtypes = tuple(draw(st.sampled_from(sorted(DTYPES))) for _ in range(3))
    lay = tuple(
        draw(st.sampled_from(LAYOUTS)) if layouts and draw(st.booleans()) else "c" for _ in range(3)
    )

    spec = Spec(seed, q_shape, k_shape, v_shape, dtypes, lay)
    scores = spec.scores_shape

    if huge is None:
        huge = draw(st.integers(0, 7)) == 0
    scale = None
    if huge:
        if draw(st.booleans()):  # huge scale: |score| ~ 1e3..3e4
            scale = draw(st.sampled_from([1e3, 1e4, 3e4, -1e4])) / math.sqrt(e)
        else:  # huge inputs: |q|, |k| ~ 30..100
            big_q = draw(st.sampled_from([30.0, 100.0]))
            spec.magnitude = (big_q, big_q, draw(st.sampled_from([1.0, 100.0])))
    else:
        spec.magnitude = tuple(draw(st.sampled_from([1.0, 1.0, 1.0, 1e-3, 5.0])) for _ in range(3))
        if draw(st.booleans()):
            scale = draw(st.floats(-3.0, 3.0, allow_nan=False))
    kwargs = {}
    if scale is not None:
        kwargs["scale"] = scale

    p = {"always": 6, "maybe": 3, "never": 0}[masks]  # out of 7
    if draw(st.integers(1, 7)) <= p:
        kind = draw(st.sampled_from(["bool", "float"]))
        spec.mask = {
            "kind": kind,
            "shape": _sub_shape(draw, scores),
            "fortran": draw(st.booleans()),
        }
        if kind == "bool":
            spec.mask["density"] = draw(st.sampled_from([0.1, 0.5, 0.9, 1.0]))
        else:
            spec.mask["dtype"] = draw(st.sampled_from(sorted(DTYPES)))
            spec.mask["scale"] = draw(st.sampled_from([0.1, 1.0, 10.0, 300.0]))
            spec.mask["p_neginf"] = draw(st.sampled_from([0.0, 0.0, 0.2, 0.9]))
    if draw(st.integers(1, 7)) <= p:
        rows = scores[:-1]
        n = draw(st.integers(0, len(rows)))
        spec.valid_lens = {
            "shape": _sub_shape(draw, rows[:n], keep_all=True),
            "dtype": draw(st.sampled_from(["int64", "int32", "uint16"])),
            "low": draw(st.sampled_from([0, lk // 2, lk])),
        }
    if draw(st.integers(1, 7)) <= p:
        kwargs["is_causal"] = True
        kwargs["causal_alignment"] = draw(st.sampled_from(["top_left", "bottom_right"]))
    if draw(st.integers(1, 7)) <= p:
        side = st.one_of(st.none(), st.integers(0, lk + 1))
        kwargs["window"] = (draw(side), draw(side))
        if "causal_alignment" not in kwargs and draw(st.booleans()):
            kwargs["causal_alignment"] = "bottom_right"
    if draw(st.integers(0, 4)) == 0:
        kwargs["softcap"] = draw(st.sampled_from([0.5, 5.0, 30.0, 1e3]))
    if draw(st.integers(0, 2)) == 0:
        kwargs["num_threads"] = draw(st.integers(1, 3))
    spec.kwargs = kwargs
    spec.return_lse = draw(st.booleans())
    spec.return_weights = draw(st.booleans())
    return spec


def build(spec: Spec):
    """(query, key, value, call kwargs) for a spec, never all zeros."""
    rng = np.random.default_rng(spec.seed)
    arrays = []
    for shape, dt, lay, mag in zip(
        (spec.q_shape, spec.k_shape, spec.v_shape), spec.dtypes, spec.layouts, spec.magnitude
    ):
        x = (rng.standard_normal(shape) * mag).astype(DTYPES[dt])
        arrays.append(with_layout(x, lay))
    kwargs = dict(spec.kwargs)
    if spec.mask is not None:
        m = spec.mask
        if m["kind"] == "bool":
            mask = np.asarray(rng.random(m["shape"]) < m["density"])
        else:
            mask = np.asarray(rng.standard_normal(m["shape"]) * m["scale"])
            mask[rng.random(m["shape"]) < m["p_neginf"]] = -np.inf
            mask = mask.astype(DTYPES[m["dtype"]])
        kwargs["attn_mask"] = np.asfortranarray(mask) if m["fortran"] else mask
    if spec.valid_lens is not None:
        vl = spec.valid_lens
        lk = spec.k_shape[-2]
        kwargs["valid_lens"] = np.asarray(
            rng.integers(vl["low"], lk + 1, size=vl["shape"]), dtype=vl["dtype"]
        )
    return (*arrays, kwargs)


def check_spec(spec: Spec) -> None:
    q, k, v, kwargs = build(spec)
    expected = reference.scaled_dot_product_attention(
        q, k, v, return_lse=True, return_weights=True, **kwargs
    )
    got = unpack(
        fastattn.scaled_dot_product_attention(
            q, k, v, return_lse=spec.return_lse, return_weights=spec.return_weights, **kwargs
        ),
        spec.return_lse,
        spec.return_weights,
    )
    assert got[0].shape == expected[0].shape == spec.scores_shape[:-1] + (v.shape[-1],)
    assert got[0].dtype == expected[0].dtype == np.result_type(q, k, v)
    assert_close_attention(
        got,
        expected,
        q,
        k,
        v,
        attn_mask=kwargs.get("attn_mask"),
        scale=kwargs.get("scale"),
        softcap=kwargs.get("softcap"),
    )


@fixture_ok(4.0)
@given(spec=specs())
def test_matches_reference(isa, spec):
    """Everything at once: shapes, broadcasting, GQA, dtypes, layouts, masks, flags."""
    check_spec(spec)


@fixture_ok(2.0)
@given(spec=specs(masks="always"))
def test_matches_reference_with_masks(isa, spec):
    """bool/float masks, valid_lens, causal (both alignments) and windows, combined."""
    check_spec(spec)


@fixture_ok()
@given(spec=specs(masks="never", big=True))
def test_matches_reference_several_blocks(isa, spec):
    """Lq and Lk of 60..150: several query-row blocks and (for wide E) several key blocks."""
    check_spec(spec)


@fixture_ok(0.5)
@given(spec=specs(decode=True))
def test_matches_reference_decode(isa, spec):
    """KV-cache decoding: 1..4 query rows, 150..3000 keys (bottom-right causal is common)."""
    check_spec(spec)


@fixture_ok()
@given(spec=specs(huge=True))
def test_huge_logits_are_stable(isa, spec):
    """|scores| ~ 1e3..1e4 from a huge scale or huge inputs: no overflow, no NaN."""
    check_spec(spec)
    q, k, v, kwargs = build(spec)
    out, lse = fastattn.scaled_dot_product_attention(q, k, v, return_lse=True, **kwargs)
    assert np.isfinite(out).all()
    assert not np.isnan(lse).any() and not np.isposinf(lse).any()


@st.composite
def specs_with_empty_rows(draw) -> Spec:
    """A case where at least one score row may attend no key, by one of five routes."""
    spec = draw(specs(masks="maybe"))
    scores = spec.scores_shape
    lq, lk = scores[-2], scores[-1]
    route = draw(st.sampled_from(["bool", "float", "valid_lens", "causal", "window"]))
    if route in ("causal", "window") and lq == 1:
        route = "valid_lens"
    row = draw(st.integers(0, lq - 1))
    if route == "bool":  # a bool mask whose row `row` is all False
        spec.mask = {
            "kind": "bool",
            "shape": scores[-2:],
            "fortran": False,
            "density": 0.7,
            "empty_row": row,
        }
    elif route == "float":  # a float mask whose row `row` is all -inf
        spec.mask = {
            "kind": "float",
            "shape": scores[-2:],
            "fortran": False,
            "dtype": "f4",
            "scale": 1.0,
            "p_neginf": 0.2,
            "neginf_row": row,
        }
    elif route == "valid_lens":  # one length is 0
        spec.valid_lens = {"shape": scores[:1], "dtype": "int64", "low": 0, "zero": True}
    else:
        # Needs Lk < Lq: shorten the keys (and drop the mask/valid_lens drawn for the old Lk).
        if lk >= lq:
            lk = draw(st.integers(1, lq - 1))
            spec.k_shape = spec.k_shape[:-2] + (lk,) + spec.k_shape[-1:]
            spec.v_shape = spec.v_shape[:-2] + (lk,) + spec.v_shape[-1:]
            spec.mask = spec.valid_lens = None
        if route == "causal":  # bottom-right: the first Lq - Lk rows see nothing
            spec.kwargs["is_causal"] = True
            spec.kwargs["causal_alignment"] = "bottom_right"
        else:  # top-left window (left, right): rows i >= Lk + left see nothing
            left = draw(st.integers(0, lq - lk - 1))
            spec.kwargs["window"] = (left, draw(st.one_of(st.none(), st.integers(0, 3))))
            spec.kwargs["causal_alignment"] = "top_left"
    return spec


def build_with_empty_rows(spec: Spec):
    q, k, v, kwargs = build(spec)
    m = spec.mask or {}
    if "empty_row" in m:
        kwargs["attn_mask"][..., m["empty_row"], :] = False
    if "neginf_row" in m:
        kwargs["attn_mask"][..., m["neginf_row"], :] = -np.inf
    vl = spec.valid_lens or {}
    if vl.get("zero"):
        kwargs["valid_lens"].reshape(-1)[0] = 0
    return q, k, v, kwargs


@fixture_ok()
@given(spec=specs_with_empty_rows())
def test_fully_masked_rows(isa, spec):
    """A row that may attend nothing: output 0, lse -inf, weights 0 (and others still right)."""
    q, k, v, kwargs = build_with_empty_rows(spec)
    expected = reference.scaled_dot_product_attention(
        q, k, v, return_lse=True, return_weights=True, **kwargs
    )
    assert np.isneginf(expected[1]).any(), "the case has no fully masked row"
    got = fastattn.scaled_dot_product_attention(
        q, k, v, return_lse=True, return_weights=True, **kwargs
    )
    assert_close_attention(
        got,
        expected,
        q,
        k,
        v,
        attn_mask=kwargs.get("attn_mask"),
        scale=kwargs.get("scale"),
        softcap=kwargs.get("softcap"),
    )
    empty = np.isneginf(expected[1])
    assert (got[0][empty] == 0).all()
    assert np.isneginf(got[1][empty]).all()
    assert (got[2][empty] == 0).all()
    # The same call without lse/weights takes the plain path: rows still exactly 0.
    plain = fastattn.scaled_dot_product_attention(q, k, v, **kwargs)
    assert (plain[empty] == 0).all()
