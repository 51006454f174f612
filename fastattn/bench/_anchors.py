"""ONNX Runtime and OpenVINO: the CPU attention engines Python users already deploy, as
baselines of the benchmark (used when installed, never required).

Each is built the way its users run it: ONNX Runtime with the standard ONNX ``Attention`` op
(opset 23) and the ``com.microsoft`` ``MultiHeadAttention`` / ``GroupQueryAttention`` ops,
OpenVINO with ``opset13.scaled_dot_product_attention`` compiled for CPU in float32. Every op
that can compute a shape is a *variant*; :func:`fastest` keeps the quickest one, so a row
compares with the engine at its best. Models are built and compiled once per shape, outside
the clock; inputs are laid out for each op (and its answer laid back) outside the clock too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

ANCHORS = ("ort", "openvino")
ORT_OPSET = 23  # the first opset with the standard Attention op
NAMES = {"ort": "ONNX Runtime", "openvino": "OpenVINO"}
PACKAGES = {"ort": "onnxruntime onnx", "openvino": "openvino"}


@dataclass(frozen=True)
class Runner:
    """One engine's variant for one set of inputs: ``call`` is the timed call, ``to_numpy``
    turns its answer into (B, Hq, Lq, Ev) outside the clock, ``op`` names the variant."""

    op: str
    call: Callable[[], object]
    to_numpy: Callable[[object], np.ndarray]


def load(name: str):
    """The engine's module and version, or an ImportError whose message says what to install.

    ONNX Runtime runs ONNX models; the ``onnx`` package builds them (``onnx.helper``)."""
    if name == "ort":
        import onnxruntime

        try:
            import onnx  # noqa: F401
        except ImportError:
            raise ImportError(
                "ONNX Runtime is installed but the onnx package that builds its "
                "models is not (pip install onnx)"
            ) from None
        return onnxruntime, onnxruntime.__version__
    if name == "openvino":
        import openvino

        return openvino, openvino.__version__.split("-")[0]
    raise ValueError(f"unknown engine {name!r}")


def runners(name: str, q, k, v, causal: bool, threads: int) -> list[Runner]:
    """Every variant of engine ``name`` that computes ``sdpa(q, k, v, causal)`` (float32
    (B, H, L, E) arrays, Hq a multiple of Hkv, top-left causal mask)."""
    return (_ort_runners if name == "ort" else _openvino_runners)(q, k, v, causal, threads)


def fastest(
    name: str,
    q,
    k,
    v,
    causal: bool,
    threads: int,
    probe: Callable[[Callable[[], object]], float] | None = None,
) -> tuple[Runner, dict[str, float]]:
    """Engine ``name``'s variant with the least ``probe`` time (seconds per call; without a
    probe, the first variant), and every variant's probed time."""
    found = runners(name, q, k, v, causal, threads)
    if probe is None or len(found) == 1:
        return found[0], {}
    seconds = {r.op: probe(r.call) for r in found}
    return min(found, key=lambda r: seconds[r.op]), seconds


def _bsd(a: np.ndarray) -> np.ndarray:
    """(B, H, L, E) -> (B, L, H*E): the packed layout of the com.microsoft ops."""
    b, h, n, e = a.shape
    return np.ascontiguousarray(a.transpose(0, 2, 1, 3).reshape(b, n, h * e))


