"""fastattn.attention (score x normalize) against its NumPy twin on every ISA, plus the
exact semantics of hardmax / top-k (ties, -inf, NaN) and what runs where.

Each score's error bound in the compute dtype (``|q|``, ``|k|``: the largest row norms):
dot ``8 eps |q||k|`` (times ``scale`` for scaled_dot); general ``(8 + Eq) eps |q| ||W||_F
|k|``; cosine ``(16 + E) eps / temperature``; gaussian, through ``q.k / h^2 - ||k||^2 /
(2 h^2)``, ``(16 + E) eps (|q|^2 + |k|^2) / h^2``; additive as in
``family_checks.additive_score_error``; plus the float mask. Hardmax and top-k select keys
by score, so rows whose k-th and (k+1)-th scores lie within a few score errors of each
other may legitimately select differently: those rows are left out of the comparison
(``family_checks.unambiguous_rows``); exact ties are tested separately.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastattn
from fastattn import reference

from helpers.attention_checks import assert_close, same_bits
from helpers.family_checks import (
    additive_score_error,
    build,
    compute_eps,
    finite_max,
    fixture_ok,
    out_buffer,
    row_norm_max,
    specs,
    tolerances,
    unambiguous_rows,
)

attention = fastattn.attention
SCORES = ["dot", "scaled_dot", "general", "cosine", "gaussian", "additive"]
NORMALIZERS = ["softmax", "hardmax", "topk"]


def score_params(score, seed, eq, ek, dtype=np.float32):
    """Keyword arguments of a score, drawn from ``seed``."""
    rng = np.random.default_rng(seed + 1)
    if score == "scaled_dot":
        return {"scale": float(rng.choice([0.3, 1.0, 2.5]))}
    if score == "general":
        return {"weight": (rng.standard_normal((eq, ek)) / math.sqrt(eq)).astype(dtype)}
    if score == "cosine":
        return {"temperature": float(rng.choice([0.1, 0.5, 1.0]))}
    if score == "gaussian":
        return {"bandwidth": float(rng.choice([0.5, 1.0, 3.0]))}
    if score == "additive":
        h = int(rng.integers(1, 12))
        return {
            "w_q": (rng.standard_normal((eq, h)) / math.sqrt(eq)).astype(dtype),
            "w_k": (rng.standard_normal((ek, h)) / math.sqrt(ek)).astype(dtype),
            "w_v": rng.standard_normal(h).astype(dtype),
        }
    return {}


def score_error(score, q, k, params, attn_mask=None) -> float:
    if score == "additive":
        return additive_score_error(q, k, params["w_q"], params["w_k"], params["w_v"], attn_mask)
    weight = params.get("weight")
    eps, _ = compute_eps(q, k, *([] if weight is None else [weight]))
    qn, kn, e = row_norm_max(q), row_norm_max(k), q.shape[-1]
    if score == "dot":
        err = 8 * eps * qn * kn
    elif score == "scaled_dot":
        err = 8 * eps * abs(params.get("scale", 1 / math.sqrt(e))) * qn * kn
    elif score == "general":
        err = (8 + e) * eps * qn * float(np.linalg.norm(weight.astype(np.float64))) * kn
    elif score == "cosine":
        err = (16 + e) * eps / params["temperature"]
    else:
        err = (16 + e) * eps * (qn * qn + kn * kn) / params["bandwidth"] ** 2
    if attn_mask is not None and np.asarray(attn_mask).dtype.kind == "f":
        err += 4 * eps * finite_max(attn_mask)
    return err


def check(
    q, k, v, score, normalize, params, *, top_k=None, return_weights=False, use_out=False, **kwargs
):
    """fastattn vs the reference on the rows whose selection is unambiguous."""
    extra = {"top_k": top_k} if normalize == "topk" else {}
    expected, exp_w = reference.attention(
        q, k, v, score=score, normalize=normalize, return_weights=True, **params, **extra, **kwargs
    )
    out = out_buffer(expected) if use_out else None
    got = attention(
        q,
        k,
        v,
        score=score,
        normalize=normalize,
        return_weights=return_weights,
        out=out,
        **params,
        **extra,
        **kwargs,
    )
    got_w = None
    if return_weights:
        got, got_w = got
    if use_out:
        assert got is out
    eps, f16 = compute_eps(q, k, v, *[p for p in params.values() if isinstance(p, np.ndarray)])
    err = score_error(score, q, k, params, kwargs.get("attn_mask"))
    out_tol, w_tol = tolerances(err, k.shape[-2], finite_max(v), eps, f16)
    rows = None
    if normalize != "softmax":
        _, soft_w = reference.attention(
            q, k, v, score=score, return_weights=True, **params, **kwargs
        )
        rows = unambiguous_rows(soft_w, 1 if normalize == "hardmax" else top_k, 8 * err + 1e-12)
    assert_close("output", got, expected, out_tol, rows)
    if got_w is not None:
        assert_close("weights", got_w, exp_w, w_tol, rows)
    return got, rows


@st.composite
def cases(draw, masks="maybe"):
    score = draw(st.sampled_from(SCORES))
    normalize = draw(st.sampled_from(NORMALIZERS))
    spec = draw(
        specs(
            same_features=score not in ("general", "additive"),
            masks=masks,
            budget=20_000 if score == "additive" else 60_000,
        )
    )
    lk = spec.k_shape[-2]
    top_k = draw(st.integers(1, lk + 1)) if normalize == "topk" else None
    return score, normalize, spec, top_k


def run_case(case):
    score, normalize, spec, top_k = case
    q, k, v, kwargs = build(spec)
    params = score_params(score, spec.seed, q.shape[-1], k.shape[-1])
    check(
        q,
        k,
        v,
        score,
        normalize,
        params,
        top_k=top_k,
        return_weights=spec.return_weights,
        use_out=spec.out,
        **kwargs,
    )


@fixture_ok(3.0)
@given(case=cases())
def test_matches_reference(isa, case):
    """Every score with every normaliser: shapes, GQA, dtypes, layouts, masks, out=."""
    run_case(case)


@fixture_ok(1.0)
@given(case=cases(masks="always"))
def test_matches_reference_with_masks(isa, case):
    run_case(case)


@pytest.mark.parametrize("normalize", ["hardmax", "topk"])
def test_several_blocks_and_tasks(isa, normalize):
    """Enough rows and keys for several query tasks and key blocks, GQA, causal, a window."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 4, 90, 24)).astype(np.float32)
    k = rng.standard_normal((2, 2, 700, 24)).astype(np.float32)
    v = rng.standard_normal((2, 2, 700, 8)).astype(np.float32)
    got, rows = check(
        q,
        k,
        v,
        "scaled_dot",
        normalize,
        {},
        top_k=5,
        return_weights=True,
        is_causal=True,
        causal_alignment="bottom_right",
        window=(300, None),
    )
    assert rows.mean() > 0.9


