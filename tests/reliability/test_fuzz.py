"""Fuzzing every public function with arbitrary inputs (hypothesis).

Each example draws a call: shapes (empty axes, broadcast leading dims, GQA heads, several key
blocks, split-key decoding), dtypes (float16/32/64 in either byte order, and int, complex,
bool, object and string arrays that must be refused), memory layouts (see
``tests/helpers/reliability_checks.py``: negative, zero and overlapping strides, gaps,
unaligned data, strides that are not a multiple of the item size, read-only arrays, nested
lists), masks
(bool, float with -inf/NaN, wrong dtypes and shapes), ``valid_lens`` (in and out of range,
any integer dtype, wrong shapes), windows, flags, scales, softcaps, thread counts, ``out=``
buffers (exact, strided, wrong, read-only, aliasing an input) and the ISA. Then:

* the call either raises ``ValueError``/``TypeError`` -- the same exception, with the same
  message, as ``fastattn.reference`` (which shares the validation), and never the C++
  layer's own re-check (``fastattn._core.*``: that would mean validation let a bad
  argument through) -- or it returns what the reference returns: same shapes, dtypes and
  NaN/inf positions, and values within the error of the same math done in the compute
  dtype (the tolerance helpers below say why for each function);
* no other exception, no warning (``filterwarnings = error``), no crash; the inputs are
  bytewise unchanged; ``out=`` is what comes back.

Special values: NaN/inf are placed either past the keys any row may see (``valid_lens``
padding: they must never reach the output) or anywhere in one input. Values of attended keys
are non-finite only when every score is small enough (|s| <= 38 in float32) that no weight
underflows to 0 in the kernel while staying positive in the float64 reference: a weight of
exactly 0 keeps a key's value out of the output in both, so only then is "does a non-finite
value reach the output" the same question for both.

Hardmax/top-k rows whose k-th and (k+1)-th best scores lie within the score error of each
other, and kernel-regression queries with a key within the distance error of a compact
kernel's edge, may legitimately select differently; those rows are not compared.

Scale: ``FASTATTN_FUZZ_EXAMPLES`` examples per function (default 25), e.g.::

    FASTATTN_FUZZ_EXAMPLES=3000 pytest tests/reliability/test_fuzz.py -p no:cacheprovider \\
        --hypothesis-show-statistics

(``--hypothesis-show-statistics`` prints the count and the outcomes: which errors were
raised how often, how many calls compared results).
"""

from __future__ import annotations

import math
import os

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import fastattn
from fastattn import reference
from fastattn._compute import silverman_bandwidth
from fastattn._validation import (
    additive_args,
    attention_spec,
    regression_args,
    result_dtypes,
    sdpa_args,
)

from helpers.attention_checks import assert_close_attention, unpack
from helpers.reliability_checks import (
    BAD_FLOATS,
    FLOATS,
    KEEPS_VALUES,
    LAYOUTS,
    active_isa,
    assert_close,
    compute_eps,
    dtype_of,
    finite_max,
    finite_values,
    realize,
    row_norm_max,
    same_content,
)

