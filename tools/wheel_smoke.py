"""Smoke test of an installed fastattn: a wheel in a fresh venv, or cibuildwheel's test step.

    python tools/wheel_smoke.py      # with the Python whose fastattn (a wheel) is tested

Needs only fastattn and NumPy. Prints the configuration, then checks every public function
against ``fastattn.reference`` once per instruction set this CPU supports, each in a child
process started with ``FASTATTN_ISA=<isa>`` (the import-time override users have), and
finally runs ``python -m fastattn.bench --smoke`` (the benchmark's tiny grid) without plots.
Exits non-zero on the first failure; the last line is ``wheel smoke test passed: ...``.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def check(name: str, got, expected, rtol: float, atol: float) -> None:
    np.testing.assert_allclose(
        np.asarray(got, dtype=np.float64), expected, rtol=rtol, atol=atol, err_msg=name
    )


def run_checks() -> None:
    """Every public function against its float64 twin, float32 and float64."""
    import fastattn
    from fastattn import reference as ref

    isa = os.environ["FASTATTN_ISA"]
    assert fastattn._core.active_isa() == isa, (fastattn._core.active_isa(), isa)
    rng = np.random.default_rng(0)
    for dtype, tol in ((np.float32, 2e-5), (np.float64, 1e-12)):

        def draw(*shape, dtype=dtype):
            return rng.standard_normal(shape).astype(dtype)

        q, k, v = draw(2, 4, 37, 24), draw(2, 2, 53, 24), draw(2, 2, 53, 16)
        vl = np.array([53, 20])
        check(
            f"sdpa {dtype.__name__}",
            fastattn.scaled_dot_product_attention(q, k, v, is_causal=True, valid_lens=vl),
            ref.scaled_dot_product_attention(q, k, v, is_causal=True, valid_lens=vl),
            tol,
            tol,
        )
        out, lse = fastattn.scaled_dot_product_attention(
            q[0, :, :1], k[0], v[0], return_lse=True, num_threads=1
        )
        e_out, e_lse = ref.scaled_dot_product_attention(q[0, :, :1], k[0], v[0], return_lse=True)
        check("sdpa decode", out, e_out, tol, tol)
        check("sdpa lse", lse, e_lse, tol, tol)
        x = draw(3, 9, 40)
        check(
            "masked_softmax",
            fastattn.masked_softmax(x, np.array([40, 1, 7])),
            ref.masked_softmax(x, np.array([40, 1, 7])),
            tol,
            tol,
        )
        w_q, w_k, w_v = draw(24, 32), draw(24, 32), draw(32)
        check(
            "additive_attention",
            fastattn.additive_attention(q[0], k[0, :1], v[0, :1], w_q, w_k, w_v),
            ref.additive_attention(q[0], k[0, :1], v[0, :1], w_q, w_k, w_v),
            50 * tol,
            50 * tol,
        )
        for kw in (
            {"score": "cosine", "temperature": 0.2, "normalize": "topk", "top_k": 5},
            {"score": "gaussian", "bandwidth": 3.0, "normalize": "hardmax"},
        ):
            check(
                f"attention {kw}",
                fastattn.attention(q, k, v, **kw),
                ref.attention(q, k, v, **kw),
                10 * tol,
                10 * tol,
            )
        xk = np.sort(rng.uniform(0, 5, 200)).astype(dtype)
        xq = np.linspace(0.5, 4.5, 31).astype(dtype)
        check(
            "nadaraya_watson",
            fastattn.nadaraya_watson(xq, xk, np.sin(xk), kernel="epanechnikov", bandwidth=0.5),
            ref.nadaraya_watson(xq, xk, np.sin(xk), kernel="epanechnikov", bandwidth=0.5),
            10 * tol,
            10 * tol,
        )
    mha = fastattn.MultiHeadAttention(32, 4, num_kv_heads=2, seed=0)
    y = mha(rng.standard_normal((2, 5, 32)).astype(np.float32), is_causal=True)
    assert y.shape == (2, 5, 32) and np.isfinite(y).all()
    same = [fastattn.scaled_dot_product_attention(q, k, v, num_threads=n) for n in (1, 2, 3)]
    assert all(np.array_equal(same[0], s) for s in same[1:]), "results depend on threads"
    print(f"ok isa={isa}", flush=True)


def main() -> int:
    import fastattn

    here = Path(fastattn.__file__).resolve().parent
    source_tree = Path(__file__).resolve().parent.parent / "fastattn"
    print(f"fastattn {fastattn.__version__} from {here}")
    if here == source_tree.resolve():
        print(
            "wheel smoke test: this fastattn is the source tree (an editable install?), "
            "not an installed wheel",
            file=sys.stderr,
        )
        return 2
    assert fastattn.__version__ == importlib.metadata.version("fastattn"), (
        fastattn.__version__,
        importlib.metadata.version("fastattn"),
    )
    fastattn.show_config()
    isas = fastattn._core.available_isas()
    for isa in isas:
        env = dict(os.environ, FASTATTN_ISA=isa)
        proc = subprocess.run(
            [sys.executable, __file__, "--child"],
            env=env,
            text=True,
            capture_output=True,
            check=False,
            timeout=600,
        )
        sys.stdout.write(proc.stdout)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            print(f"wheel smoke test FAILED under FASTATTN_ISA={isa}", file=sys.stderr)
            return 1
    with tempfile.TemporaryDirectory() as out:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "fastattn.bench",
                "--smoke",
                "--no-plots",
                "--impls",
                "fastattn,numpy",
                "--out",
                out,
            ],
            text=True,
            capture_output=True,
            check=False,
            timeout=600,
        )
        report = Path(out, "report.md")
        if proc.returncode != 0 or "fastattn benchmark report" not in report.read_text():
            sys.stderr.write(proc.stdout + proc.stderr)
            print("wheel smoke test FAILED: python -m fastattn.bench --smoke", file=sys.stderr)
            return 1
    print("ok python -m fastattn.bench --smoke")
    print(f"wheel smoke test passed: fastattn {fastattn.__version__}, ISAs {', '.join(isas)}")
    return 0


if __name__ == "__main__":
    if "--child" in sys.argv:
        run_checks()
    else:
        raise SystemExit(main())