def _from_bsd(heads: int):
    def unpack(out) -> np.ndarray:
        b, n, he = out.shape
        return out.reshape(b, n, heads, he // heads).transpose(0, 2, 1, 3)

    return unpack


# --- ONNX Runtime ---------------------------------------------------------------------------


@functools.cache
def _ort_session(op: str, dims: tuple[int, ...], causal: bool, threads: int):
    """An InferenceSession holding one attention node, built once per (op, shape, threads)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    b, hq, hkv, lq, lk, e = dims
    f32, i32 = TensorProto.FLOAT, TensorProto.INT32
    if op == "Attention":
        inputs = [
            ("Q", f32, [b, hq, lq, e]),
            ("K", f32, [b, hkv, lk, e]),
            ("V", f32, [b, hkv, lk, e]),
        ]
        outputs, attrs, domain = ["Y"], {"is_causal": int(causal)}, ""
    elif op == "MultiHeadAttention":  # query packed (B, Lq, H*E); key/value as (B, H, Lk, E)
        inputs = [
            ("query", f32, [b, lq, hq * e]),
            ("key", f32, [b, hkv, lk, e]),
            ("value", f32, [b, hkv, lk, e]),
        ]
        outputs, attrs = ["output"], {"num_heads": hq, "unidirectional": int(causal)}
        domain = "com.microsoft"
    else:  # GroupQueryAttention: new tokens packed, the KV cache as (B, Hkv, capacity, E)
        new = lq
        past = (
            [("past_key", f32, [b, hkv, lk, e]), ("past_value", f32, [b, hkv, lk, e])]
            if new < lk
            else [None, None]
        )
        inputs = [
            ("query", f32, [b, new, hq * e]),
            ("key", f32, [b, new, hkv * e]),
            ("value", f32, [b, new, hkv * e]),
            *past,
            ("seqlens_k", i32, [b]),
            ("total_sequence_length", i32, []),
        ]
        outputs = ["output", "present_key", "present_value"]
        attrs, domain = {"num_heads": hq, "kv_num_heads": hkv}, "com.microsoft"
    node = helper.make_node(
        op, [x[0] if x else "" for x in inputs], outputs, domain=domain, **attrs
    )
    graph = helper.make_graph(
        [node],
        "attention",
        [helper.make_tensor_value_info(*x) for x in inputs if x],
        [helper.make_tensor_value_info(name, f32, None) for name in outputs],
    )
    opsets = [helper.make_opsetid("", ORT_OPSET)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=opsets)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _ort_runners(q, k, v, causal, threads) -> list[Runner]:
    b, hq, lq, e = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    dims = (b, hq, hkv, lq, lk, e)
    found = []
    # The standard op: (B, H, L, E) as they are, grouped-query heads included.
    sess = _ort_session("Attention", dims, causal, threads)
    feeds = {"Q": q, "K": k, "V": v}
    found.append(
        Runner("ONNX Attention", functools.partial(sess.run, ["Y"], feeds), lambda out: out[0])
    )
    if hq == hkv and (not causal or lq == lk):  # unidirectional is the square causal mask
        sess = _ort_session("MultiHeadAttention", dims, causal, threads)
        feeds = {"query": _bsd(q), "key": k, "value": v}
        unpack = _from_bsd(hq)
        found.append(
            Runner(
                "com.microsoft MultiHeadAttention",
                functools.partial(sess.run, ["output"], feeds),
                lambda out: unpack(out[0]),
            )
        )
    # GroupQueryAttention is a decoder's op: always causal, the new tokens last.
    if lq == 1 or (causal and lq == lk):
        found.append(_ort_gqa(q, k, v, dims, threads))
    return found


def _ort_gqa(q, k, v, dims, threads) -> Runner:
    """GroupQueryAttention as a decoder runs it: a prefill (no cache), or one new token
    appended to a KV cache that is both past_key and present_key (one shared buffer, bound
    once: no per-step copy of the cache)."""
    import onnxruntime as ort

    b, hq, hkv, lq, lk, e = dims
    sess = _ort_session("GroupQueryAttention", dims, True, threads)
    binding = sess.io_binding()
    held = [np.empty((b, lq, hq * e), np.float32)]  # the output, then every bound array
    for name, a in (
        ("query", _bsd(q)),
        ("key", _bsd(k[:, :, lk - lq :])),
        ("value", _bsd(v[:, :, lk - lq :])),
        ("seqlens_k", np.full(b, lk - 1, np.int32)),
        ("total_sequence_length", np.array(lk, np.int32)),
    ):
        binding.bind_cpu_input(name, a)
        held.append(a)
    out = held[0]
    binding.bind_output("output", "cpu", 0, np.float32, out.shape, out.ctypes.data)
    if lq < lk:
        # The cache (a copy: the step writes into it) holds every key; each step rewrites
        # its last slot with the same new token.
        for past, present, a in (
            ("past_key", "present_key", k),
            ("past_value", "present_value", v),
        ):
            cache = ort.OrtValue.ortvalue_from_numpy(a.copy())
            binding.bind_ortvalue_input(past, cache)
            binding.bind_ortvalue_output(present, cache)
            held.append(cache)
    else:
        binding.bind_output("present_key")
        binding.bind_output("present_value")

    def step(_held=tuple(held)):  # the binding points into these arrays: keep them alive
        sess.run_with_iobinding(binding)
        return out

    return Runner("com.microsoft GroupQueryAttention", step, _from_bsd(hq))


# --- OpenVINO -------------------------------------------------------------------------------


@functools.cache
def _openvino_model(
    shapes: tuple[tuple[int, ...], ...], causal: bool, threads: int, precision: str = "f32"
):
    """A compiled opset13 ScaledDotProductAttention for CPU with its infer request, built
    once per (shapes, threads, precision). Without the f32 hint the CPU plugin runs bfloat16
    on AVX-512 machines that have it; precision "bf16" asks for that explicitly."""
    import openvino as ov
    from openvino import opset13

    params = [opset13.parameter(s, ov.Type.f32, name=n) for s, n in zip(shapes, "qkv")]
    out = opset13.scaled_dot_product_attention(*params, causal=causal)
    model = ov.Model([out], params, "attention")
    compiled = ov.Core().compile_model(
        model, "CPU", {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads}
    )
    return compiled.create_infer_request()


def openvino_bf16_runner(q, k, v, causal: bool, threads: int) -> Runner:
    """OpenVINO's bfloat16 SDPA (INFERENCE_PRECISION_HINT=bf16: the CPU plugin computes the
    attention in bfloat16 on AVX512-BF16/AMX CPUs) on float32 (B, H, L, E) inputs with
    Hq == Hkv: the anchor of fastattn's bfloat16 rows."""
    b, hq, lq, _ = q.shape
    ev = v.shape[3]
    request = _openvino_model(tuple(a.shape for a in (q, k, v)), causal, threads, "bf16")
    call = functools.partial(request.infer, [q, k, v], share_inputs=True, share_outputs=True)
    return Runner("opset13 SDPA, bf16 hint", call, lambda out: out[0].reshape(b, hq, lq, ev))


def _openvino_runners(q, k, v, causal, threads) -> list[Runner]:
    b, hq, lq, e = q.shape
    hkv, lk, ev = k.shape[1], k.shape[2], v.shape[3]
    group = hq // hkv
    layouts = []
    if group == 1:
        layouts.append(("opset13 SDPA", q, k, v))
    else:
        # K and V broadcast over a group axis: one kv head serves its query heads as is.
        layouts.append(
            (
                "opset13 SDPA, K/V broadcast over the group",
                q.reshape(b, hkv, group, lq, e),
                k.reshape(b, hkv, 1, lk, e),
                v.reshape(b, hkv, 1, lk, ev),
            )
        )
        if not causal:  # a group's query rows stacked: one (G*Lq) x Lk problem per kv head
            layouts.append(
                ("opset13 SDPA, group rows stacked", q.reshape(b, hkv, group * lq, e), k, v)
            )
    found = []
    for op, *arrays in layouts:
        request = _openvino_model(tuple(a.shape for a in arrays), causal, threads)
        call = functools.partial(request.infer, arrays, share_inputs=True, share_outputs=True)
        found.append(Runner(op, call, lambda out: out[0].reshape(b, hq, lq, ev)))
    return found
