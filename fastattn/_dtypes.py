"""The low-precision dtypes every module recognises: float16 (NumPy's own) and bfloat16
(ml_dtypes'), both stored in 16 bits and computed in float32. bfloat16 is recognised by
its name, so ml_dtypes is imported only by callers who use it (importing it registers the
dtype with NumPy)."""

from __future__ import annotations

import numpy as np

FLOAT32 = np.dtype(np.float32)


def is_bfloat16(dt: np.dtype) -> bool:
    """Whether ``dt`` is ml_dtypes' bfloat16 (native byte order)."""
    return dt.kind == "V" and dt.name == "bfloat16" and dt.isnative


def is_16bit_float(dt: np.dtype) -> bool:
    """float16 or bfloat16."""
    return dt == np.float16 or is_bfloat16(dt)
