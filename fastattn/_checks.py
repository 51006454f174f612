"""The scalar checks every part of fastattn shares (flags, real numbers, sizes, choices,
windows and the causal alignment), below the validation layer so that the thread control
and BlockMask can use them too.

Each message names the argument, what it got and what was expected; the semantics they
enforce are written down in ``docs/semantics.md``. The array checks and those of whole
calls (every public function's, the multi-head layer's included) are in
:mod:`fastattn._validation`; the layer's construction checks in :mod:`fastattn._layer_checks`.
"""

from __future__ import annotations

import math
import numbers
import operator

import numpy as np

_UNBOUNDED = 2**40  # larger than any sequence length; window sides are clamped to it
_MAX_BATCH_DIMS = 61  # the kernels index at most 64 dims: batch + (H, L, E)


# --------------------------------------------------------------------------------------
# Scalars


def check_flag(value: object, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_real(value: object, name: str, *, positive: bool = False) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x}")
    if positive and x <= 0:
        raise ValueError(f"{name} must be > 0, got {x}")
    return x


def check_index(value: object, expected: str) -> int:
    """``value`` as an int (``operator.index``; bools refused), else a ``TypeError`` of
    ``expected`` (what the argument must be, named) and the value given."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{expected}, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{expected}, got {value!r}") from None


def check_size(value: object, name: str, *, minimum: int = 1, noun: str = "an int") -> int:
    """An int >= ``minimum`` (bools refused); ``noun`` is how the message names an int."""
    n = check_index(value, f"{name} must be {noun} >= {minimum}")
    if n < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {n}")
    return n


def check_choice(value: object, name: str, choices: tuple) -> str:
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {listed}, got {value!r}")
    return value


def check_window(window: object) -> tuple[int, int]:
    """``(left, right)`` with None -> -1 (unbounded)."""
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ValueError(
            f"window must be None or a pair (left, right) of ints >= 0 or None, got {window!r}"
        )
    sides = []
    for side, value in zip(("left", "right"), window):
        if value is None:
            sides.append(-1)
            continue
        n = check_index(value, f"window {side} must be an int >= 0 or None")
        if n < 0:
            raise ValueError(f"window {side} must be >= 0 or None, got {n}")
        sides.append(min(n, _UNBOUNDED))  # any side >= Lq + Lk is unbounded; keeps int64 safe
    return sides[0], sides[1]


def check_alignment(causal_alignment: object) -> str:
    """``causal_alignment``, checked: ``"top_left"`` or ``"bottom_right"``."""
    if not isinstance(causal_alignment, str) or causal_alignment not in (
        "top_left",
        "bottom_right",
    ):
        raise ValueError(
            f"causal_alignment must be 'top_left' or 'bottom_right', got {causal_alignment!r}"
        )
    return causal_alignment
