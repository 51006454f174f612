"""Attention sinks and ALiBi (scaled_dot_product_attention's ``sinks=`` and
``alibi_slopes=``): against the float64 NumPy twin on every ISA, composed with every other
option (shapes, broadcasting, GQA, dtypes, layouts, masks, softcap, lse/weights, key
splits), bit-identical across thread counts, and the rules docs/semantics.md states.

Tolerances: ``attention_tolerances`` with the ALiBi bias and the sink counted like a float
mask (they enter the exponent the same way, so their magnitude scales the rounding error
of the exponent's argument).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastattn
from fastattn import reference

from helpers.attention_checks import assert_close_attention, unpack
from sdpa.test_properties import DTYPES, _sub_shape, build, fixture_ok, specs

sdpa = fastattn.scaled_dot_product_attention
ref_sdpa = reference.scaled_dot_product_attention


@st.composite
def options(draw, spec, *, sinks: bool | None = None, alibi: bool | None = None) -> dict:
    """Sinks and/or ALiBi slopes for a drawn spec: shapes (Hq,) or broadcastable to the
    score rows' leading shape, any float dtype, values of either sign."""
    heads = spec.scores_shape[:-2] or (1,)
    want_sinks = draw(st.booleans()) if sinks is None else sinks
    want_alibi = draw(st.booleans()) if alibi is None else alibi
    if not (want_sinks or want_alibi):
        want_sinks = True
    found = {"seed": draw(st.integers(0, 2**32 - 1))}
    for name, wanted in (("sinks", want_sinks), ("alibi_slopes", want_alibi)):
        if not wanted:
            continue
        shape = heads[-1:] if draw(st.booleans()) else _sub_shape(draw, heads)
        found[name] = {
            "shape": shape or (1,),
            "dtype": draw(st.sampled_from(sorted(DTYPES))),
            # sinks: logits around the scores' size, or far above/below them; slopes: the
            # ALiBi geometric ones (2^-8 .. 1) or any of either sign
            "scale": draw(
                st.sampled_from([0.1, 1.0, 3.0, 30.0] if name == "sinks" else [0.01, 0.3, 1.0])
            ),
            "neg_inf": name == "sinks" and draw(st.integers(0, 9)) == 0,
        }
    return found


def head_arrays(opts: dict) -> dict:
    """The sinks / alibi_slopes arrays of ``options``."""
    rng = np.random.default_rng(opts["seed"])
    arrays = {}
    for name in ("sinks", "alibi_slopes"):
        o = opts.get(name)
        if o is None:
            continue
        x = rng.standard_normal(o["shape"]) * o["scale"]
        if o["neg_inf"]:
            x.flat[0] = -np.inf  # -inf: that head has no sink
        arrays[name] = x.astype(DTYPES[o["dtype"]])
    return arrays


def bias_bound(kwargs: dict, lq: int, lk: int) -> np.ndarray:
    """A float "mask" whose largest entry bounds what the float mask, the ALiBi bias and the
    sink add to a row's exponents (for attention_tolerances)."""
    total = 0.0
    mask = kwargs.get("attn_mask")
    if mask is not None and np.asarray(mask).dtype.kind == "f":
        m = np.asarray(mask, dtype=np.float64)
        total += float(np.abs(np.where(np.isfinite(m), m, 0.0)).max(initial=0.0))
    slopes = kwargs.get("alibi_slopes")
    if slopes is not None:
        total += float(np.abs(slopes.astype(np.float64)).max()) * (lq + lk)
    sinks = kwargs.get("sinks")
    if sinks is not None:
        s = sinks.astype(np.float64)
        total += float(np.abs(np.where(np.isfinite(s), s, 0.0)).max())
    return np.array([total])


def check(spec, opts, *, num_threads=None) -> None:
    q, k, v, kwargs = build(spec)
    kwargs.update(head_arrays(opts))
    if num_threads is not None:
        kwargs["num_threads"] = num_threads
    expected = ref_sdpa(q, k, v, return_lse=True, return_weights=True, **kwargs)
    got = unpack(
        sdpa(q, k, v, return_lse=spec.return_lse, return_weights=spec.return_weights, **kwargs),
        spec.return_lse,
        spec.return_weights,
    )
    lq, lk = spec.scores_shape[-2:]
    assert_close_attention(
        got,
        expected,
        q,
        k,
        v,
        attn_mask=bias_bound(kwargs, lq, lk),
        scale=kwargs.get("scale"),
        softcap=kwargs.get("softcap"),
    )
    # A row that may attend no key (lse -inf without the sink): output exactly 0, lse
    # exactly its sink.
    if "sinks" in kwargs:
        plain = {n: a for n, a in kwargs.items() if n != "sinks"}
        _, no_sink_lse = ref_sdpa(q, k, v, return_lse=True, **plain)
        empty = np.isneginf(no_sink_lse)
        if empty.any():
            assert (got[0][empty] == 0).all()
            if got[1] is not None:
                np.testing.assert_array_equal(got[1][empty], expected[1][empty])