# --------------------------------------------------------------------------------------
# Exact semantics


def test_hardmax_first_of_ties_and_exact_value(isa):
    """Integer scores tie exactly: hardmax takes the first key; the output is the value row
    itself, bit for bit."""
    q = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]], np.float32)
    k = np.array([[0.0, 2.0], [2.0, 0.0], [2.0, 0.0], [1.0, 1.0], [0.0, 2.0]], np.float32)
    v = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    out, w = attention(q, k, v, score="dot", normalize="hardmax", return_weights=True)
    # scores: row0 (0,2,2,1,0) -> key 1; row1 (2,0,0,1,2) -> key 0; row2 (2,2,2,2,2) -> 0;
    # row3 all 0 -> key 0.
    assert same_bits(out, v[[1, 0, 0, 0]])
    np.testing.assert_array_equal(w, np.eye(5, dtype=np.float32)[[1, 0, 0, 0]])
    ref = reference.attention(q, k, v, score="dot", normalize="hardmax")
    assert same_bits(out, ref)


def test_topk_ties_keep_first_keys(isa):
    q = np.array([[1.0]], np.float32)
    k = np.array([[1.0], [3.0], [1.0], [3.0], [1.0], [2.0]], np.float32)
    v = np.arange(6, dtype=np.float32)[:, None]
    _, w = attention(q, k, v, score="dot", normalize="topk", top_k=4, return_weights=True)
    # kept: 3 (key 1), 3 (key 3), 2 (key 5), then the first 1 (key 0)
    assert (w[0] > 0).tolist() == [True, True, False, True, False, True]
    e = np.exp(np.array([1.0, 3.0, 3.0, 2.0]) - 3.0)
    np.testing.assert_allclose(w[0, [0, 1, 3, 5]], e / e.sum(), rtol=1e-6)
    ref = reference.attention(q, k, v, score="dot", normalize="topk", top_k=4, return_weights=True)[
        1
    ]
    np.testing.assert_array_equal(w > 0, ref > 0)
    np.testing.assert_allclose(w, ref, rtol=0, atol=1e-7)


