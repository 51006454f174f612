"""Type stubs of the compiled module (private: use the fastattn package)."""

from collections.abc import Sequence
from typing import Required, TypedDict, Unpack

import numpy as np
from numpy.typing import NDArray

version: str
compiler: str
openmp_version: int
# The C API's function table (a PyCapsule named "fastattn._core._C_API"; see fastattn.capi).
_C_API: object

def available_isas() -> list[str]: ...
def cpu_has_avx512_bf16() -> bool: ...
def arm_features() -> list[str]: ...
def compiled_isas() -> list[str]: ...
def active_isa() -> str: ...
def set_isa(name: str) -> None: ...
def omp_max_threads() -> int: ...
def thread_environment() -> tuple[str | None, str | None]: ...
def fma_peak(dtype: str = "float32", num_threads: int = 1, seconds: float = 0.2) -> float: ...
def bf16_dot_peak(num_threads: int = 1, seconds: float = 0.2) -> float: ...
def read_bandwidth(nbytes: int = 1 << 30, num_threads: int = 1, repeats: int = 3) -> float: ...

class _AttentionArgs(TypedDict, total=False):
    """The keyword arguments every attention binding shares (csrc/bindings/attention_args.h);
    the optional arrays default to None, the options to no mask and no window."""

    query: Required[NDArray[np.floating]]
    key: Required[NDArray[np.floating]]
    value: Required[NDArray[np.floating]]
    out: Required[NDArray[np.floating]]
    bool_mask: NDArray[np.bool_] | None
    float_mask: NDArray[np.floating] | None
    valid_lens: NDArray[np.int64] | None
    lse: NDArray[np.floating] | None
    weights: NDArray[np.floating] | None
    sinks: NDArray[np.floating] | None
    alibi_slopes: NDArray[np.floating] | None
    scale: float
    causal: bool
    diag_offset: int
    window_left: int
    window_right: int
    num_threads: Required[int]

class _SdpaArgs(_AttentionArgs, total=False):
    softcap: float
    key_scale: NDArray[np.float32] | None
    value_scale: NDArray[np.float32] | None
    mask_summary: MaskSummary | None

class MaskSummary:
    """A bool mask's tile summary (fastattn.block_mask); opaque."""

    @property
    def nbytes(self) -> int: ...

def mask_summary(mask: NDArray[np.bool_], num_threads: int) -> MaskSummary: ...

class _VarlenArgs(_AttentionArgs, total=False):
    cu_seqlens_q: Required[NDArray[np.int64]]
    cu_seqlens_k: Required[NDArray[np.int64]]
    lse_tokens: NDArray[np.floating] | None
    softcap: float
    bottom_right: bool

class _AdditiveArgs(_AttentionArgs, total=False):
    w_q: Required[NDArray[np.floating]]
    w_k: Required[NDArray[np.floating]]
    w_v: Required[NDArray[np.floating]]
    normalizer: Required[int]
    top_k: Required[int]
    hardmax: Required[bool]

class _SelectArgs(_AttentionArgs, total=False):
    top_k: Required[int]
    hardmax: Required[bool]

class _RegressionArgs(_AttentionArgs, total=False):
    bandwidth: Required[NDArray[np.float64]]
    kernel: Required[int]

def sdpa(**kwargs: Unpack[_SdpaArgs]) -> None: ...
def sdpa_varlen(**kwargs: Unpack[_VarlenArgs]) -> None: ...
def merge_states(
    outputs: Sequence[NDArray[np.floating]],
    lses: Sequence[NDArray[np.floating]],
    out: NDArray[np.floating],
    lse: NDArray[np.floating],
    num_threads: int,
) -> None: ...

# The fast path of scaled_dot_product_attention (see fastattn/_sdpa.py): the public
# function's own arguments, in this order (called positionally: tests/sdpa/test_fast_call_order.py
# holds the call site, this stub and the binding to it); the result, or None where the full path
# must run.
def sdpa_fast(
    query: object,
    key: object,
    value: object,
    attn_mask: object,
    valid_lens: object,
    is_causal: object,
    causal_alignment: object,
    window: object,
    scale: object,
    softcap: object,
    return_lse: object,
    return_weights: object,
    out: object,
    num_threads: object,
    sinks: object,
    alibi_slopes: object,
) -> NDArray[np.floating] | None: ...
def set_thread_defaults(setting: int, cap: int) -> None: ...
def default_threads() -> int: ...
def available_cpus() -> int: ...
def cpus_of_quota(text: str) -> int: ...
def in_forked_child() -> bool: ...
def team_reset(contended: bool) -> None: ...
def team_watch(on: bool) -> None: ...
def team_contended() -> bool: ...
def team_report_at(latest_start_ns: int, region_ns: int, now_ns: int) -> None: ...
def team_contended_until() -> int: ...
def now_ns() -> int: ...

# The attention family (csrc/bindings/register_family.cpp; see fastattn/_family.py).
def masked_softmax(
    x: NDArray[np.floating],
    out: NDArray[np.floating],
    mask: NDArray[np.bool_] | None,
    valid_lens: NDArray[np.int64] | None,
    num_threads: int,
) -> None: ...
def masked_softmax_backward(
    weights: NDArray[np.floating],
    grad: NDArray[np.floating],
    out: NDArray[np.floating],
    mask: NDArray[np.bool_] | None,
    valid_lens: NDArray[np.int64] | None,
    num_threads: int,
) -> None: ...
def additive(**kwargs: Unpack[_AdditiveArgs]) -> None: ...
def select(**kwargs: Unpack[_SelectArgs]) -> None: ...
def nadaraya_watson(**kwargs: Unpack[_RegressionArgs]) -> None: ...
def additive_backward(
    qp: NDArray[np.floating],
    kp: NDArray[np.floating],
    ds: NDArray[np.floating],
    ds_t: NDArray[np.floating],
    w_v: NDArray[np.floating],
    d_qp: NDArray[np.floating],
    d_kp: NDArray[np.floating],
    d_wv: NDArray[np.floating],
    num_threads: int,
) -> None: ...
def nadaraya_watson_backward(**kwargs: NDArray[np.floating] | int) -> None: ...
def project(
    x: NDArray[np.floating],
    w: NDArray[np.floating],
    out: NDArray[np.floating],
    num_threads: int,
) -> None: ...