@fixture_ok(2.0)
@given(data=st.data())
def test_matches_reference(isa, data):
    """Sinks and/or ALiBi with every other option drawn (shapes, GQA, dtypes, layouts, masks,
    causal/window/alignment, softcap, lse/weights, threads)."""
    spec = data.draw(specs())
    check(spec, data.draw(options(spec)))


@fixture_ok()
@given(data=st.data())
def test_matches_reference_with_masks(isa, data):
    """Every mask kind at once, with both options."""
    spec = data.draw(specs(masks="always"))
    check(spec, data.draw(options(spec, sinks=True, alibi=True)))


@fixture_ok(0.5)
@given(data=st.data())
def test_matches_reference_decode(isa, data):
    """Decoding shapes (1..4 rows, up to 3000 keys): the thin kernel and the key splits."""
    spec = data.draw(specs(decode=True))
    check(spec, data.draw(options(spec)))


@fixture_ok(0.5)
@given(data=st.data())
def test_matches_reference_several_blocks(isa, data):
    """60..150 rows and keys: several row tasks and key blocks per row."""
    spec = data.draw(specs(masks="never", big=True))
    check(spec, data.draw(options(spec, sinks=True, alibi=True)))


def _random(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "shape",
    [
        ((2, 4, 37, 24), (2, 2, 300, 24)),  # tiled, GQA, several key blocks
        ((1, 8, 1, 64), (1, 2, 5000, 64)),  # decode: thin kernel, key splits
        ((3, 2, 2, 16), (3, 2, 3000, 16)),  # thin, key splits
    ],
)
def test_bit_identical_across_thread_counts(isa, dtype, shape):
    rng = np.random.default_rng(7)
    (qs, ks) = shape
    q, k, v = _random(rng, qs, dtype), _random(rng, ks, dtype), _random(rng, ks, dtype)
    hq = qs[1]
    kwargs = dict(
        sinks=_random(rng, (hq,), dtype),
        alibi_slopes=np.abs(_random(rng, (qs[0], hq), dtype)) * 0.1,
        is_causal=True,
        causal_alignment="bottom_right",
        return_lse=True,
        return_weights=True,
    )
    runs = [sdpa(q, k, v, num_threads=t, **kwargs) for t in (1, 2, 3, 5)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            np.testing.assert_array_equal(a, b)
    expected = ref_sdpa(q, k, v, **kwargs)
    assert_close_attention(
        runs[0],
        expected,
        q,
        k,
        v,
        attn_mask=bias_bound(kwargs, qs[2], ks[2]),
    )


def test_sink_semantics():
    """Weights sum to 1 - e^(sink - lse); a row seeing no key gives 0 and lse = sink; a
    sink of -inf is no sink; the sink is not scaled, capped or masked."""
    rng = np.random.default_rng(1)
    q, k, v = _random(rng, (2, 3, 6, 8)), _random(rng, (2, 3, 9, 8)), _random(rng, (2, 3, 9, 5))
    sinks = np.array([0.5, -2.0, 4.0], np.float32)
    lens = np.array([9, 0])  # batch 1 sees no key
    out, lse, w = sdpa(
        q, k, v, valid_lens=lens, sinks=sinks, softcap=0.1, return_lse=True, return_weights=True
    )
    np.testing.assert_allclose(
        w[0].sum(-1) + np.exp(sinks[:, None] - lse[0]), 1.0, rtol=0, atol=1e-5
    )
    assert (w[0].sum(-1) < 1).all()
    assert (out[1] == 0).all() and (w[1] == 0).all()
    np.testing.assert_array_equal(lse[1], np.broadcast_to(sinks[:, None], (3, 6)))
    # A sink far above the capped scores (|s| <= 0.1) takes nearly all the weight: it is
    # not capped itself.
    assert (w[0, 2].sum(-1) < np.exp(0.2 - 4.0) * 9).all()
    # -inf is no sink at all
    minus = np.full(3, -np.inf, np.float32)
    np.testing.assert_array_equal(sdpa(q, k, v, sinks=minus), sdpa(q, k, v))


def test_alibi_by_hand():
    """One head, top-left and bottom-right: the bias -slope * |j - (i + d)| in the weights."""
    rng = np.random.default_rng(2)
    q, k, v = _random(rng, (1, 3, 4), np.float64), _random(rng, (1, 5, 4), np.float64), None
    v = _random(rng, (1, 5, 2), np.float64)
    slope = 0.7
    for alignment, d in (("top_left", 0), ("bottom_right", 2)):
        _, w = sdpa(q, k, v, alibi_slopes=[slope], causal_alignment=alignment, return_weights=True)
        s = (q[0] @ k[0].T) / 2.0
        s = s - slope * np.abs(np.arange(5)[None, :] - (np.arange(3)[:, None] + d))
        e = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(w[0], e / e.sum(-1, keepdims=True), rtol=1e-12, atol=1e-14)


def test_fast_path_takes_the_options():
    """A plain call with sinks or slopes (what the raw fast path would take but for them)
    is computed with them, not silently without."""
    rng = np.random.default_rng(3)
    q, k, v = (
        _random(rng, (1, 2, 1, 16)),
        _random(rng, (1, 2, 40, 16)),
        _random(rng, (1, 2, 40, 16)),
    )
    plain = sdpa(q, k, v)
    for kw in ({"sinks": np.array([1.0, 2.0])}, {"alibi_slopes": np.array([0.5, 0.25])}):
        got = sdpa(q, k, v, **kw)
        assert not np.array_equal(got, plain)
        np.testing.assert_allclose(got, ref_sdpa(q, k, v, **kw), rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["sinks", "alibi_slopes"])
def test_bad_head_values(name):
    q = k = v = np.ones((2, 3, 4, 8), np.float32)
    with pytest.raises(ValueError, match=f"{name} must have one value per query head"):
        sdpa(q, k, v, **{name: np.zeros(4)})
    with pytest.raises(ValueError, match=f"{name} must have one value per query head"):
        sdpa(q, k, v, **{name: np.zeros((5, 3))})
    with pytest.raises(ValueError, match=f"{name} must have one value per query head"):
        sdpa(q, k, v, **{name: np.float32(1.0)})
    with pytest.raises(TypeError, match=f"{name} must be a floating-point array"):
        sdpa(q, k, v, **{name: np.zeros(3, np.int64)})
    with pytest.raises(ValueError, match=f"{name} must have one value per query head"):
        ref_sdpa(q, k, v, **{name: np.zeros(4)})
    # the batch-wide forms are fine
    sdpa(q, k, v, **{name: np.zeros((2, 3))})
    sdpa(q, k, v, **{name: np.zeros((2, 1))})


def test_reference_sinks_by_loop():
    """The twin's sink softmax against a plain loop over one row at a time."""
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 6, 4)), None
    v = rng.standard_normal((2, 6, 3))
    sinks = np.array([0.3, -1.0])
    out, lse = ref_sdpa(q, k, v, sinks=sinks, is_causal=True, return_lse=True)
    for h in range(2):
        for i in range(3):
            s = [float(q[h, i] @ k[h, j]) / 2.0 for j in range(i + 1)]
            m = max(s + [sinks[h]])
            z = sum(np.exp(x - m) for x in s) + np.exp(sinks[h] - m)
            want = sum(np.exp(x - m) / z * v[h, j] for j, x in enumerate(s))
            np.testing.assert_allclose(out[h, i], want, rtol=1e-12)
            assert lse[h, i] == pytest.approx(m + np.log(z), rel=1e-12)


