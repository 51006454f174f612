"""Helpers shared by the test modules (none of them a test module): layouts and tolerances
(``attention_checks``, ``family_checks``), hostile inputs (``reliability_checks``) and the
CUDA path's runner and CPU emulator (``cuda_checks``, ``cuda_emulator``).

``tests/`` is the import root (it holds no ``__init__.py``; pytest's default "prepend"
import mode puts it first on ``sys.path``), so this package is ``helpers`` and the test
folders are packages of their own: ``sdpa.test_errors`` and ``family.test_errors`` could
not clash.
"""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