def test_topk_keeping_every_key_is_softmax():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 6, 4)).astype(np.float32) for _ in range(3))
    a = attention(q, k, v, normalize="topk", top_k=6)
    assert same_bits(a, attention(q, k, v))
    assert same_bits(a, attention(q, k, v, normalize="topk", top_k=100))


def test_minus_inf_counts_as_masked_and_nan_poisons_the_row(isa):
    q = np.ones((4, 1), np.float32)
    k = np.arange(5, dtype=np.float32)[:, None]
    v = np.arange(5, dtype=np.float32)[:, None] * 10
    mask = np.zeros((4, 5), np.float32)
    mask[0] = -np.inf  # row 0: nothing visible -> 0
    mask[1, 4] = -np.inf  # row 1: best visible is key 3
    mask[2, 2] = np.nan  # row 2: NaN score -> NaN row
    mask[3, 1] = np.inf  # row 3: +inf: hardmax picks it; top-k is inf - inf = NaN
    for normalize, extra in (("hardmax", {}), ("topk", {"top_k": 2})):
        got, w = attention(
            q, k, v, mask, score="dot", normalize=normalize, return_weights=True, **extra
        )
        exp, exp_w = reference.attention(
            q, k, v, mask, score="dot", normalize=normalize, return_weights=True, **extra
        )
        assert_close(normalize, got, exp, 1e-5)
        assert_close(normalize + " weights", w, exp_w, 1e-6)
        assert (got[0] == 0).all() and (w[0] == 0).all()
        assert np.isnan(got[2]).all() and np.isnan(w[2]).all()
    assert attention(q, k, v, mask, score="dot", normalize="hardmax")[3, 0] == 10.0
    assert np.isnan(attention(q, k, v, mask, score="dot", normalize="topk", top_k=2)[3]).all()


def test_cosine_zero_vectors_and_scale_invariance(isa):
    rng = np.random.default_rng(4)
    q = rng.standard_normal((5, 3))
    k = rng.standard_normal((7, 3))
    v = rng.standard_normal((7, 2))
    k[2] = 0.0  # cosine 0 with every query
    a = attention(q, k, v, score="cosine", temperature=0.2)
    b = attention(q * 1e200, k * 1e-200, v, score="cosine", temperature=0.2)
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(
        a, reference.attention(q, k, v, score="cosine", temperature=0.2), atol=1e-13
    )