@pytest.mark.parametrize(
    "shapes",
    [
        ((1, 8, 1, 64), (1, 2, 700, 64)),  # GQA decode
        ((2, 1, 4, 5, 16), (1, 3, 2, 9, 16)),  # broadcast batch dims
        ((3, 5, 8), (3, 7, 8)),  # 3-D
    ],
)
@pytest.mark.parametrize("form", ["contiguous", "strided", "float16", "per-batch"])
def test_fast_and_full_paths_agree(isa, monkeypatch, shapes, form):
    """(Hq,) sinks and slopes in the query's dtype ride the fast path; other forms
    (converted, broadcast) take the full one; both give the same bits."""
    qs, ks = shapes
    rng = np.random.default_rng(11)
    q, k, v = _random(rng, qs), _random(rng, ks), _random(rng, ks)
    hq = qs[-3]
    if form == "per-batch" and len(qs) < 4:
        form = "contiguous"
    if form == "strided":
        sinks = _random(rng, (2 * hq,))[::2]
        slopes = np.abs(_random(rng, (2 * hq,)))[::2] * 0.1
    elif form == "per-batch":
        per_batch = (qs[0],) + (1,) * (len(qs) - 4) + (hq,)
        sinks = _random(rng, per_batch)
        slopes = np.abs(_random(rng, per_batch)) * 0.1
    else:
        dtype = np.float16 if form == "float16" else np.float32
        sinks = _random(rng, (hq,), dtype)
        slopes = (np.abs(_random(rng, (hq,))) * 0.1).astype(dtype)
    kwargs = {"sinks": sinks, "alibi_slopes": slopes, "is_causal": True}
    kwargs["causal_alignment"] = "bottom_right"
    results = []
    for on in (True, False):
        monkeypatch.setattr(fastattn._sdpa, "_fast_path", on)
        results.append(sdpa(q, k, v, **kwargs))
    np.testing.assert_array_equal(results[0].view(np.uint8), results[1].view(np.uint8))

    seen = []
    real = fastattn._core.sdpa

    def spy(**kw):
        seen.append(kw)
        return real(**kw)

    monkeypatch.setattr(fastattn._core, "sdpa", spy)
    monkeypatch.setattr(fastattn._sdpa, "_fast_path", True)
    np.testing.assert_array_equal(sdpa(q, k, v, **kwargs), results[0])
    assert bool(seen) == (form in ("float16", "per-batch"))
