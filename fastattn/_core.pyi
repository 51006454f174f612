"""Type stubs of the compiled module (private: use the fastattn package)."""

import numpy as np
from numpy.typing import NDArray

version: str
compiler: str
openmp_version: int

def available_isas() -> list[str]: ...
def compiled_isas() -> list[str]: ...
def active_isa() -> str: ...
def set_isa(name: str) -> None: ...
def omp_max_threads() -> int: ...
def sdpa(
    query: NDArray[np.floating],
    key: NDArray[np.floating],
    value: NDArray[np.floating],
    out: NDArray[np.floating],
    bool_mask: NDArray[np.bool_] | None,
    float_mask: NDArray[np.floating] | None,
    valid_lens: NDArray[np.int64] | None,
    lse: NDArray[np.floating] | None,
    weights: NDArray[np.floating] | None,
    scale: float,
    softcap: float,
    causal: bool,
    diag_offset: int,
    window_left: int,
    window_right: int,
    num_threads: int,
) -> None: ...