def test_gaussian_is_a_per_key_bias_on_dot_products():
    """What runs where: gaussian = scaled_dot with scale 1/h^2 and a float mask of
    -||k||^2 / (2 h^2) broadcast along the rows; the same kernel, the same bits."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 3, 8, 4)).astype(np.float32) for _ in range(3))
    h = 1.7
    bias = (-(k.astype(np.float64) ** 2).sum(-1) / (2 * h * h)).astype(np.float32)
    a = attention(q, k, v, score="gaussian", bandwidth=h)
    b = fastattn.scaled_dot_product_attention(q, k, v, bias[..., None, :], scale=1 / h**2)
    assert same_bits(a, b)


def test_scaled_dot_softmax_is_sdpa():
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 2, 9, 8)).astype(np.float32) for _ in range(3))
    mask = rng.random((9, 9)) < 0.7
    assert same_bits(
        attention(q, k, v, mask, is_causal=True),
        fastattn.scaled_dot_product_attention(q, k, v, mask, is_causal=True),
    )


@pytest.mark.parametrize("score", SCORES)
def test_thread_count_does_not_change_bits(score):
    """The family's kernels (hardmax/top-k for every score, additive with any normaliser);
    softmax over dot-like scores is the SDPA kernel, whose own tests cover it."""
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 2, 70, 6)).astype(np.float32)
    k = rng.standard_normal((2, 1, 300, 6)).astype(np.float32)
    v = rng.standard_normal((2, 1, 300, 5)).astype(np.float32)
    params = score_params(score, 7, 6, 6)
    normalizers = [("hardmax", {}), ("topk", {"top_k": 7})]
    if score == "additive":
        normalizers.append(("softmax", {}))
    for normalize, extra in normalizers:
        runs = [
            attention(
                q,
                k,
                v,
                score=score,
                normalize=normalize,
                num_threads=n,
                return_weights=True,
                **params,
                **extra,
            )
            for n in (1, 2, 3)
        ]
        for out, w in runs[1:]:
            assert same_bits(out, runs[0][0]) and same_bits(w, runs[0][1])


def test_large_top_k_uses_small_task_blocks(isa):
    """top_k in the thousands: fewer rows per task keep the heaps small; still exact."""
    rng = np.random.default_rng(8)
    q = rng.standard_normal((3, 4)).astype(np.float32)
    k = rng.standard_normal((5000, 4)).astype(np.float32)
    v = rng.standard_normal((5000, 2)).astype(np.float32)
    check(q, k, v, "dot", "topk", {}, top_k=4000, return_weights=True)


# --------------------------------------------------------------------------------------
# Bad input: the same errors from fastattn and the reference

_rng = np.random.default_rng(0)
Q, K, V = (_rng.standard_normal(s).astype(np.float32) for s in ((2, 5, 4), (2, 6, 4), (2, 6, 3)))
BAD = {
    "score-unknown": ({"score": "bilinear"}, ValueError, r"score must be one of 'dot'"),
    "score-none": ({"score": None}, ValueError, r"score must be one of"),
    "normalize-unknown": (
        {"normalize": "sparsemax"},
        ValueError,
        r"normalize must be one of 'softmax', 'hardmax', 'topk'",
    ),
    "topk-missing-k": ({"normalize": "topk"}, ValueError, r"needs top_k="),
    "top_k-with-softmax": ({"top_k": 2}, ValueError, r"top_k= is a parameter of normalize='topk'"),
    "top_k-zero": ({"normalize": "topk", "top_k": 0}, ValueError, r"top_k must be >= 1"),
    "top_k-float": ({"normalize": "topk", "top_k": 2.0}, TypeError, r"top_k must be an int"),
    "top_k-bool": ({"normalize": "topk", "top_k": True}, TypeError, r"top_k must be an int"),
    "scale-with-dot": (
        {"score": "dot", "scale": 2.0},
        ValueError,
        r"scale= is a parameter of score='scaled_dot', not of score='dot'",
    ),
    "weight-with-cosine": (
        {"score": "cosine", "weight": np.eye(4)},
        ValueError,
        r"weight= is a parameter of score='general'",
    ),
    "w_q-with-gaussian": (
        {"score": "gaussian", "w_q": np.eye(4)},
        ValueError,
        r"w_q= is a parameter of score='additive'",
    ),
    "general-no-weight": ({"score": "general"}, ValueError, r"needs weight="),
    "general-weight-shape": (
        {"score": "general", "weight": np.eye(3)},
        ValueError,
        r"weight must have shape \(query features, key features\) = "
        r"\(4, 4\), got shape \(3, 3\)",
    ),
    "general-weight-int": (
        {"score": "general", "weight": np.eye(4, dtype=int)},
        TypeError,
        r"weight must be a floating-point array",
    ),
    "temperature-zero": (
        {"score": "cosine", "temperature": 0.0},
        ValueError,
        r"temperature must be > 0",
    ),
    "temperature-str": (
        {"score": "cosine", "temperature": "1"},
        TypeError,
        r"temperature must be a real number",
    ),
    "bandwidth-negative": (
        {"score": "gaussian", "bandwidth": -1.0},
        ValueError,
        r"bandwidth must be > 0",
    ),
    "bandwidth-tiny": (
        {"score": "gaussian", "bandwidth": 1e-30},
        ValueError,
        r"bandwidth gives 1 / bandwidth\*\*2 = .* not finite in float32",
    ),
    "additive-missing": (
        {"score": "additive", "w_q": np.eye(4)},
        ValueError,
        r"additive scores need w_q, w_k and w_v; missing w_k, w_v",
    ),
    "additive-w_v-shape": (
        {
            "score": "additive",
            "w_q": np.ones((4, 3)),
            "w_k": np.ones((4, 3)),
            "w_v": np.ones((3, 1)),
        },
        ValueError,
        r"w_v must have shape \(hidden,\) = \(3,\)",
    ),
    "scale-nan": ({"scale": float("nan")}, ValueError, r"scale must be finite"),
    "return_weights-int": (
        {"return_weights": 1},
        TypeError,
        r"return_weights must be True or False",
    ),
    "features": (
        {"key": np.ones((2, 6, 5), np.float32)},
        ValueError,
        r"key has feature size 5 .* query has 4",
    ),
    "mask-shape": (
        {"attn_mask": np.ones((4, 4), bool)},
        ValueError,
        r"attn_mask of shape \(4, 4\) does not broadcast",
    ),
    "out-shape": (
        {"out": np.empty((2, 5, 4), np.float32)},
        ValueError,
        r"out must have shape \(2, 5, 3\)",
    ),
    "num_threads": ({"num_threads": 0}, ValueError, r"num_threads must be >= 1"),
}


@pytest.mark.parametrize("fn", [attention, reference.attention], ids=["fastattn", "reference"])
@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input(fn, name):
    kwargs, exc, pattern = BAD[name]
    kwargs = dict(kwargs)
    q, k, v = kwargs.pop("query", Q), kwargs.pop("key", K), kwargs.pop("value", V)
    with pytest.raises(exc, match=pattern) as info:
        fn(q, k, v, **kwargs)
    assert type(info.value) is exc


def test_out_aliasing_weight_rejected():
    w = np.zeros((2, 5, 4), np.float32)
    with pytest.raises(ValueError, match="out shares memory with weight"):
        attention(Q, K, V[..., :3], score="general", weight=w[0, :4, :], out=w[..., :3])


def test_doctests():
    """The examples in the family's docstrings run (fastattn.reference's are run by
    tests/layer/test_mha.py)."""
    import doctest

    import fastattn._family

    result = doctest.testmod(fastattn._family, optionflags=doctest.ELLIPSIS, report=True)
    assert result.attempted >= 6 and result.failed == 0


def test_concurrent_python_threads():
    """The family's kernels release the GIL and share nothing between calls: four Python
    threads calling them at once get exactly the sequential results."""
    import threading

    rng = np.random.default_rng(14)
    q = rng.standard_normal((2, 2, 40, 8)).astype(np.float32)
    k = rng.standard_normal((2, 1, 150, 8)).astype(np.float32)
    v = rng.standard_normal((2, 1, 150, 4)).astype(np.float32)
    w = score_params("additive", 3, 8, 8)
    calls = [
        lambda: attention(q, k, v, normalize="topk", top_k=5, num_threads=2),
        lambda: attention(q, k, v, score="additive", normalize="hardmax", num_threads=2, **w),
        lambda: fastattn.additive_attention(q, k, v, w["w_q"], w["w_k"], w["w_v"], num_threads=2),
        lambda: fastattn.masked_softmax(q, num_threads=2),
        lambda: fastattn.nadaraya_watson(
            q, k, v, kernel="epanechnikov", bandwidth=4.0, num_threads=2
        ),
    ]
    expected = [call() for call in calls]
    results = {}

    def work(index):
        for _ in range(3):
            got = calls[index % len(calls)]()
            results.setdefault(index, []).append(got)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2 * len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for index, outs in results.items():
        for got in outs:
            assert same_bits(got, expected[index % len(calls)])
