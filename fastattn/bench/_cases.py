"""The benchmark grid: realistic shapes, their inputs, the candidates that compute them, and
the float64 reference each candidate's answer is checked against."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

import fastattn
from fastattn.bench import _anchors
from fastattn.bench._formulas import (
    attention_flops,
    numpy_additive,
    numpy_masked_softmax,
    numpy_merge_states,
    numpy_sdpa,
    numpy_sdpa_grads,
)
from fastattn.bench._varlen import (
    lognormal_lengths,
    one_long_many_short,
    packed_inputs,
    padded,
    padded_bytes,
    per_sequence_loop,
)

# fastattn-loop / fastattn-padded: varlen cases only, the two ways to compute a packed
# batch without varlen_attention (fastattn.bench._varlen).
# fastattn-forward / fastattn-backward: backward rows only, the two halves of fastattn's
# training step timed on their own (for the backward / forward ratio and the backward's rate).
IMPLS = (
    "fastattn",
    "numpy",
    "torch",
    "jax",
    *_anchors.ANCHORS,
    "fastattn-loop",
    "fastattn-padded",
    "fastattn-forward",
    "fastattn-backward",
)
# The multiple of the forward's flops that a backward performs: dV = P^T dO, dP = dO V^T,
# dQ = dS K, dK = dS^T Q and the recomputed S = Q K^T (5 products to the forward's 2).
BACKWARD_FLOPS = 2.5
DTYPES = ("float32", "float64")
# Low precision rows: float16/bfloat16 q, k, v, or "int8-kv" (float32 q, int8 k/v from
# fastattn.quantize_kv). Only the cases that list them run them.
LOW_DTYPES = ("float16", "bfloat16", "int8-kv")
ALL_DTYPES = DTYPES + LOW_DTYPES
PRESETS = ("smoke", "quick", "default", "full")
_REFERENCE_ELEMENTS = 1 << 22  # score entries the float64 reference computes per check


@dataclass(frozen=True)
class Case:
    """One shape. ``kind`` is ``"sdpa"`` (dims ``B, Hq, Hkv, Lq, Lk, E``), ``"additive"``
    (``B, Lq, Lk, D, hidden``), ``"masked_softmax"`` (``B, Lq, Lk``, one valid length per
    batch entry), ``"merge_states"`` (``parts, B, H, Lq, Ev``: merging partial attention),
    ``"mha_decode"`` (``B, E, H, cache``: one KV-cache decode step of the multi-head layer,
    projections included), ``"varlen"`` (``Hq, Hkv, E`` and then every sequence's length:
    packed self-attention) or ``"masked_sdpa"`` (``B, H, L, E``: self-attention under the
    mask ``mask`` names, see ``attention_mask``) or ``"sdpa_backward"`` (dims as ``"sdpa"``:
    the forward with ``return_lse=True`` and the backward, a training step's attention).
    Cases of one ``series`` differ only in sequence length."""

    name: str
    kind: str
    dims: tuple[int, ...]
    causal: bool = False
    tags: tuple[str, ...] = ()
    series: str | None = None
    dtypes: tuple[str, ...] = DTYPES
    mask: str | None = None  # masked_sdpa: one of MASKS

    @property
    def seq_len(self) -> int:
        """The key sequence length: the x axis of the time-vs-length plot."""
        if self.kind == "merge_states":
            return self.dims[3]  # (no keys: the query rows)
        if self.kind == "mha_decode":
            return self.dims[3]
        if self.kind == "varlen":
            return max(self.dims[3:])  # the longest sequence
        if self.kind == "masked_sdpa":
            return self.dims[2]
        return self.dims[4] if self.kind in ("sdpa", "sdpa_backward") else self.dims[2]

    def matches(self, words: list[str]) -> bool:
        text = " ".join((self.name, self.kind, *self.tags)).lower()
        return not words or any(w.lower() in text for w in words)

    def flops(self) -> float:
        """Nominal floating-point operations of one call.

        SDPA: 4 B Hq Lq Lk E (QK^T and PV), times the kept fraction under a causal mask;
        under an attention mask, times the fraction of 64 x 64 tiles that keep any entry
        (the work a kernel that skips empty tiles cannot avoid).
        additive: B Lq Lk (3 hidden + 2 Dv) (add, tanh, multiply-add; PV). masked softmax:
        5 per element (max, subtract, exp, sum, divide). merge: one multiply-add per part entry.
        """
        if self.kind == "sdpa":
            b, hq, hkv, lq, lk, e = self.dims
            return attention_flops((b, hq, lq, e), (b, hkv, lk, e), (b, hkv, lk, e), self.causal)
        if self.kind == "sdpa_backward":  # forward + backward
            return (1.0 + BACKWARD_FLOPS) * self.forward_flops()
        if self.kind == "additive":
            b, lq, lk, d, hidden = self.dims
            return b * lq * lk * (3.0 * hidden + 2.0 * d)
        if self.kind == "merge_states":
            return 2.0 * float(np.prod(self.dims))
        if self.kind == "mha_decode":
            b, e, h, cache = self.dims
            return 4 * 2.0 * b * e * e + 4.0 * b * cache * e  # projections of one token, QK and PV
        if self.kind == "varlen":
            hq, hkv, e = self.dims[:3]
            return sum(
                attention_flops((hq, n, e), (hkv, n, e), (hkv, n, e), self.causal)
                for n in self.dims[3:]
                if n > 0
            )
        if self.kind == "masked_sdpa":
            b, h, n, e = self.dims
            return 4.0 * b * h * n * n * e * occupied_tiles(attention_mask(self)[0], n)
        return 5.0 * float(np.prod(self.dims))

    def forward_flops(self) -> float:
        """A backward row's forward alone (4 B Hq Lq Lk E, times the causal fraction)."""
        b, hq, hkv, lq, lk, e = self.dims
        return attention_flops((b, hq, lq, e), (b, hkv, lk, e), (b, hkv, lk, e), self.causal)

    def candidate_flops(self, name: str) -> float:
        """The flops of one candidate's call: a backward row's parts do less than the row."""
        if self.kind == "sdpa_backward" and name == "fastattn-forward":
            return self.forward_flops()
        if self.kind == "sdpa_backward" and name == "fastattn-backward":
            return BACKWARD_FLOPS * self.forward_flops()
        return self.flops()

    @property
    def bound(self) -> str | None:
        """What limits this case on a CPU: ``"compute"`` (attention with query rows to reuse
        each key on), ``"memory"`` (decode: every K/V byte used once per query; masked
        softmax: a few flops per element), None where the flop count is nominal (additive)."""
        if self.kind == "sdpa":
            return "memory" if self.dims[3] == 1 else "compute"
        if self.kind in ("varlen", "masked_sdpa", "sdpa_backward"):
            return "compute"
        return "memory" if self.kind in ("masked_softmax", "merge_states", "mha_decode") else None

    def bytes(self, dtype: str) -> float:
        """Bytes one call must move at least: every input read and the output written once
        (SDPA: Q, K, V and the output; masked softmax: the scores and the probabilities;
        merge: every part and its lse, and the merged output and lse)."""
        size = {"bfloat16": 2, "int8-kv": 4}.get(dtype) or np.dtype(dtype).itemsize
        if self.kind == "sdpa":
            b, hq, hkv, lq, lk, e = self.dims
            kv_size = 1 if dtype == "int8-kv" else size  # (the scales: 4 / E more)
            return float(b * (2 * size * hq * lq * e + 2 * kv_size * hkv * lk * e))
        if self.kind == "sdpa_backward":  # q, k, v, out, grad_out read; their grads written
            b, hq, hkv, lq, lk, e = self.dims
            return float(size * b * (6 * hq * lq * e + 4 * hkv * lk * e))
        if self.kind == "masked_softmax":
            return float(size * 2 * np.prod(self.dims))
        if self.kind == "merge_states":
            parts, b, h, lq, ev = self.dims
            return float(size * (parts + 1) * b * h * lq * (ev + 1))
        if self.kind == "mha_decode":
            b, e, h, cache = self.dims
            return float(size * (4 * e * e + 2 * b * cache * e))  # the weights and the cache
        if self.kind == "varlen":
            hq, hkv, e = self.dims[:3]
            return float(size * sum(self.dims[3:]) * (2 * hq + 2 * hkv) * e)
        if self.kind == "masked_sdpa":
            b, h, n, e = self.dims
            mask_bytes = 0 if self.mask == "valid-lens" else attention_mask(self)[0].nbytes
            return float(size * 4 * b * h * n * e + mask_bytes)
        b, lq, lk, d, hidden = self.dims
        return float(size * b * (lq + 2 * lk) * d)


def sdpa_case(
    label: str,
    b: int,
    hq: int,
    hkv: int,
    lq: int,
    lk: int,
    e: int,
    *,
    causal: bool = False,
    tags: tuple[str, ...] = (),
    series: str | None = None,
    dtypes: tuple[str, ...] = DTYPES,
) -> Case:
    heads = f"{hq}/{hkv}" if hq != hkv else f"{hq}"
    name = f"{label} {b}x{heads} {lq}x{lk} E{e}"
    tags = tags + (("causal",) if causal else ()) + (("long-context",) if lk >= 4096 else ())
    return Case(name, "sdpa", (b, hq, hkv, lq, lk, e), causal, tags, series, dtypes)


def backward_case(label: str, *dims: int, causal: bool = False, tags=(), series=None) -> Case:
    """A backward row (float32): ``sdpa_case``'s shape, named and tagged "backward"."""
    label = f"backward {label}" + (" causal" if causal else "")
    case = sdpa_case(label, *dims, causal=causal, tags=("backward", *tags))
    return dataclasses.replace(case, kind="sdpa_backward", series=series, dtypes=("float32",))


def _backward_cases(preset: str) -> list[Case]:
    """The backward rows (issue #31's targets): forward + backward against PyTorch's, on the
    grid's shapes (encoder, long self-attention, E 128, GQA prefill, short sequences),
    each non-causal and causal."""
    if preset == "smoke":
        return [
            backward_case("self-attention", 1, 2, 2, 32, 32, 16),
            backward_case("GQA", 1, 4, 2, 40, 40, 16, causal=True, tags=("gqa",)),
        ]
    quick = preset == "quick"
    lengths = (1024,) if quick else (1024, 2048)
    cases = []
    for causal in (False, True):
        cases += [
            backward_case("encoder", 1 if quick else 4, 12, 12, 512, 512, 64, causal=causal),
            *[
                backward_case(
                    "self-attention",
                    1,
                    8,
                    8,
                    n,
                    n,
                    64,
                    causal=causal,
                    series="backward causal" if causal else "backward self-attention",
                )
                for n in lengths
            ],
            backward_case("head dim 128", 1, 8, 8, 1024, 1024, 128, causal=causal),
            backward_case(
                "GQA prefill",
                1,
                32,
                8,
                *((512, 512) if quick else (1024, 1024)),
                128,
                causal=causal,
                tags=("gqa",),
            ),
            backward_case(
                "short sequences", 16 if quick else 32, 8, 8, 128, 128, 64, causal=causal
            ),
        ]
    return cases


def varlen_case(label: str, lens, hq: int = 8, hkv: int = 2, e: int = 64, tags=()) -> Case:
    """Causal self-attention over packed sequences of ``lens`` (float32)."""
    name = f"{label} {len(lens)} seqs ({sum(lens)} tokens, longest {max(lens)}) {hq}/{hkv} E{e}"
    return Case(name, "varlen", (hq, hkv, e, *lens), True, ("varlen", *tags), None, ("float32",))


# The masks of the masked_sdpa rows (issue #20's cases): a bool key-padding mask
# (B, 1, 1, L) and the same lengths as valid_lens (its twin: what skipping should match);
# a block-sparse mask keeping 10 % of 64 x 64 tiles, as a bool mask and as a reused
# fastattn.block_mask; a dense random mask keeping half of the entries (nothing to skip).
MASKS = ("key-padding", "valid-lens", "block-sparse", "block-mask", "dense")


@functools.lru_cache(maxsize=8)
def attention_mask(case: Case) -> tuple[np.ndarray, np.ndarray | None]:
    """A masked_sdpa case's bool mask (True = may attend; valid-lens: its key-padding mask,
    which only the other candidates get) and its key lengths (key-padding and valid-lens:
    about 70 % padding; else None), from a fixed seed."""
    b, h, n, _ = case.dims
    rng = np.random.default_rng(20)
    if case.mask in ("key-padding", "valid-lens"):
        lens = np.maximum(1, (rng.random(b) * 0.6 * n).astype(np.int64))
        pad = np.arange(n)[None, :] < lens[:, None]
        return pad[:, None, None, :], lens
    if case.mask in ("block-sparse", "block-mask"):
        tiles = -(-n // 64)
        kept = rng.random((tiles, tiles)) < 0.1
        kept[np.diag_indices(tiles)] = True  # every query keeps its own tile: no empty row
        return np.kron(kept, np.ones((64, 64), bool))[:n, :n], None
    if case.mask == "dense":
        return rng.random((b, h, n, n)) < 0.5, None
    raise ValueError(f"unknown mask {case.mask!r}")


def occupied_tiles(mask: np.ndarray, n: int) -> float:
    """The fraction of 64 x 64 (query, key) tiles of an n x n attention a bool mask
    (broadcasting over its last two axes) leaves any entry in."""
    m = np.broadcast_to(mask, mask.shape[:-2] + (n, n))
    pad = -n % 64
    m = np.pad(m, [(0, 0)] * (m.ndim - 2) + [(0, pad), (0, pad)])
    tiles = m.reshape(m.shape[:-2] + (m.shape[-2] // 64, 64, m.shape[-1] // 64, 64))
    return float(tiles.any(axis=(-3, -1)).mean())


def masked_case(label: str, mask: str, b: int, h: int, n: int, e: int) -> Case:
    return Case(
        f"{label} {b}x{h} {n}x{n} E{e}",
        "masked_sdpa",
        (b, h, n, e),
        tags=("masks",),
        dtypes=("float32",),
        mask=mask,
    )


def _mask_cases(quick: bool) -> list[Case]:
    pad_b = 16 if quick else 64
    sparse_n = 1024 if quick else 4096
    return [
        masked_case("key padding bool mask", "key-padding", pad_b, 12, 77, 32),
        masked_case("key padding valid_lens", "valid-lens", pad_b, 12, 77, 32),
        masked_case("key padding bool mask", "key-padding", pad_b // 4, 12, 512, 64),
        masked_case("key padding valid_lens", "valid-lens", pad_b // 4, 12, 512, 64),
        masked_case("block-sparse 10 % tiles bool mask", "block-sparse", 1, 4, sparse_n, 64),
        masked_case("block-sparse 10 % tiles BlockMask", "block-mask", 1, 4, sparse_n, 64),
        masked_case("dense 50 % mask", "dense", 1, 8, 512 if quick else 1024, 64),
    ]


def _sweep(label: str, lengths, causal: bool, dtypes=DTYPES) -> list[Case]:
    return [
        sdpa_case(
            label,
            1,
            8,
            8,
            n,
            n,
            64,
            causal=causal,
            series=label,
            dtypes=dtypes,
            tags=("self-attention",),
        )
        for n in lengths
    ]


def grid(preset: str) -> list[Case]:
    """The cases of a preset: ``smoke`` (tiny, for tests), ``quick``, ``default``, ``full``."""
    if preset == "smoke":
        return [
            *_sweep("self-attention", (16, 32), False),
            *_sweep("causal", (16, 32), True, ("float32",)),
            sdpa_case(
                "GQA decode", 1, 4, 2, 1, 64, 16, tags=("gqa", "decode"), dtypes=("float32",)
            ),
            Case(
                "additive 2x 8x16 D8 H16",
                "additive",
                (2, 8, 16, 8, 16),
                tags=("bahdanau",),
                dtypes=("float32",),
            ),
            Case(
                "masked_softmax 4x8x16 valid_lens",
                "masked_softmax",
                (4, 8, 16),
                tags=("masked-softmax",),
                dtypes=("float32",),
            ),
            masked_case("key padding bool mask", "key-padding", 2, 2, 70, 16),
            masked_case("block-sparse 10 % tiles BlockMask", "block-mask", 1, 2, 130, 16),
            *_backward_cases(preset),
        ]
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {PRESETS}, got {preset!r}")
    quick, full = preset == "quick", preset == "full"
    f32 = ("float32",)
    lengths = (256, 512, 1024) if quick else (256, 512, 1024, 2048, 4096) + ((8192,) * full)
    # The default grid holds every shape of the speed targets, non-causal and causal.
    cases = [
        sdpa_case("encoder", 1 if quick else 4, 12, 12, 512, 512, 64, tags=("BERT-base",)),
        sdpa_case(
            "encoder causal",
            1 if quick else 4,
            12,
            12,
            512,
            512,
            64,
            causal=True,
            tags=("BERT-base",),
            dtypes=f32,
        ),
        *_sweep("self-attention", lengths, False, f32 if quick else DTYPES),
        *_sweep("causal", lengths, True, f32 if quick else DTYPES),
        sdpa_case(
            "cross-attention",
            2,
            8,
            8,
            256,
            2048 if quick else 4096,
            64,
            tags=("cross",),
            dtypes=f32 if quick else DTYPES,
        ),
        sdpa_case(
            "GQA prefill",
            1,
            32,
            8,
            *((512, 512) if quick else (1024, 1024)),
            128,
            tags=("gqa", "prefill"),
            dtypes=f32,
        ),
        sdpa_case(
            "GQA prefill causal",
            1,
            32,
            8,
            *((512, 512) if quick else (1024, 1024)),
            128,
            causal=True,
            tags=("gqa", "prefill"),
            dtypes=f32 if quick else DTYPES,
        ),
        sdpa_case(
            "GQA decode",
            1,
            32,
            8,
            1,
            4096 if quick else 16384,
            128,
            tags=("gqa", "decode"),
            dtypes=DTYPES if quick else DTYPES + LOW_DTYPES,  # (the int8-KV target's shape)
        ),
        sdpa_case(
            "short sequences",
            16 if quick else 32,
            8,
            8,
            128,
            128,
            64,
            tags=("short", "batch"),
            dtypes=f32 if quick else DTYPES,
        ),
        sdpa_case(
            "short sequences causal",
            16 if quick else 32,
            8,
            8,
            128,
            128,
            64,
            causal=True,
            tags=("short", "batch"),
            dtypes=f32,
        ),
        # Small calls (issue #21): the per-call cost of a decode step and of one tiny head.
        *[
            sdpa_case(
                "small call decode",
                1,
                8,
                8,
                1,
                lk,
                64,
                tags=("decode", "small-call"),
                series="small call decode",
                dtypes=f32,
            )
            for lk in (16, 128, 512, 2048)
        ],
        sdpa_case("small call", 1, 1, 1, 1, 16, 64, tags=("small-call",), dtypes=f32),
        Case(
            "MultiHeadAttention decode step B1 E512 H8 cache2048",
            "mha_decode",
            (1, 512, 8, 2048),
            tags=("decode", "small-call", "layer"),
            dtypes=f32,
        ),
        Case(
            "additive 2x 256x512 D64 H128",
            "additive",
            (2, 256, 512, 64, 128),
            tags=("bahdanau",),
            dtypes=f32 if quick else DTYPES,
        ),
        Case(
            f"masked_softmax {32 if quick else 64}x512x512 valid_lens",
            "masked_softmax",
            (32 if quick else 64, 512, 512),
            tags=("masked-softmax", "d2l"),
            dtypes=f32 if quick else DTYPES,
        ),
        Case(
            f"merge_attention_states 8 parts of {1 if quick else 4}x32x512x128",
            "merge_states",
            (8, 1 if quick else 4, 32, 512, 128),
            tags=("merge", "chunked"),
            dtypes=f32 if quick else DTYPES,
        ),
        varlen_case(
            "varlen lognormal",
            lognormal_lengths(16 if quick else 32, 200, 1.0, 2048),
            tags=("skewed",),
        ),
        varlen_case(
            "varlen 1 long + many short",
            one_long_many_short(4096 if quick else 8192, 16, 500 if quick else 1000),
            tags=("skewed",),
        ),
        *_mask_cases(quick),
        *_backward_cases(preset),
    ]
    if full:
        cases += [
            sdpa_case("encoder", 4, 16, 16, 512, 512, 64, tags=("BERT-large",)),
            sdpa_case("head dim 128", 1, 16, 16, 1024, 1024, 128, tags=("E128",)),
            sdpa_case("GQA decode", 1, 32, 8, 1, 32768, 128, tags=("gqa", "decode")),
            sdpa_case("MHA decode", 1, 8, 8, 1, 2048, 64, tags=("decode",)),
        ]
    if not quick:  # the low-precision targets' shapes
        cases += [
            sdpa_case(
                "low precision",
                1,
                8,
                8,
                1024,
                1024,
                64,
                tags=("lowp",),
                dtypes=("float32", "float16", "bfloat16"),
            ),
        ]
    return cases


_PADDED_LIMIT = 2 << 30  # bytes of padded buffers beyond which fastattn-padded is left out


def _build_varlen(work: Workload, dt) -> None:
    hq, hkv, e = work.case.dims[:3]
    lens = work.case.dims[3:]
    causal = work.case.causal
    q, k, v, cu = packed_inputs(lens, hq, hkv, e, dt)
    work.candidates["fastattn"] = lambda: fastattn.varlen_attention(
        q, k, v, cu, cu, is_causal=causal
    )
    work.candidates["fastattn-loop"] = lambda: per_sequence_loop(q, k, v, cu, causal)
    if padded_bytes(lens, hq, hkv, e, dt.itemsize) <= _PADDED_LIMIT:
        work.candidates["fastattn-padded"] = lambda: padded(q, k, v, cu, causal)

    def numpy_loop():  # the NumPy formula, one sequence at a time
        out = np.empty(q.shape[:2] + v.shape[2:], q.dtype)
        for a, b in zip(cu[:-1], cu[1:]):
            if a == b:
                continue
            heads = [x[a:b].transpose(1, 0, 2) for x in (q, k, v)]
            out[a:b] = numpy_sdpa(*heads, causal).transpose(1, 0, 2)
        return out

    work.candidates["numpy"] = numpy_loop

    def reference():
        # The last sequences, as many as the reference's budget holds.
        first = len(lens)
        while first > 0 and hq * sum(n * n for n in lens[first - 1 :]) <= _REFERENCE_ELEMENTS:
            first -= 1
        first = min(first, len(lens) - 1)
        a = int(cu[first])
        expected = fastattn.reference.varlen_attention(
            *(x[a:].astype(np.float64) for x in (q, k, v)),
            cu[first:] - a,
            cu[first:] - a,
            is_causal=causal,
        )
        return expected, lambda out: out[a:]

    work.reference = reference


class Libraries:
    """The optional comparison libraries, imported once when first asked for."""

    def __init__(self, threads: int, wanted=IMPLS):
        self.threads, self.wanted, self.notes = threads, tuple(wanted), []
        self.versions = {"fastattn": fastattn.__version__, "numpy": np.__version__}
        self._engines: dict[str, object] = {}

    def engine(self, name: str):
        """ONNX Runtime (``"ort"``) or OpenVINO's module when wanted and installed, else None."""
        if name not in self.wanted:
            return None
        if name not in self._engines:
            try:
                module, version = _anchors.load(name)
            except ImportError as exc:
                module = None
                why = (
                    str(exc)
                    if "pip install" in str(exc)
                    else f"{_anchors.NAMES[name]} is not installed (pip install "
                    f"{_anchors.PACKAGES[name]})"
                )
                self.notes.append(f"{why}: no {name} column.")
            else:
                self.versions[name] = version
                self.notes.append(
                    (
                        "ONNX Runtime ran with intra_op_num_threads = the threads used and "
                        "inter_op_num_threads = 1"
                        if name == "ort"
                        else "OpenVINO's CPU plugin ran with INFERENCE_NUM_THREADS = the threads "
                        "used and INFERENCE_PRECISION_HINT = f32"
                    )
                    + "; it is timed on float32 rows only (it computes float64 inputs at "
                    "float32 accuracy)."
                )
            self._engines[name] = module
        return self._engines[name]

    @functools.cached_property
    def torch(self):
        if "torch" not in self.wanted:
            return None
        try:
            import torch
        except ImportError:
            self.notes.append("PyTorch is not installed (pip install torch): no torch column.")
            return None
        torch.set_num_threads(self.threads)
        self.versions["torch"] = torch.__version__
        return torch

    @functools.cached_property
    def jax(self):
        if "jax" not in self.wanted:
            return None
        try:
            import jax
        except ImportError:
            self.notes.append("JAX is not installed (pip install jax): no jax column.")
            return None
        jax.config.update("jax_enable_x64", True)  # float64 rows; float32 arrays stay float32
        self.versions["jax"] = jax.__version__
        self.notes.append(
            "JAX (XLA) chooses its own CPU thread count; --threads does not reach it."
        )
        return jax

    def available(self) -> list[str]:
        have = {
            "fastattn": True,
            "numpy": True,
            "torch": self.torch is not None,
            "jax": self.jax is not None,
            "fastattn-loop": True,
            "fastattn-padded": True,
            "fastattn-forward": True,
            "fastattn-backward": True,
            **{name: self.engine(name) is not None for name in _anchors.ANCHORS},
        }
        return [name for name in IMPLS if name in self.wanted and have[name]]


@dataclass
class Workload:
    """A case's inputs in one dtype, the candidates that compute it, and its check."""

    case: Case
    dtype: str
    candidates: dict[str, Callable[[], object]] = field(default_factory=dict)
    to_numpy: dict[str, Callable[[object], np.ndarray]] = field(default_factory=dict)
    ops: dict[str, dict] = field(default_factory=dict)  # an engine's chosen op, its variants
    reference: Callable[[], tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]]] | None = None
    unchecked: set[str] = field(default_factory=set)  # candidates whose answer is a part

    def first_calls(self) -> tuple[dict[str, float], dict[str, float]]:
        """Call every candidate once: the max absolute difference of its answer from the
        float64 reference (on a subset of rows for large shapes), and the seconds the call
        took (a first call: it pays for thread pools, page faults, JIT)."""
        expected, take = self.reference()
        errors, seconds = {}, {}
        for name, fn in self.candidates.items():
            start = time.perf_counter()
            result = fn()
            seconds[name] = time.perf_counter() - start
            if name in self.unchecked:
                errors[name] = None
                continue
            got = self.to_numpy.get(name, np.asarray)(result)
            diff = np.abs(take(got).astype(np.float64) - expected)
            errors[name] = float(diff.max()) if diff.size else 0.0
        return errors, seconds


def _rng_arrays(rng, dtype, *shapes):
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def build(
    case: Case,
    dtype: str,
    libs: Libraries,
    impls,
    seed: int = 0,
    probe: Callable[[Callable[[], object]], float] | None = None,
) -> Workload:
    """Inputs and candidates of ``case`` in ``dtype``, for the implementations in ``impls``
    that can compute it (torch, JAX, ONNX Runtime and OpenVINO only have scaled dot-product
    attention). ``probe`` (seconds per call of a function) picks each engine's fastest op;
    without it an engine runs its first one."""
    rng = np.random.default_rng(seed)
    dt = _array_dtype(dtype)
    work = Workload(case, dtype)
    if case.kind == "sdpa":
        _build_sdpa(work, rng, dt, libs, impls, probe)
    elif case.kind == "additive":
        _build_additive(work, rng, dt)
    elif case.kind == "masked_softmax":
        _build_masked_softmax(work, rng, dt)
    elif case.kind == "merge_states":
        _build_merge_states(work, rng, dt)
    elif case.kind == "mha_decode":
        _build_mha_decode(work, rng, dt, libs, impls)
    elif case.kind == "varlen":
        _build_varlen(work, dt)
    elif case.kind == "masked_sdpa":
        _build_masked_sdpa(work, rng, dt, libs, impls)
    elif case.kind == "sdpa_backward":
        _build_sdpa_backward(work, rng, dt, libs, impls)
    else:
        raise ValueError(f"unknown case kind {case.kind!r}")
    work.candidates = {n: fn for n, fn in work.candidates.items() if n in impls}
    return work


def compute_dtype(dtype: str) -> str:
    """The dtype a row computes in (its FMA peak): float32 for the low-precision rows."""
    return dtype if dtype in DTYPES else "float32"


def _array_dtype(dtype: str) -> np.dtype:
    """The NumPy dtype of a row's query (bfloat16 from ml_dtypes; int8-kv: float32)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(np.float32 if dtype == "int8-kv" else dtype)


def _build_sdpa(work: Workload, rng, dt, libs: Libraries, impls, probe) -> None:
    b, hq, hkv, lq, lk, e = work.case.dims
    causal = work.case.causal
    q, k, v = _rng_arrays(rng, dt, (b, hq, lq, e), (b, hkv, lk, e), (b, hkv, lk, e))
    group = hq // hkv
    scales = {}
    if work.dtype == "int8-kv":
        (k, ks), (v, vs) = fastattn.quantize_kv(k), fastattn.quantize_kv(v)
        scales = {"key_scale": ks, "value_scale": vs}
    work.candidates["fastattn"] = functools.partial(
        fastattn.scaled_dot_product_attention, q, k, v, is_causal=causal, **scales
    )
    if work.dtype in DTYPES:  # NumPy's matmul has no fast bfloat16/int8 form
        work.candidates["numpy"] = functools.partial(numpy_sdpa, q, k, v, causal)
    if "torch" in impls and libs.torch is not None and work.dtype != "int8-kv":
        torch = libs.torch
        if work.dtype == "bfloat16":  # torch.from_numpy has no bfloat16: the same bits
            tq, tk, tv = (
                torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16) for a in (q, k, v)
            )
            work.to_numpy["torch"] = lambda t: t.float().numpy()
        else:
            tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
            work.to_numpy["torch"] = lambda t: t.numpy()
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if group > 1:
            kw = {"enable_gqa": True}

            def run_torch():
                with torch.no_grad():
                    return sdpa(tq, tk, tv, is_causal=causal, **kw)
        else:

            def run_torch():
                with torch.no_grad():
                    return sdpa(tq, tk, tv, is_causal=causal)

        work.candidates["torch"] = run_torch
    if "jax" in impls and libs.jax is not None and work.dtype in DTYPES:
        jax = libs.jax
        attend = jax.jit(functools.partial(jax.nn.dot_product_attention, is_causal=causal))
        jq, jk, jv = (
            jax.device_put(np.ascontiguousarray(np.swapaxes(a, 1, 2))) for a in (q, k, v)
        )  # JAX's layout is (B, L, heads, E)
        work.candidates["jax"] = lambda: attend(jq, jk, jv).block_until_ready()
        work.to_numpy["jax"] = lambda a: np.swapaxes(np.asarray(a), 1, 2)
    if (
        work.dtype == "bfloat16"
        and "openvino" in impls
        and group == 1
        and libs.engine("openvino") is not None
    ):  # OpenVINO's bfloat16 SDPA (bf16 hint) on the same bfloat16 values, fed as float32
        chosen = _anchors.openvino_bf16_runner(
            *(a.astype(np.float32) for a in (q, k, v)), causal, libs.threads
        )
        work.candidates["openvino"], work.to_numpy["openvino"] = chosen.call, chosen.to_numpy
        work.ops["openvino"] = {"op": chosen.op}
    for name in _anchors.ANCHORS:
        # float32 only: on float64 inputs both engines compute at float32 accuracy, and
        # neither is handed int8 K/V (their ops would read the int8 arrays as values).
        if name in impls and work.dtype == "float32" and libs.engine(name) is not None:
            chosen, seconds = _anchors.fastest(name, q, k, v, causal, libs.threads, probe)
            work.candidates[name], work.to_numpy[name] = chosen.call, chosen.to_numpy
            work.ops[name] = {"op": chosen.op, "probe_s": seconds}

    def reference():
        # The first query rows of the first kv head's group (top-left causal rows keep
        # their meaning when later rows are dropped).
        rows = max(1, min(lq, _REFERENCE_ELEMENTS // (group * lk)))
        # (int8 k/v: the reference dequantises them, in float64, for a float32 query)
        expected = fastattn.reference.scaled_dot_product_attention(
            q[:1, :group, :rows].astype(np.float32 if scales else np.float64),
            k[:1, :1] if scales else k[:1, :1].astype(np.float64),
            v[:1, :1] if scales else v[:1, :1].astype(np.float64),
            is_causal=causal,
            **{n: s[:1, :1] for n, s in scales.items()},
        )
        return expected, lambda out: out[:1, :group, :rows]

    work.reference = reference


def _build_sdpa_backward(work: Workload, rng, dt, libs: Libraries, impls) -> None:
    """A training step's attention: the forward (fastattn: with ``return_lse=True``) and
    the gradients of query, key and value for a random output gradient. fastattn-forward and
    fastattn-backward time the two halves alone (the backward from a saved out and lse)."""
    b, hq, hkv, lq, lk, e = work.case.dims
    causal, group = work.case.causal, hq // hkv
    q, k, v, g = _rng_arrays(
        rng, dt, (b, hq, lq, e), (b, hkv, lk, e), (b, hkv, lk, e), (b, hq, lq, e)
    )
    sdpa = fastattn.scaled_dot_product_attention
    backward = fastattn.scaled_dot_product_attention_backward

    def run_fastattn():
        out, lse = sdpa(q, k, v, is_causal=causal, return_lse=True)
        return backward(g, q, k, v, out, lse, is_causal=causal)

    work.candidates["fastattn"] = run_fastattn
    work.candidates["fastattn-forward"] = functools.partial(
        sdpa, q, k, v, is_causal=causal, return_lse=True
    )
    saved = sdpa(q, k, v, is_causal=causal, return_lse=True)
    work.candidates["fastattn-backward"] = functools.partial(
        backward, g, q, k, v, *saved, is_causal=causal
    )
    work.unchecked.add("fastattn-forward")
    work.candidates["numpy"] = functools.partial(numpy_sdpa_grads, q, k, v, g, causal)
    if "torch" in impls and libs.torch is not None:
        torch = libs.torch
        tq, tk, tv = (torch.from_numpy(a).requires_grad_() for a in (q, k, v))
        tg = torch.from_numpy(g)
        kw = {"enable_gqa": True} if group > 1 else {}

        def run_torch():
            out = torch.nn.functional.scaled_dot_product_attention(
                tq, tk, tv, is_causal=causal, **kw
            )
            return torch.autograd.grad(out, (tq, tk, tv), tg)

        work.candidates["torch"] = run_torch
        work.to_numpy["torch"] = lambda grads: tuple(t.numpy() for t in grads)
    for name in ("fastattn", "fastattn-backward", "numpy"):
        work.to_numpy[name] = tuple

    def reference():
        # Batch entry 0, the query heads of key/value head 0: all three gradients when the
        # float64 reference's score matrices fit its budget; else the first rows of dq (each
        # query row's gradient depends on that row alone, dk and dv on every row).
        ref = fastattn.reference
        if group * lq * lk <= _REFERENCE_ELEMENTS:
            qs, kvs, rows = (slice(0, 1), slice(0, group)), (slice(0, 1), slice(0, 1)), lq
        else:
            rows = max(1, min(lq, _REFERENCE_ELEMENTS // lk))
            qs, kvs = (slice(0, 1), slice(0, 1), slice(0, rows)), (slice(0, 1), slice(0, 1))
        q64, k64, v64, g64 = (a.astype(np.float64) for a in (q[qs], k[kvs], v[kvs], g[qs]))
        out, lse = ref.scaled_dot_product_attention(
            q64, k64, v64, is_causal=causal, return_lse=True
        )
        grads = ref.scaled_dot_product_attention_backward(
            g64, q64, k64, v64, out, lse, is_causal=causal
        )
        if rows < lq:
            return grads[0].ravel(), lambda got: got[0][qs].ravel()
        expected = np.concatenate([a.ravel() for a in grads])
        return expected, lambda got: np.concatenate(
            [got[0][qs].ravel(), got[1][kvs].ravel(), got[2][kvs].ravel()]
        )

    work.reference = reference


def _build_additive(work: Workload, rng, dt) -> None:
    b, lq, lk, d, hidden = work.case.dims
    q, k, v = _rng_arrays(rng, dt, (b, lq, d), (b, lk, d), (b, lk, d))
    w_q, w_k = (a / dt.type(np.sqrt(d)) for a in _rng_arrays(rng, dt, (d, hidden), (d, hidden)))
    (w_v,) = _rng_arrays(rng, dt, (hidden,))
    args = (q, k, v, w_q, w_k, w_v)
    work.candidates["fastattn"] = functools.partial(fastattn.additive_attention, *args)
    work.candidates["numpy"] = functools.partial(numpy_additive, *args)

    def reference():
        rows = max(1, min(lq, _REFERENCE_ELEMENTS // (lk * hidden)))
        expected = fastattn.reference.additive_attention(
            *(a.astype(np.float64) for a in (q[:1, :rows], k[:1], v[:1], w_q, w_k, w_v))
        )
        return expected, lambda out: out[:1, :rows]

    work.reference = reference


def _build_masked_softmax(work: Workload, rng, dt) -> None:
    b, lq, lk = work.case.dims
    (x,) = _rng_arrays(rng, dt, (b, lq, lk))
    valid_lens = rng.integers(1, lk + 1, size=b)
    work.candidates["fastattn"] = functools.partial(fastattn.masked_softmax, x, valid_lens)
    work.candidates["numpy"] = functools.partial(numpy_masked_softmax, x, valid_lens)

    def reference():
        m = max(1, min(b, _REFERENCE_ELEMENTS // (lq * lk)))
        expected = fastattn.reference.masked_softmax(x[:m].astype(np.float64), valid_lens[:m])
        return expected, lambda out: out[:m]

    work.reference = reference


def _build_masked_sdpa(work: Workload, rng, dt, libs: Libraries, impls) -> None:
    b, h, n, e = work.case.dims
    q, k, v = _rng_arrays(rng, dt, *[(b, h, n, e)] * 3)
    mask, lens = attention_mask(work.case)
    sdpa = fastattn.scaled_dot_product_attention
    if work.case.mask == "valid-lens":  # the key-padding mask's lengths, per batch entry
        given = {"valid_lens": lens}
    elif work.case.mask == "block-mask":  # built once, outside the clock, as a user reuses it
        given = {"attn_mask": fastattn.block_mask(mask)}
    else:
        given = {"attn_mask": mask}
    work.candidates["fastattn"] = functools.partial(sdpa, q, k, v, **given)
    # Everyone else gets the dense bool mask (the valid-lens row: the key-padding mask).
    additive = np.where(mask, dt.type(0), dt.type(-np.inf))
    work.candidates["numpy"] = functools.partial(numpy_sdpa, q, k, v, additive_mask=additive)
    if "torch" in impls and libs.torch is not None:
        torch = libs.torch
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
        tm = torch.from_numpy(np.ascontiguousarray(mask))

        def run_torch():
            with torch.no_grad():
                return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm)

        work.candidates["torch"] = run_torch
        work.to_numpy["torch"] = lambda t: t.numpy()

    def reference():
        rows = max(1, min(n, _REFERENCE_ELEMENTS // (h * n)))
        expected = fastattn.reference.scaled_dot_product_attention(
            *(
                a[:1, :, :rows].astype(np.float64) if a is q else a[:1].astype(np.float64)
                for a in (q, k, v)
            ),
            attn_mask=np.broadcast_to(mask, (b, h, n, n))[:1, :, :rows],
        )
        return expected, lambda out: out[:1, :, :rows]

    work.reference = reference


def _build_merge_states(work: Workload, rng, dt) -> None:
    parts, b, h, lq, ev = work.case.dims
    outputs = _rng_arrays(rng, dt, *[(b, h, lq, ev)] * parts)
    lses = [(3.0 * a).astype(dt) for a in _rng_arrays(rng, dt, *[(b, h, lq)] * parts)]
    work.candidates["fastattn"] = lambda: fastattn.merge_attention_states(outputs, lses)[0]
    work.candidates["numpy"] = lambda: numpy_merge_states(outputs, lses)[0]

    def reference():
        # The first heads of the first batch entry.
        head = (slice(0, 1), slice(0, max(1, min(h, _REFERENCE_ELEMENTS // (parts * lq * ev)))))
        expected, _ = fastattn.reference.merge_attention_states(
            [o[head].astype(np.float64) for o in outputs],
            [x[head].astype(np.float64) for x in lses],
        )
        return expected, lambda out: out[head]

    work.reference = reference


def _build_mha_decode(work: Workload, rng, dt, libs: Libraries, impls) -> None:
    """One decode step: the new token's q/k/v projected, k/v appended to a preallocated
    cache holding ``cache - 1`` positions, attention over all ``cache``, the output
    projection. The cache is rewound after each call, so every step sees the same length.
    torch's step is the same loop written with its ops (``F.linear`` into a preallocated
    head-major cache, ``F.scaled_dot_product_attention``): ``nn.MultiheadAttention`` has no
    KV cache and would project every cached position again."""
    b, e, h, cache = work.case.dims
    d = e // h
    layer = fastattn.MultiHeadAttention(e, h, dtype=dt, seed=0)
    for proj in (layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj):
        proj.bias = 0.1 * rng.standard_normal(proj.bias.shape)
    (tokens,) = _rng_arrays(rng, dt, (b, cache, e))
    prompt, step = tokens[:, :-1], tokens[:, -1:]
    kv = layer.new_kv_cache(b, cache)
    layer(prompt, kv_cache=kv, is_causal=True)

    def run_fastattn():
        out = layer(step, kv_cache=kv, is_causal=True)
        kv.length -= 1
        return out

    work.candidates["fastattn"] = run_fastattn
    w = {n: getattr(layer, n) for n in ("q_proj", "k_proj", "v_proj", "out_proj")}

    def heads(x):
        return x.reshape(b, -1, h, d).swapaxes(1, 2)

    k_np = heads(prompt @ w["k_proj"].weight.T + w["k_proj"].bias)
    v_np = heads(prompt @ w["v_proj"].weight.T + w["v_proj"].bias)
    k_cache = np.concatenate([k_np, np.zeros((b, h, 1, d), dt)], axis=2)
    v_cache = np.concatenate([v_np, np.zeros((b, h, 1, d), dt)], axis=2)

    def run_numpy():
        q = step @ w["q_proj"].weight.T + w["q_proj"].bias
        k_cache[:, :, -1:] = heads(step @ w["k_proj"].weight.T + w["k_proj"].bias)
        v_cache[:, :, -1:] = heads(step @ w["v_proj"].weight.T + w["v_proj"].bias)
        o = numpy_sdpa(heads(q), k_cache, v_cache, False)
        return o.swapaxes(1, 2).reshape(b, 1, e) @ w["out_proj"].weight.T + w["out_proj"].bias

    work.candidates["numpy"] = run_numpy
    if "torch" in impls and libs.torch is not None:
        torch = libs.torch
        f = torch.nn.functional
        tw = {n: (torch.from_numpy(p.weight), torch.from_numpy(p.bias)) for n, p in w.items()}
        tstep = torch.from_numpy(np.ascontiguousarray(step))
        tk, tv = torch.from_numpy(k_cache.copy()), torch.from_numpy(v_cache.copy())

        def run_torch():
            with torch.no_grad():
                q = f.linear(tstep, *tw["q_proj"]).view(b, 1, h, d).transpose(1, 2)
                tk[:, :, -1:] = f.linear(tstep, *tw["k_proj"]).view(b, 1, h, d).transpose(1, 2)
                tv[:, :, -1:] = f.linear(tstep, *tw["v_proj"]).view(b, 1, h, d).transpose(1, 2)
                o = f.scaled_dot_product_attention(q, tk, tv)
                return f.linear(o.transpose(1, 2).reshape(b, 1, e), *tw["out_proj"])

        work.candidates["torch"] = run_torch
        work.to_numpy["torch"] = lambda t: t.numpy()

    def reference():
        expected = fastattn.reference.multi_head_attention(
            step.astype(np.float64),
            tokens.astype(np.float64),
            num_heads=h,
            **{
                f"{n}_{kind}": getattr(w[f"{n}_proj"], kind).astype(np.float64)
                for n in ("q", "k", "v", "out")
                for kind in ("weight", "bias")
            },
        )
        return expected, lambda out: out

    work.reference = reference