EXAMPLES = int(os.environ.get("FASTATTN_FUZZ_EXAMPLES", "25"))
FUZZ = settings(
    max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
ISAS = fastattn._core.available_isas()
SEEDS = st.integers(0, 2**32 - 1)
SPECIALS = (np.nan, np.inf, -np.inf)


def maybe(*values):
    """A draw from ``values`` (repeat an item to weight it)."""
    return st.sampled_from(values)


def pick(draw, bad: bool, good: tuple, wrong: tuple = ()):
    """A draw from ``good``; in a case that may be invalid (``bad``), from ``wrong`` too.
    A quarter of the cases may be invalid, so most calls reach the kernels."""
    return draw(st.sampled_from(tuple(good) + (tuple(wrong) if bad else ())))


BAD_CASE = maybe(False, False, False, True)


# --------------------------------------------------------------------------------------
# Running a call against the reference


def _flatten(args, kwargs) -> list:
    return list(args) + [kwargs[k] for k in sorted(kwargs) if k != "out"]


def run_both(case, build, fast, ref):
    """Call ``ref`` and ``fast`` on fresh copies of the case's arguments. Returns None if
    both raised the same ValueError/TypeError, else (got, expected, args, kwargs)."""
    args_r, kw_r = build(case)
    args_f, kw_f = build(case)
    pristine_args, pristine_kw = build(case)
    ref_error = fast_error = None
    try:
        expected = ref(*args_r, **kw_r)
    except (TypeError, ValueError) as exc:
        ref_error = exc
    with active_isa(case["isa"]):
        try:
            got = fast(*args_f, **kw_f)
        except (TypeError, ValueError) as exc:
            fast_error = exc
    for a, b in zip(_flatten(args_f, kw_f), _flatten(pristine_args, pristine_kw)):
        assert same_content(a, b), "an input was modified by the call"
    if ref_error is not None:
        assert fast_error is not None, f"the reference raised {ref_error!r}, fastattn returned"
        assert type(fast_error) is type(ref_error), (fast_error, ref_error)
        assert str(fast_error) == str(ref_error)
        message = str(fast_error)
        assert message and "fastattn._core" not in message, message
        event(f"raised {type(fast_error).__name__}")
        return None
    if fast_error is not None:
        raise AssertionError(f"fastattn raised {fast_error!r}; the reference returned")
    event("compared with the reference")
    out = kw_f.get("out")
    if out is not None:
        first = got[0] if isinstance(got, tuple) else got
        assert first is out, "out= is not what came back"
    return got, expected, args_f, kw_f


# --------------------------------------------------------------------------------------
# Drawing the pieces every attention-shaped call has


def array_spec(draw, bad: bool = False):
    wrong = bad and draw(st.integers(0, 5)) == 0
    return {
        "dtype": draw(st.sampled_from(BAD_FLOATS if wrong else FLOATS)),
        "layout": draw(st.sampled_from(LAYOUTS)),
        "mag": draw(maybe(1.0, 1.0, 1.0, 0.01, 30.0)),
    }


def operand_spec(draw, nbatch: int, bad: bool):
    """Which leading dims an operand keeps (from the right), which of them are 1, and
    whether it keeps its head axis (only when it has one head)."""
    keep = draw(st.integers(0, nbatch))
    return {
        **array_spec(draw, bad),
        "keep": keep,
        "ones": [draw(maybe(False, False, False, True)) for _ in range(keep)],
        "drop_head": draw(maybe(False, False, False, True)),
    }


@st.composite
def layouts(draw, bad: bool, qk_dims="same"):
    """Shapes of an attention call: batch, heads, lengths, feature sizes; per-operand
    specs; and an optional corruption that makes the call invalid."""
    size = draw(maybe(*(("small",) * 10), "blocks", "decode"))
    if size == "small":
        nbatch = draw(st.integers(0, 2))
        batch = [draw(maybe(1, 2, 3, 1, 2, 3, 0)) for _ in range(nbatch)]
        hkv, group = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        lq, lk = draw(maybe(0, *range(1, 10))), draw(maybe(0, *range(1, 10)))
        e = draw(maybe(1, 2, 3, 4, 5, 7, 8, 9, 16, 17))
        ev = draw(maybe(0, 1, 2, 3, 5, 8, 9))
    elif size == "blocks":  # several key blocks and query sub-blocks
        nbatch, batch = 1, [draw(st.integers(1, 2))]
        hkv, group = 1, draw(st.integers(1, 2))
        lq, lk = draw(st.integers(1, 80)), draw(st.integers(500, 1100))
        e, ev = draw(maybe(1, 4, 8, 33)), draw(maybe(1, 4, 9))
    else:  # decoding: few rows, long keys split across threads
        nbatch, batch = 0, []
        hkv, group = 1, draw(st.integers(1, 2))
        lq, lk = draw(st.integers(1, 2)), draw(st.integers(2048, 4200))
        e, ev = 64, draw(maybe(1, 8))
    e_k = e if qk_dims == "same" else draw(maybe(e, 1, 3, 6))
    return {
        "size": size,
        "batch": batch,
        "hkv": hkv,
        "group": group,
        "lq": lq,
        "lk": lk,
        "e": e,
        "e_k": e_k,
        "ev": ev,
        "q": operand_spec(draw, nbatch, bad),
        "k": operand_spec(draw, nbatch, bad),
        "v": operand_spec(draw, nbatch, bad),
        "corrupt": pick(
            draw, bad, (None,) * 6, ("e", "lv", "hv", "heads", "batch", "rank1", "rank0", "e0")
        ),
    }


def mask_spec(draw, bad: bool):
    kind = pick(
        draw,
        bad,
        (None, None, None, None, "bool", "bool", "float", "float", "scalar"),
        ("int", "badshape"),
    )
    if kind is None:
        return None
    return {
        "kind": kind,
        "keep": draw(st.integers(0, 5)),
        "ones": [draw(maybe(False, False, True)) for _ in range(5)],
        "p": draw(maybe(0.0, 0.5, 0.8, 1.0)),
        "layout": draw(st.sampled_from(LAYOUTS)),
        "dtype": draw(st.sampled_from(FLOATS)),
        "neginf": draw(maybe(0.0, 0.2, 1.0)),
    }


def valid_lens_spec(draw, bad: bool):
    kind = pick(
        draw, bad, (None, None, None, "ok", "ok", "ok", "list"), ("out", "float", "badshape")
    )
    if kind is None:
        return None
    return {
        "kind": kind,
        "prefix": draw(st.integers(0, 5)),
        "ones": [draw(maybe(False, False, True)) for _ in range(5)],
        "dtype": draw(maybe("i8", "i8", "i4", "u1", "i1", ">i8")),
        "layout": draw(st.sampled_from(LAYOUTS)),
    }


WINDOW_SIDES = (None, None, 0, 1, 2, 3, 5, 10**12)


def window_value(draw, bad: bool):
    kind = pick(
        draw, bad, ("none", "none", "ok", "ok", "ok", "list"), ("negative", "float", "short")
    )
    if kind == "none":
        return None
    if kind == "negative":
        return (-1, draw(st.sampled_from(WINDOW_SIDES)))
    if kind == "float":
        return (1.5, 2)
    if kind == "short":
        return (1,)
    pair = (draw(st.sampled_from(WINDOW_SIDES)), draw(st.sampled_from(WINDOW_SIDES)))
    if kind == "list":
        return [np.int32(x) if x is not None and x < 2**31 else x for x in pair]
    return pair


def common_flags(draw, bad: bool) -> dict:
    return {
        "is_causal": pick(draw, bad, (False, False, True, True, np.True_), (1,)),
        "causal_alignment": pick(draw, bad, ("top_left", "top_left", "bottom_right"), ("center",)),
        "window": window_value(draw, bad),
        "num_threads": pick(draw, bad, (None, None, 1, 2, 3, 8, np.int64(2)), (0, -1, 2.5, True)),
        "return_weights": pick(draw, bad, (False, False, True), ("yes",)),
    }


def out_mode(draw, bad: bool):
    return pick(
        draw,
        bad,
        (*((None,) * 6), "exact", "strided", "fortran", "disjoint"),
        ("wrong-shape", "wrong-dtype", "readonly", "alias", "list"),
    )


# --------------------------------------------------------------------------------------
# Building an attention-shaped call from its specs


def operand_shape(c, name: str) -> tuple:
    spec = c[name]
    batch = c["batch"][len(c["batch"]) - spec["keep"] :] if spec["keep"] else []
    batch = [1 if one else n for n, one in zip(batch, spec["ones"])]
    heads = {"q": c["hkv"] * c["group"], "k": c["hkv"], "v": c["hkv"]}[name]
    length = c["lq"] if name == "q" else c["lk"]
    dim = {"q": c["e"], "k": c["e_k"], "v": c["ev"]}[name]
    fix = c["corrupt"]
    if name == "k" and fix == "e":
        dim += 1
    if name == "k" and fix == "e0":
        dim = 0
    if name == "q" and fix == "e0":
        dim = 0
    if name == "v" and fix == "lv":
        length += 1
    if name == "v" and fix == "hv":
        heads += 1
    if name == "q" and fix == "heads" and c["hkv"] > 1:
        heads += 1
    if name == "k" and fix == "batch" and batch:
        batch[0] = batch[0] + 2
    head = [] if spec["drop_head"] and heads == 1 else [heads]
    shape = tuple(batch + head + [length, dim])
    if name == "q" and fix == "rank1":
        shape = (dim,)
    if name == "q" and fix == "rank0":
        shape = ()
    return shape


def draw_values(rng, shape, mag):
    return rng.standard_normal(shape) * mag


def place(rng, values, count, where=None):
    """Put NaN/+inf/-inf at ``count`` random positions of ``values`` (float64, in place),
    restricted to the bool array ``where`` if given."""
    if values.size == 0:
        return
    candidates = np.flatnonzero(np.ones(values.shape, bool) if where is None else where)
    if candidates.size == 0:
        return
    for pos in rng.choice(candidates, size=min(count, candidates.size), replace=False):
        values.flat[pos] = SPECIALS[rng.integers(0, 3)]


def scores_shape(c, q_shape) -> tuple:
    """The scores' shape the caller sees, from the query's shape (before corruption)."""
    batch = tuple(c["batch"])
    hq = c["hkv"] * c["group"]
    full = batch + (hq, c["lq"], c["lk"])
    ndim = max(len(q_shape), 2)
    return full[len(full) - ndim :]


def make_mask(rng, c, spec, scores):
    if spec is None:
        return None
    if spec["kind"] == "scalar":
        return np.bool_(rng.random() < 0.8)
    keep = min(spec["keep"], len(scores))
    shape = list(scores[len(scores) - keep :])
    shape = [1 if one else n for n, one in zip(shape, spec["ones"])]
    if spec["kind"] == "badshape":
        shape = shape + [2] if shape else [3, 2]
    shape = tuple(shape)
    if spec["kind"] in ("bool", "badshape"):
        values = (rng.random(shape) < spec["p"]).astype(np.float64)
        return realize(values, np.dtype(bool), spec["layout"], rng)
    if spec["kind"] == "int":
        return np.zeros(shape, np.int32)
    values = rng.standard_normal(shape)
    values[rng.random(shape) < spec["neginf"] * 0.5] = -np.inf
    layout = spec["layout"]
    return realize(values, dtype_of(*spec["dtype"]), layout, rng)


def make_valid_lens(rng, c, spec, rows, num_keys, limit=None):
    """``limit``: largest length allowed (padding specials sit past it)."""
    if spec is None:
        return None
    prefix = min(spec["prefix"], len(rows))
    shape = [1 if one else n for n, one in zip(rows[:prefix], spec["ones"])]
    if spec["kind"] == "badshape":
        shape = shape[:-1] + [shape[-1] + 1] if shape else [2, 2, 2, 2, 2, 2]
    hi = num_keys if limit is None else limit
    values = rng.integers(0, hi + 1, size=tuple(shape)).astype(np.float64)
    if spec["kind"] == "out" and values.size:
        values.flat[rng.integers(0, values.size)] = rng.choice([-1, num_keys + 1, 2**40])
    if spec["kind"] == "float":
        return realize(values, np.dtype(np.float32), "c", rng)
    if spec["kind"] == "list":
        return values.astype(np.int64).tolist()
    dt = np.dtype(spec["dtype"])
    if dt.itemsize == 1 and values.size and values.max() > 100:
        dt = np.dtype("i8")
    with np.errstate(all="ignore"):
        return realize(values, dt, spec["layout"], rng)


def realize_operand(rng, c, name, values):
    spec = c[name]
    dt = dtype_of(*spec["dtype"])
    return realize(values, dt, spec["layout"], rng)


def make_out(rng, mode, info, inputs: dict):
    """An out= buffer for the mode, given the validated (shape, dtype) or None."""
    if mode is None:
        return None
    shape, dt = info if info is not None else ((1,), np.dtype(np.float32))
    if mode == "list":
        return np.zeros(shape).tolist()
    if mode == "wrong-shape":
        return np.zeros(tuple(shape) + (1,), dt)
    if mode == "wrong-dtype":
        return np.zeros(shape, np.float64 if dt != np.float64 else np.float32)
    if mode == "readonly":
        out = np.zeros(shape, dt)
        out.flags.writeable = False
        return out
    if mode == "fortran":
        return np.asfortranarray(np.zeros(shape, dt))
    if mode == "strided":
        return realize(np.zeros(shape), dt, "permuted", rng)
    if mode in ("alias", "disjoint"):
        return "alias"  # resolved by share_memory()
    return np.zeros(shape, dt)


def share_memory(mode, target: np.ndarray, shape, dt):
    """(new target, out): ``target``'s values in a buffer that ``out`` overlaps ("alias")
    or follows ("disjoint")."""
    shape = tuple(shape)
    out_bytes = int(np.prod(shape)) * dt.itemsize
    raw = np.zeros(out_bytes + target.nbytes + 64, np.uint8)
    if mode == "alias":
        t_start = 0
        o_start = min(target.nbytes // 2 // 8 * 8, max(target.nbytes - 8, 0))
    else:
        t_start, o_start = 0, (target.nbytes + 63) // 64 * 64
    new = raw[t_start : t_start + target.nbytes].view(target.dtype).reshape(target.shape)
    new[...] = target
    out = raw[o_start : o_start + out_bytes].view(dt).reshape(shape)
    return new, out


def score_bound(q, k, factor, mask=None, softcap=None) -> float:
    bound = abs(factor) * row_norm_max(q) * row_norm_max(k)
    if softcap is not None:
        bound = min(bound, softcap)
    if mask is not None and np.asarray(mask).dtype.kind == "f":
        bound += finite_max(mask)
    return bound


def underflow_free(bound: float, *arrays) -> bool:
    """Whether no softmax weight can underflow to 0 (|s| <= bound): see the module doc."""
    try:
        eps, _ = compute_eps(*arrays)
    except (TypeError, ValueError):  # not a float dtype: the call is refused anyway
        return False
    return bound <= (38.0 if eps > 1e-10 else 350.0)


def padding_limit(rng, c, specials):
    """For "padding" specials: the first key past every row's valid length (the specials
    sit at keys from there on, so only with valid_lens in range)."""
    vl = c.get("valid_lens")
    if specials != "padding" or c["lk"] == 0 or vl is None or vl["kind"] not in ("ok", "list"):
        return None
    return int(rng.integers(0, c["lk"]))


def attention_operands(rng, c, specials, v_special_ok):
    """(query, key, value) as float64 values (before layout), with special values placed as
    ``specials`` says; ``v_special_ok(q, k)`` tells whether attended values may be
    non-finite."""
    shapes = {n: operand_shape(c, n) for n in "qkv"}
    vals = {n: draw_values(rng, shapes[n], c[n]["mag"]) for n in "qkv"}
    limit = c.get("_limit")
    if specials == "padding" and limit is not None:
        for n in "kv":
            if c[n]["layout"] in KEEPS_VALUES and len(shapes[n]) >= 2:
                where = np.zeros(shapes[n], bool)
                where[..., limit:, :] = True
                place(rng, vals[n], 3, where)
    elif specials == "anywhere":
        target = c["_target"]
        if target == "v" and not v_special_ok(vals["q"], vals["k"]):
            target = "q"
        if c[target]["layout"] in KEEPS_VALUES:
            place(rng, vals[target], int(rng.integers(1, 4)))
    return shapes, vals


# --------------------------------------------------------------------------------------
# scaled_dot_product_attention


@st.composite
def sdpa_cases(draw):
    bad = draw(BAD_CASE)
    c = draw(layouts(bad))
    c.update(
        seed=draw(SEEDS),
        isa=draw(st.sampled_from(ISAS)),
        mask=mask_spec(draw, bad),
        valid_lens=valid_lens_spec(draw, bad),
        flags=common_flags(draw, bad),
        scale=pick(
            draw,
            bad,
            (None, None, None, 0.5, 1.7, -1.0, 0.0, np.float32(0.25), 2),
            (np.nan, np.inf, 1e300, "s", True),
        ),
        softcap=pick(draw, bad, (*((None,) * 6), 0.7, 5.0, 30.0, 1e300), (0.0, -1.0, np.nan)),
        return_lse=draw(maybe(False, False, True)),
        out=out_mode(draw, bad),
        specials=draw(maybe(None, None, None, "padding", "anywhere")),
        _target=draw(maybe("q", "k", "v", "v")),
    )
    return c


def build_sdpa(c):
    rng = np.random.default_rng(c["seed"])
    flags = dict(c["flags"])
    scale, softcap = c["scale"], c["softcap"]
    c["_limit"] = padding_limit(rng, c, c["specials"])
    mask_vals = None

    def v_ok(q, k):
        e = max(q.shape[-1], 1) if q.ndim else 1
        factor = 1 / math.sqrt(e) if scale is None or isinstance(scale, str) else float(scale)
        cap = softcap if isinstance(softcap, float) and 0 < softcap < 1e30 else None
        with np.errstate(all="ignore"):
            bound = score_bound(q, k, factor if math.isfinite(factor) else 1e300, mask_vals, cap)
        return underflow_free(bound, *(dtype_of(*c[n]["dtype"]).type(0) for n in "qkv"))

    shapes, vals = attention_operands(rng, c, c["specials"], v_ok)
    q, k, v = (realize_operand(rng, c, n, vals[n]) for n in "qkv")
    mask = make_mask(rng, c, c["mask"], scores_shape(c, shapes["q"]))
    rows = scores_shape(c, shapes["q"])[:-1]
    vl = make_valid_lens(rng, c, c["valid_lens"], rows, c["lk"], c["_limit"])
    kwargs = dict(valid_lens=vl, scale=scale, softcap=softcap, return_lse=c["return_lse"], **flags)
    info = None
    try:
        a = sdpa_args(
            q,
            k,
            v,
            mask,
            vl,
            flags["is_causal"],
            flags["causal_alignment"],
            flags["window"],
            scale,
            softcap,
        )
        info = (a.out_shape, a.result_dtype)
    except (TypeError, ValueError):
        pass
    out = make_out(rng, c["out"], info, {})
    if isinstance(out, str):
        if isinstance(q, np.ndarray) and info is not None:
            q, out = share_memory(c["out"], np.ascontiguousarray(q), *info)
        else:
            out = None
    kwargs["out"] = out
    return [q, k, v, mask], kwargs


@FUZZ
@given(sdpa_cases())
def test_fuzz_scaled_dot_product_attention(c):
    result = run_both(
        c, build_sdpa, fastattn.scaled_dot_product_attention, reference.scaled_dot_product_attention
    )
    if result is None:
        return
    got, expected, (q, k, v, mask), kw = result
    flags = (kw["return_lse"], kw["return_weights"])
    softcap = kw["softcap"]
    _, compute = result_dtypes(*(np.asarray(a) for a in (q, k, v)))
    if softcap is not None and softcap > float(np.finfo(compute).max):
        softcap = None  # so large that validation drops it
    assert_close_attention(
        unpack(got, *flags),
        unpack(expected, *flags),
        q,
        k,
        v,
        attn_mask=mask,
        scale=kw["scale"],
        softcap=softcap,
    )


# --------------------------------------------------------------------------------------
# masked_softmax


@st.composite
def softmax_cases(draw):
    bad = draw(BAD_CASE)
    ndim = pick(draw, bad, (1, 1, 2, 2, 3, 3, 4), (0,))
    long = draw(maybe(False, False, False, False, True))
    shape = [draw(maybe(0, 1, 2, 3, 5, 7, 9, 17)) for _ in range(ndim)]
    axis = draw(st.integers(-ndim - bad, ndim - 1 + bad)) if ndim else draw(maybe(0, -1))
    if long and ndim:
        shape[axis % ndim if -ndim <= axis < ndim else -1] = draw(st.integers(100, 3000))
    return {
        "seed": draw(SEEDS),
        "isa": draw(st.sampled_from(ISAS)),
        "shape": shape,
        "axis": pick(draw, bad, (axis, axis, axis, np.int64(axis)), (1.0, None)),
        "x": array_spec(draw, bad),
        "huge": draw(maybe(False, False, False, True)),
        "specials": draw(maybe(None, None, "anywhere")),
        "valid_lens": valid_lens_spec(draw, bad),
        "mask": pick(draw, bad, (None, None, "bool"), ("float",)),
        "mask_spec": mask_spec(draw, False),
        "num_threads": pick(draw, bad, (None, 1, 2, 3), (0, 1.5)),
        "out": out_mode(draw, bad),
    }


def build_softmax(c):
    rng = np.random.default_rng(c["seed"])
    shape = tuple(c["shape"])
    dt = dtype_of(*c["x"]["dtype"])
    values = draw_values(rng, shape, c["x"]["mag"])
    if c["huge"] and dt.kind == "f":
        values *= float(np.finfo(dt).max) / 8 / max(finite_max(values), 1.0)
    if c["specials"] == "anywhere" and c["x"]["layout"] in KEEPS_VALUES:
        place(rng, values, int(rng.integers(1, 4)))
    x = realize(values, dt, c["x"]["layout"], rng)
    axis = c["axis"]
    kwargs = {"num_threads": c["num_threads"], "axis": axis}
    ax = None
    if isinstance(axis, (int, np.integer)) and not isinstance(axis, bool) and shape:
        if -len(shape) <= axis < len(shape):
            ax = int(axis) % len(shape)
    rows = shape[:ax] + shape[ax + 1 :] if ax is not None else shape[:-1]
    length = shape[ax] if ax is not None else (shape[-1] if shape else 0)
    kwargs["valid_lens"] = make_valid_lens(rng, c, c["valid_lens"], rows, length)
    spec = c["mask_spec"] or {"keep": 9, "ones": [], "p": 0.7, "layout": "c"}
    mask = (
        None
        if c["mask"] is None
        else {**spec, "kind": c["mask"], "neginf": 0.0, "dtype": ("f4", False)}
    )
    kwargs["mask"] = make_mask(rng, c, mask, shape)  # a float mask: TypeError
    info = None
    if dt.kind == "f" and len(shape) >= 1:
        result = np.result_type(dt.newbyteorder("="))
        info = (shape, result)
    out = make_out(rng, c["out"], info, {})
    if isinstance(out, str):
        if isinstance(x, np.ndarray) and info is not None:
            x, out = share_memory(c["out"], np.ascontiguousarray(x), *info)
        else:
            out = None
    kwargs["out"] = out
    return [x], kwargs


def softmax_tolerance(x, length):
    """Every weight is exp(x_j - max) / sum: the exponential is good to a few ulp, the
    shift x_j - max is off by eps |x_j - max| (which moves the weight by that relatively:
    d e^-d <= 1/e), and the sum adds ``length`` roundings: eps (64 + 2 length) absolute."""
    eps, f16 = compute_eps(x)
    tol = eps * (64 + 2 * length)
    return tol + (2 * float(np.finfo(np.float16).eps) if f16 else 0.0)


@FUZZ
@given(softmax_cases())
def test_fuzz_masked_softmax(c):
    result = run_both(c, build_softmax, fastattn.masked_softmax, reference.masked_softmax)
    if result is None:
        return
    got, expected, (x,), kw = result
    x = np.asarray(x)
    ax = int(kw["axis"]) % x.ndim
    assert_close("masked_softmax", got, expected, softmax_tolerance(x, x.shape[ax]))


# --------------------------------------------------------------------------------------
# additive_attention and attention(score=..., normalize=...)


def additive_weights_values(rng, c, e_q, e_k):
    hidden = c["hidden"]
    w = {
        "w_q": rng.standard_normal((e_q, hidden)) / math.sqrt(max(e_q, 1)),
        "w_k": rng.standard_normal((e_k, hidden)) / math.sqrt(max(e_k, 1)),
        "w_v": rng.standard_normal((hidden,)),
    }
    if c["corrupt_w"] == "shape":
        w["w_q"] = rng.standard_normal((e_q + 1, hidden))
    elif c["corrupt_w"] == "rank":
        w["w_v"] = rng.standard_normal((hidden, 1))
    elif c["corrupt_w"] == "missing":
        w["w_v"] = None
    return {
        n: None if a is None else realize(a, dtype_of(*c["w_dtype"][n]), c["w_layout"][n], rng)
        for n, a in w.items()
    }


def family_common(draw, c, bad):
    c.update(
        seed=draw(SEEDS),
        isa=draw(st.sampled_from(ISAS)),
        mask=mask_spec(draw, bad),
        valid_lens=valid_lens_spec(draw, bad),
        flags=common_flags(draw, bad),
        out=out_mode(draw, bad),
        specials=draw(maybe(None, None, None, "padding", "anywhere")),
        _target=draw(maybe("q", "k", "v", "v")),
        hidden=draw(maybe(1, 2, 5, 8, 16)),
        corrupt_w=pick(draw, bad, (None,) * 6, ("shape", "rank", "missing")),
        w_dtype={n: draw(st.sampled_from(FLOATS)) for n in ("w_q", "w_k", "w_v")},
        w_layout={n: draw(st.sampled_from(LAYOUTS)) for n in ("w_q", "w_k", "w_v")},
    )
    return c


@st.composite
def additive_cases(draw):
    bad = draw(BAD_CASE)
    return family_common(draw, draw(layouts(bad, qk_dims="free")), bad)


def additive_bound(ws, mask):
    """|score| <= sum |w_v| (tanh is within [-1, 1]), plus the float mask."""
    bound = float(np.abs(finite_values(ws["w_v"])).sum()) if ws.get("w_v") is not None else 0.0
    if mask is not None and np.asarray(mask).dtype.kind == "f":
        bound += finite_max(mask)
    return bound


def build_family(c, score="additive", extra=None):
    """(args, kwargs) for additive_attention (score="additive", w_* positional) or
    attention(score=...); ``extra`` adds attention's own keyword arguments."""
    rng = np.random.default_rng(c["seed"])
    flags = dict(c["flags"])
    c["_limit"] = padding_limit(rng, c, c["specials"])
    q_shape, k_shape = operand_shape(c, "q"), operand_shape(c, "k")
    ws = None
    if score == "additive":
        ws = additive_weights_values(
            rng, c, q_shape[-1] if q_shape else 1, k_shape[-1] if k_shape else 1
        )
    mask_holder = {}

    def v_ok(q, k):
        if score == "additive":
            bound = additive_bound(ws, mask_holder.get("mask"))
        else:
            bound = family_score_bound(q, k, score, extra or {}, mask_holder.get("mask"))
        return underflow_free(bound, *(dtype_of(*c[n]["dtype"]).type(0) for n in "qkv"))

    # The mask is drawn before the operands so that the underflow rule can see it.
    mask_rng = np.random.default_rng(c["seed"] + 1)
    mask_holder["mask"] = make_mask(mask_rng, c, c["mask"], scores_shape(c, q_shape))
    shapes, vals = attention_operands(rng, c, c["specials"], v_ok)
    q, k, v = (realize_operand(rng, c, n, vals[n]) for n in "qkv")
    mask = mask_holder["mask"]
    rows = scores_shape(c, shapes["q"])[:-1]
    vl = make_valid_lens(rng, c, c["valid_lens"], rows, c["lk"], c["_limit"])
    kwargs = dict(valid_lens=vl, **flags)
    info = None
    try:
        if score == "additive":
            a, _ = additive_args(
                q,
                k,
                v,
                ws["w_q"],
                ws["w_k"],
                ws["w_v"],
                mask,
                vl,
                flags["is_causal"],
                flags["causal_alignment"],
                flags["window"],
            )
        else:
            a = attention_spec(
                q,
                k,
                v,
                mask,
                score=score,
                valid_lens=vl,
                is_causal=flags["is_causal"],
                causal_alignment=flags["causal_alignment"],
                window=flags["window"],
                **attention_params(extra),
            ).args
        info = (a.out_shape, a.result_dtype)
    except (TypeError, ValueError):
        pass
    out = make_out(rng, c["out"], info, {})
    if isinstance(out, str):
        if isinstance(v, np.ndarray) and info is not None:
            v, out = share_memory(c["out"], np.ascontiguousarray(v), *info)
        else:
            out = None
    kwargs["out"] = out
    if score == "additive":
        return [q, k, v, ws["w_q"], ws["w_k"], ws["w_v"], mask], kwargs
    kwargs.update(extra or {})
    kwargs["score"] = score
    return [q, k, v, mask], kwargs


ATTENTION_PARAMS = (
    "normalize",
    "scale",
    "weight",
    "temperature",
    "bandwidth",
    "w_q",
    "w_k",
    "w_v",
    "top_k",
)


def attention_params(extra) -> dict:
    base = {name: None for name in ATTENTION_PARAMS}
    base["normalize"] = "softmax"
    base.update(extra or {})
    return base


def family_tolerances(score_err, num_keys, v, eps, f16):
    """(output, weights) tolerances from a bound on every score's error: a score shift d
    moves a softmax weight relatively by d and the normaliser by at most d, so weights move
    by 4 d plus the exponentials' and the ``num_keys``-term sums' rounding; the output is a
    convex combination of value rows."""
    w_tol = 4.0 * score_err + eps * (32.0 + num_keys)
    v_max = finite_max(v)
    out_tol = w_tol * v_max
    if f16:
        f16_eps = float(np.finfo(np.float16).eps)
        out_tol += 2.0 * f16_eps * v_max
        w_tol += 2.0 * f16_eps
    return out_tol, w_tol


def additive_score_error(q, k, ws, mask, eps):
    """The projections carry (D + 2) eps (|x| @ |w|) each, tanh is 1-Lipschitz and good to
    a few ulp, the hidden sum adds ``hidden`` roundings; all weighted by |w_v|."""

    def proj(x, w):
        x = np.abs(finite_values(x))
        return float((x @ np.abs(finite_values(w))).max(initial=0.0)) if x.size else 0.0

    w_v = np.abs(finite_values(ws["w_v"]))
    err = (
        eps
        * float(w_v.sum())
        * (
            16
            + w_v.size
            + (q.shape[-1] + 2) * proj(q, ws["w_q"])
            + (k.shape[-1] + 2) * proj(k, ws["w_k"])
        )
    )
    if mask is not None and np.asarray(mask).dtype.kind == "f":
        err += eps * 4 * finite_max(mask)
    return err


@FUZZ
@given(additive_cases())
def test_fuzz_additive_attention(c):
    result = run_both(c, build_family, fastattn.additive_attention, reference.additive_attention)
    if result is None:
        return
    got, expected, args, kw = result
    q, k, v, w_q, w_k, w_v, mask = (np.asarray(a) if a is not None else None for a in args)
    eps, f16 = compute_eps(q, k, v, w_q, w_k, w_v)
    err = additive_score_error(q, k, {"w_q": w_q, "w_k": w_k, "w_v": w_v}, mask, eps)
    out_tol, w_tol = family_tolerances(err, k.shape[-2], v, eps, f16)
    if kw["return_weights"]:
        assert_close("output", got[0], expected[0], out_tol)
        assert_close("weights", got[1], expected[1], w_tol)
    else:
        assert_close("output", got, expected, out_tol)


SCORES = ("dot", "scaled_dot", "general", "cosine", "gaussian", "additive")


@st.composite
def attention_cases(draw):
    bad = draw(BAD_CASE)
    score = draw(st.sampled_from(SCORES))
    c = family_common(
        draw,
        draw(layouts(bad, qk_dims="free" if score in ("general", "additive") else "same")),
        bad,
    )
    normalize = pick(draw, bad, ("softmax", "softmax", "hardmax", "topk", "topk"), ("max",))
    extra = {"normalize": normalize}
    if normalize == "topk":
        extra["top_k"] = pick(draw, bad, (1, 2, 3, 5, 12), (0, None, 2.0))
    elif bad and draw(st.integers(0, 5)) == 0:
        extra["top_k"] = 2  # refused with normalize != "topk"
    if score == "scaled_dot":
        extra["scale"] = pick(draw, bad, (None, None, 0.3, -1.0), (np.nan,))
    elif score == "cosine":
        extra["temperature"] = pick(draw, bad, (None, 0.1, 1.0, 3.0), (0.0, 1e-320))
    elif score == "gaussian":
        extra["bandwidth"] = pick(draw, bad, (None, 0.5, 1.0, 4.0), (-1.0, 1e-200))
    elif score == "general":
        extra["weight"] = "draw"
    if bad and draw(st.integers(0, 5)) == 0:  # a parameter of another score: refused
        extra["temperature" if score != "cosine" else "scale"] = 2.0
    c.update(score=score, extra=extra)
    return c


def resolve_extra(c):
    """attention()'s score parameters, with arrays drawn from the case's seed."""
    extra = dict(c["extra"])
    rng = np.random.default_rng(c["seed"] + 2)
    if extra.get("weight") == "draw":
        e_q = operand_shape(c, "q")[-1] if operand_shape(c, "q") else 1
        e_k = operand_shape(c, "k")[-1] if operand_shape(c, "k") else 1
        w = rng.standard_normal((e_q, e_k)) / math.sqrt(max(e_q, 1))
        extra["weight"] = realize(w, dtype_of(*c["w_dtype"]["w_q"]), c["w_layout"]["w_q"], rng)
    if c["score"] == "additive":
        ws = additive_weights_values(
            rng,
            c,
            operand_shape(c, "q")[-1] if operand_shape(c, "q") else 1,
            operand_shape(c, "k")[-1] if operand_shape(c, "k") else 1,
        )
        extra.update(ws)
    return extra


def family_score_bound(q, k, score, extra, mask):
    """A bound on |score| (finite parts), for the underflow rule."""
    try:
        return _family_score_bound(q, k, score, extra, mask)
    except (ZeroDivisionError, OverflowError, TypeError, ValueError):
        return math.inf


def _family_score_bound(q, k, score, extra, mask):
    with np.errstate(all="ignore"):
        if score in ("dot", "scaled_dot"):
            e = q.shape[-1] if q.ndim else 1
            s = extra.get("scale")
            factor = (
                1.0 if score == "dot" else (1 / math.sqrt(max(e, 1)) if s is None else float(s))
            )
            bound = score_bound(q, k, factor if math.isfinite(factor) else 1e300)
        elif score == "general":
            w = extra.get("weight")
            wn = float(np.linalg.norm(finite_values(w))) if isinstance(w, np.ndarray) else 1e300
            bound = row_norm_max(q) * wn * row_norm_max(k)
        elif score == "cosine":
            t = extra.get("temperature") or 1.0
            bound = 1.0 / t if t > 0 else 1e300
        elif score == "gaussian":
            h = extra.get("bandwidth") or 1.0
            bound = (row_norm_max(q) + row_norm_max(k)) ** 2 / (2 * h * h) if h > 0 else 1e300
        else:
            bound = additive_bound(extra, None)
    if mask is not None and np.asarray(mask).dtype.kind == "f":
        bound += finite_max(mask)
    return bound


def build_attention(c):
    return build_family(c, c["score"], resolve_extra(c))


def attention_score_error(c, q, k, kw, mask, eps):
    """A bound on every score's error in the compute dtype (see each branch)."""
    score = c["score"]
    e = q.shape[-1]
    if score in ("dot", "scaled_dot"):  # gamma_E for a length-E dot product
        s = kw.get("scale")
        factor = 1.0 if score == "dot" else (1 / math.sqrt(e) if s is None else abs(float(s)))
        err = eps * (e + 8) * factor * row_norm_max(q) * row_norm_max(k)
    elif score == "general":  # q W (length Eq), then . k (length Ek)
        wn = float(np.linalg.norm(finite_values(kw["weight"])))
        err = eps * (e + k.shape[-1] + 8) * row_norm_max(q) * wn * row_norm_max(k)
    elif score == "cosine":  # unit rows rounded to the compute dtype, a length-E dot
        err = eps * (e + 8) / (kw.get("temperature") or 1.0)
    elif score == "gaussian":  # q.k / h^2 and -|k|^2 / (2 h^2), the expansion's error
        h = kw.get("bandwidth") or 1.0
        err = eps * (e + 8) * (row_norm_max(q) ** 2 + row_norm_max(k) ** 2) / (h * h)
    else:
        return additive_score_error(q, k, kw, mask, eps)
    if mask is not None and np.asarray(mask).dtype.kind == "f":
        err += eps * 4 * finite_max(mask)
    return err


def captured_scores(fn):
    """Run ``fn`` while recording the float64 scores the reference normalises."""
    seen = []
    original = reference._normalize_rows

    def spy(scores, allowed, normalize, top_k):
        seen.append((scores, allowed))
        return original(scores, allowed, normalize, top_k)

    reference._normalize_rows = spy
    try:
        fn()
    finally:
        reference._normalize_rows = original
    return seen


def ambiguous_rows(scores, allowed, k, err):
    """Rows whose k-th and (k+1)-th best visible scores are within 2 err (a selection the
    kernel's rounding may decide either way)."""
    s = np.where(allowed, scores, -np.inf)
    s = np.where(np.isnan(s), -np.inf, s)
    n = s.shape[-1]
    if n <= k:
        return np.zeros(s.shape[:-1], dtype=bool)
    top = -np.sort(-s, axis=-1)
    kth, nxt = top[..., k - 1], top[..., k]
    with np.errstate(invalid="ignore"):
        close = (kth - nxt <= 2 * err + 1e-300) & (nxt > -np.inf)
    return close


@FUZZ
@given(attention_cases())
def test_fuzz_attention(c):
    seen = []

    def ref(*args, **kwargs):
        holder = {}
        seen.extend(
            captured_scores(lambda: holder.setdefault("r", reference.attention(*args, **kwargs)))
        )
        return holder["r"]

    result = run_both(c, build_attention, fastattn.attention, ref)
    if result is None:
        return
    got, expected, (q, k, v, mask), kw = result
    q, k, v = (np.asarray(a) for a in (q, k, v))
    extras = [kw[n] for n in ("weight", "w_q", "w_k", "w_v") if kw.get(n) is not None]
    eps, f16 = compute_eps(q, k, v, *extras)
    err = attention_score_error(c, q, k, kw, mask, eps)
    out_tol, w_tol = family_tolerances(err, k.shape[-2], v, eps, f16)
    skip = None
    normalize = kw["normalize"]
    if normalize in ("hardmax", "topk") and seen:
        scores, allowed = seen[-1]
        top_k = 1 if normalize == "hardmax" else int(kw["top_k"])
        skip = ambiguous_rows(scores, allowed, top_k, err)
        out_shape = np.shape(expected[0] if kw["return_weights"] is True else expected)
        skip = skip.reshape(out_shape[:-1]) if skip.size == int(np.prod(out_shape[:-1])) else None
        if skip is not None and skip.any():
            event("hardmax/top-k rows within the score error: not compared")
    if normalize == "hardmax":
        w_tol = 0.0 if not f16 else w_tol  # exactly 1 on the chosen key
    if kw["return_weights"] is True:
        assert_close("output", got[0], expected[0], out_tol, skip)
        assert_close("weights", got[1], expected[1], w_tol, skip)
    else:
        assert_close("output", got, expected, out_tol, skip)


# --------------------------------------------------------------------------------------
# nadaraya_watson


@st.composite
def regression_cases(draw):
    bad = draw(BAD_CASE)
    scalar = draw(maybe(True, False, False))
    nbatch = 0 if scalar else draw(st.integers(0, 2))
    return {
        "seed": draw(SEEDS),
        "isa": draw(st.sampled_from(ISAS)),
        "scalar": scalar,
        "batch": [draw(maybe(1, 2, 3, 0)) for _ in range(nbatch)],
        "ones": [[draw(maybe(False, False, True)) for _ in range(nbatch)] for _ in "qky"],
        "lq": draw(maybe(0, 1, 2, 5, 9, 40)),
        "lk": draw(maybe(0, 1, 2, 5, 9, 70, 600)),
        "d": draw(maybe(1, 2, 3, 5)),
        "scalar_y": draw(st.booleans()),
        "dy": draw(maybe(1, 2, 4)),
        "specs": {n: array_spec(draw, bad) for n in "qky"},
        "kernel": pick(
            draw, bad, ("gaussian", "boxcar", "triangular", "epanechnikov"), ("cosine",)
        ),
        "bandwidth": pick(
            draw,
            bad,
            ("scalar", "scalar", "array", "silverman"),
            (0.0, -1.0, np.nan, "foo", "tiny", "bool"),
        ),
        "specials": draw(maybe(None, None, "anywhere")),
        "_target": draw(maybe("q", "k", "y")),
        "corrupt": pick(draw, bad, (None,) * 4, ("d", "ly", "rank0")),
        "num_threads": pick(draw, bad, (None, 1, 2, 3), (0,)),
        "return_weights": draw(st.booleans()),
        "out": out_mode(draw, bad),
    }


def lowest_bandwidth(bw, keys) -> float:
    """The smallest bandwidth a call will use (0 if unknown or invalid)."""
    try:
        if isinstance(bw, str):
            x = np.asarray(keys, np.float64)
            return float(np.min(silverman_bandwidth(x[:, None] if x.ndim == 1 else x)))
        if isinstance(bw, (bool, np.bool_)):
            return 0.0
        h = float(np.min(bw))
        return h if math.isfinite(h) and h > 0 else 0.0
    except (TypeError, ValueError):
        return 0.0


def build_regression(c):
    rng = np.random.default_rng(c["seed"])
    batch = c["batch"]

    def lead(i):
        return [1 if one else n for n, one in zip(batch, c["ones"][i])]

    d = c["d"]
    if c["scalar"]:
        shapes = {"q": (c["lq"],), "k": (c["lk"],)}
    else:
        shapes = {"q": tuple(lead(0)) + (c["lq"], d), "k": tuple(lead(1)) + (c["lk"], d)}
    shapes["y"] = (
        (c["lk"],)
        if c["scalar_y"] and c["scalar"]
        else tuple(lead(2) if not c["scalar"] else []) + (c["lk"], c["dy"])
    )
    if c["corrupt"] == "d" and not c["scalar"]:
        shapes["k"] = shapes["k"][:-1] + (d + 1,)
    if c["corrupt"] == "ly":
        shapes["y"] = (shapes["y"][0] + 1,) + shapes["y"][1:]
    if c["corrupt"] == "rank0":
        shapes["q"] = ()
    vals = {n: draw_values(rng, shapes[n], c["specs"][n]["mag"]) for n in "qky"}
    bw = c["bandwidth"]
    if bw == "scalar":
        bw = float(rng.uniform(0.3, 3.0))
    elif bw == "array":
        bw = rng.uniform(
            0.3, 3.0, size=tuple(batch[len(batch) - int(rng.integers(0, len(batch) + 1)) :])
        )
    elif bw == "tiny":
        bw = 1e-300
    elif bw == "bool":
        bw = True
    if c["specials"] == "anywhere":
        target = c["_target"]
        if target == "y" and c["kernel"] == "gaussian":
            # only where no gaussian weight can underflow: (max distance / h)^2 / 2 <= 38
            dist = row_norm_max(vals["q"]) + row_norm_max(vals["k"]) if vals["q"].ndim else math.inf
            if not (lowest_bandwidth(bw, vals["k"]) * math.sqrt(2 * 38.0) >= dist):
                target = "q"
        if c["specs"][target]["layout"] in KEEPS_VALUES:
            place(rng, vals[target], int(rng.integers(1, 4)))
    x_query, x_keys, y_values = (
        realize(vals[n], dtype_of(*c["specs"][n]["dtype"]), c["specs"][n]["layout"], rng)
        for n in "qky"
    )
    kwargs = {
        "kernel": c["kernel"],
        "bandwidth": bw,
        "num_threads": c["num_threads"],
        "return_weights": c["return_weights"],
    }
    info = None
    try:
        ra = regression_args(x_query, x_keys, y_values, c["kernel"], bw)
        info = (ra.out_shape, ra.result_dtype)
    except (TypeError, ValueError):
        pass
    out = make_out(rng, c["out"], info, {})
    if isinstance(out, str):
        if isinstance(y_values, np.ndarray) and info is not None:
            y_values, out = share_memory(c["out"], np.ascontiguousarray(y_values), *info)
        else:
            out = None
    kwargs["out"] = out
    return [x_query, x_keys, y_values], kwargs


def regression_checks(xq, xk, y, kw):
    """(output tolerance, weights tolerance, rows to skip) for a nadaraya_watson call.

    Distances come from differences in the compute dtype: u = |x - x_j| / h is off by
    (D + 8) eps u. gaussian: the softmax of -u^2/2, scores off by (D + 8) eps max u^2.
    Compact kernels K(u) are Lipschitz (slope <= 1.5) inside the support; a row with a key
    within the distance error of the edge u = 1 is skipped (its support may differ), and
    the ratio K_j / sum K moves by at most 2 n max|dK| / sum K."""
    ra = regression_args(xq, xk, y, kw["kernel"], kw["bandwidth"])
    eps, f16 = compute_eps(ra.x_query, ra.x_keys, ra.y_values)
    q = np.broadcast_to(ra.x_query, ra.batch + ra.x_query.shape[-2:]).astype(np.float64)
    k = np.broadcast_to(ra.x_keys, ra.batch + ra.x_keys.shape[-2:]).astype(np.float64)
    h = ra.bandwidth[..., None, None]
    d = q.shape[-1]
    with np.errstate(all="ignore"):
        diff = q[..., :, None, :] - k[..., None, :, :]
        u = np.sqrt((diff * diff).sum(axis=-1)) / h
    n = k.shape[-2]
    u_err = (d + 8) * eps * np.where(np.isfinite(u), u, 0.0)
    f16_eps = float(np.finfo(np.float16).eps)
    y_max = finite_max(ra.y_values)
    if kw["kernel"] == "gaussian":
        err = float(((d + 8) * eps * np.where(np.isfinite(u), u * u, 0.0)).max(initial=0.0))
        out_tol, w_tol = family_tolerances(err, n, ra.y_values, eps, f16)
        return out_tol, w_tol, None
    skip = (np.abs(u - 1.0) <= 2 * u_err + 4 * eps).any(axis=-1)  # (batch..., Lq)
    k_err = 1.5 * u_err + 4 * eps
    inside = np.where(
        u <= 1.0,
        {"boxcar": 1.0, "triangular": 1.0 - u, "epanechnikov": 0.75 * (1 - u * u)}[kw["kernel"]],
        0.0,
    )
    total = np.where(np.isfinite(inside), inside, 0.0).sum(axis=-1)  # (batch..., Lq)
    with np.errstate(all="ignore"):
        w_tol = np.where(total > 0, 2 * n * k_err.max(axis=-1, initial=0.0) / total, 0.0) + eps * (
            32 + n
        )
    w_tol = np.where(np.isfinite(w_tol), w_tol, np.inf)
    if f16:
        w_tol = w_tol + 2 * f16_eps
    out_tol = w_tol * y_max + (2 * f16_eps * y_max if f16 else 0.0)
    return out_tol, w_tol, skip


@FUZZ
@given(regression_cases())
def test_fuzz_nadaraya_watson(c):
    result = run_both(c, build_regression, fastattn.nadaraya_watson, reference.nadaraya_watson)
    if result is None:
        return
    got, expected, (xq, xk, y), kw = result
    out_tol, w_tol, skip = regression_checks(xq, xk, y, kw)
    out = got[0] if kw["return_weights"] else got
    exp_out = expected[0] if kw["return_weights"] else expected
    lead = out.shape if np.asarray(y).ndim == 1 else out.shape[:-1]
    rows = None if skip is None else skip.reshape(lead)
    if rows is not None and rows.any():
        event("regression rows at a compact kernel's edge: not compared")
    row_tol = out_tol if np.ndim(out_tol) == 0 else np.reshape(out_tol, lead)
    if np.asarray(y).ndim == 1:  # scalar values: the output has no value axis
        assert_close(
            "output",
            out[..., None],
            exp_out[..., None],
            row_tol if np.ndim(row_tol) == 0 else row_tol[..., None],
            rows,
        )
    else:
        assert_close(
            "output", out, exp_out, row_tol if np.ndim(row_tol) == 0 else row_tol[..., None], rows
        )
    if kw["return_weights"]:
        wt = w_tol if np.ndim(w_tol) == 0 else np.reshape(w_tol, lead)[..., None]
        assert_close("weights", got[1], expected[1], wt, rows)


# --------------------------------------------------------------------------------------
# MultiHeadAttention


@st.composite
def mha_cases(draw):
    bad = draw(BAD_CASE)
    kv_heads = draw(st.integers(1, 3))
    cross = draw(st.booleans())
    return {
        "seed": draw(SEEDS),
        "isa": draw(st.sampled_from(ISAS)),
        "batch": draw(maybe(None, 1, 2, 3, 0)),
        "num_q": draw(maybe(0, 1, 2, 5, 9)),
        "num_k": draw(maybe(0, 1, 3, 11)),
        "cross": cross,
        "kv_heads": kv_heads,
        "heads": kv_heads * draw(st.integers(1, 3)),
        "head_dim": draw(maybe(1, 2, 4, 8)),
        "kdim": draw(maybe(None, 3, 7)) if cross else None,
        "vdim": draw(maybe(None, 2, 5)) if cross else None,
        "bias": draw(st.booleans()),
        "dtype": draw(maybe("float32", "float32", "float64")),
        "inputs": {n: array_spec(draw, bad) for n in "qkv"},
        "mask": pick(draw, bad, (None, None, "bool", "keys", "float"), ("int", "badshape")),
        "valid_lens": pick(draw, bad, (None, None, "batch", "query"), ("out", "float")),
        "is_causal": pick(draw, bad, (False, True), (1,)),
        "need_weights": draw(st.booleans()),
        "average": draw(st.booleans()),
        "num_threads": pick(draw, bad, (None, 1, 2), (0,)),
        "corrupt": pick(draw, bad, (None,) * 3, ("features", "batch", "rank")),
    }


def build_mha(c):
    rng = np.random.default_rng(c["seed"])
    e = c["heads"] * c["head_dim"]
    layer = fastattn.MultiHeadAttention(
        e,
        c["heads"],
        num_kv_heads=c["kv_heads"],
        kdim=c["kdim"],
        vdim=c["vdim"],
        bias=c["bias"],
        dtype=c["dtype"],
        seed=c["seed"] % 1000,
    )
    if c["bias"]:
        for proj in (layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj):
            proj.bias = rng.standard_normal(proj.bias.shape).astype(c["dtype"]) * 0.5
    lead = () if c["batch"] is None else (c["batch"],)
    num_k = c["num_k"] if c["cross"] else c["num_q"]
    shapes = {"q": lead + (c["num_q"], e)}
    if c["cross"]:
        shapes["k"] = lead + (num_k, layer.kdim)
        shapes["v"] = lead + (num_k, layer.vdim)
    if c["corrupt"] == "features":
        shapes["q"] = lead + (c["num_q"], e + 1)
    elif c["corrupt"] == "batch" and c["cross"] and lead:
        shapes["k"] = (lead[0] + 1,) + shapes["k"][1:]
    elif c["corrupt"] == "rank":
        shapes["q"] = (1, 1) + shapes["q"]
    arrays = [
        realize(
            rng.standard_normal(shapes[n]) * min(c["inputs"][n]["mag"], 1.0),
            dtype_of(*c["inputs"][n]["dtype"]),
            c["inputs"][n]["layout"],
            rng,
        )
        for n in shapes
    ]
    scores = lead + (c["heads"], c["num_q"], num_k)
    mask = None
    if c["mask"] == "bool":
        mask = rng.random(scores) < 0.7
    elif c["mask"] == "keys":
        mask = rng.random(lead + (1, 1, num_k)) < 0.7
    elif c["mask"] == "float":
        mask = rng.standard_normal(scores[-2:]).astype(c["dtype"])
    elif c["mask"] == "int":
        mask = np.ones(scores, np.int64)
    elif c["mask"] == "badshape":
        mask = np.ones(scores + (2,), bool)
    vl = None
    if c["valid_lens"] == "batch":
        vl = rng.integers(0, num_k + 1, size=lead)
    elif c["valid_lens"] == "query":
        vl = rng.integers(0, num_k + 1, size=lead + (c["num_q"],))
    elif c["valid_lens"] == "out":
        vl = np.full(lead, num_k + 1)
    elif c["valid_lens"] == "float":
        vl = np.ones(lead)
    kwargs = {
        "attn_mask": mask,
        "valid_lens": vl,
        "is_causal": c["is_causal"],
        "need_weights": c["need_weights"],
        "average_attn_weights": c["average"],
    }
    return layer, arrays, kwargs


@FUZZ
@given(mha_cases())
def test_fuzz_multi_head_attention(c):
    from layer.test_mha import layer_weights, mha_tolerances

    def fast(layer, *arrays, **kwargs):
        return layer(*arrays, num_threads=c["num_threads"], **kwargs)

    def ref(layer, *arrays, **kwargs):
        result = reference.multi_head_attention(*arrays, **layer_weights(layer), **kwargs)
        fastattn._threads.resolve(c["num_threads"])  # the layer validates it too
        return result

    def build(case):
        layer, arrays, kwargs = build_mha(case)
        return [layer, *arrays], kwargs

    ref_error = fast_error = None
    (layer, *arrays), kwargs = build(c)
    # The layer converts float inputs to its dtype (the reference would promote instead).
    ref_arrays = [
        np.asarray(a).astype(layer.dtype) if np.asarray(a).dtype.kind == "f" else a for a in arrays
    ]
    try:
        expected = ref(layer, *ref_arrays, **kwargs)
    except (TypeError, ValueError) as exc:
        ref_error = exc
    with active_isa(c["isa"]):
        try:
            got = fast(layer, *arrays, **kwargs)
        except (TypeError, ValueError) as exc:
            fast_error = exc
    if ref_error is not None or fast_error is not None:
        # Both refuse the call (the layer checks its arguments in its own order).
        assert ref_error is not None and fast_error is not None, (ref_error, fast_error)
        assert str(fast_error) and "fastattn._core" not in str(fast_error)
        event(f"raised {type(fast_error).__name__}")
        return
    event("compared with the reference")
    out_tol, w_tol = mha_tolerances(layer, *arrays, attn_mask=kwargs["attn_mask"])
    if kwargs["need_weights"]:
        assert_close("output", got[0], expected[0], out_tol)
        assert_close("weights", got[1], expected[1], w_tol)
    else:
        assert_close("output", got, expected, out_tol)
