"""Thread-count policy, threadpoolctl, show_config, the public namespace, doctests and
the FASTATTN_ISA override."""

from __future__ import annotations

import doctest
import io
import os
import subprocess
import sys

import numpy as np
import pytest
import threadpoolctl

import fastattn
import fastattn._config
import fastattn._sdpa
import fastattn._threads
import fastattn.reference


@pytest.fixture(autouse=True)
def follow_environment():
    """Each test starts with no set_num_threads() in force and leaves none behind."""
    with fastattn.set_num_threads(None):
        yield


def cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# --------------------------------------------------------------------------------------
# get/set_num_threads


def test_set_and_get(monkeypatch):
    monkeypatch.delenv("FASTATTN_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    default = fastattn.get_num_threads()
    assert default == cpus()
    fastattn.set_num_threads(3)
    assert fastattn.get_num_threads() == 3
    fastattn.set_num_threads(np.int64(5))  # any integer type
    assert fastattn.get_num_threads() == 5
    fastattn.set_num_threads(None)
    assert fastattn.get_num_threads() == default


def test_context_manager_restores_nested():
    outer = fastattn.get_num_threads()
    with fastattn.set_num_threads(2) as ctx:
        assert isinstance(ctx, fastattn.set_num_threads)
        assert fastattn.get_num_threads() == 2
        with fastattn.set_num_threads(7):
            assert fastattn.get_num_threads() == 7
        assert fastattn.get_num_threads() == 2
    assert fastattn.get_num_threads() == outer


def test_context_manager_restores_on_error():
    outer = fastattn.get_num_threads()
    with pytest.raises(RuntimeError, match="boom"), fastattn.set_num_threads(4):
        raise RuntimeError("boom")
    assert fastattn.get_num_threads() == outer


def test_context_manager_restores_follow_environment(monkeypatch):
    monkeypatch.setenv("FASTATTN_NUM_THREADS", "3")
    with fastattn.set_num_threads(1):
        assert fastattn.get_num_threads() == 1
    monkeypatch.setenv("FASTATTN_NUM_THREADS", "6")  # still following the environment
    assert fastattn.get_num_threads() == 6


def test_setting_is_process_wide():
    import threading

    seen = []
    with fastattn.set_num_threads(5):
        t = threading.Thread(target=lambda: seen.append(fastattn.get_num_threads()))
        t.start()
        t.join()
    assert seen == [5]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_results_do_not_depend_on_setting(n):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 70, 16)).astype(np.float32) for _ in range(3))
    base = fastattn.scaled_dot_product_attention(q, k, v, num_threads=1)
    with fastattn.set_num_threads(n):
        got = fastattn.scaled_dot_product_attention(q, k, v)
    assert got.tobytes() == base.tobytes()


# --------------------------------------------------------------------------------------
# Environment


@pytest.mark.parametrize(
    ("fastattn_env", "omp_env", "expected"),
    [
        ("3", "5", 3),  # FASTATTN_NUM_THREADS wins
        (None, "5", 5),
        (None, "4,2", 4),  # OMP nesting list: the first level
        (" 2 ", None, 2),
        ("", "6", 6),  # empty means unset
        (None, None, None),  # the CPUs available
    ],
)
def test_environment_precedence(monkeypatch, fastattn_env, omp_env, expected):
    for var, value in (("FASTATTN_NUM_THREADS", fastattn_env), ("OMP_NUM_THREADS", omp_env)):
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, value)
    assert fastattn.get_num_threads() == (cpus() if expected is None else expected)
    with fastattn.set_num_threads(1):  # set_num_threads beats the environment
        assert fastattn.get_num_threads() == 1


@pytest.mark.parametrize("value", ["abc", "0", "-1", "2.5"])
def test_bad_environment_names_variable(monkeypatch, value):
    monkeypatch.setenv("FASTATTN_NUM_THREADS", value)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    with pytest.raises(ValueError, match="FASTATTN_NUM_THREADS"):
        fastattn.get_num_threads()
    with fastattn.set_num_threads(2):  # an explicit setting does not read it
        assert fastattn.get_num_threads() == 2


# --------------------------------------------------------------------------------------
# threadpoolctl


def _fastattn_entries():
    return [e for e in threadpoolctl.threadpool_info() if e.get("internal_api") == "fastattn"]


def test_threadpoolctl_lists_fastattn():
    entries = _fastattn_entries()
    assert len(entries) == 1
    entry = entries[0]
    assert entry["user_api"] == "openmp"
    assert entry["num_threads"] == fastattn.get_num_threads()
    assert entry["version"] == fastattn.__version__
    assert "_core" in os.path.basename(entry["filepath"])


def test_threadpoolctl_limits_and_restores():
    with fastattn.set_num_threads(2):
        with threadpoolctl.threadpool_limits(1):
            assert fastattn.get_num_threads() == 1
            assert _fastattn_entries()[0]["num_threads"] == 1
        assert fastattn.get_num_threads() == 2
        with threadpoolctl.threadpool_limits(limits=3, user_api="openmp"):
            assert fastattn.get_num_threads() == 3
        assert fastattn.get_num_threads() == 2
        with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
            assert fastattn.get_num_threads() == 2  # not a BLAS
    assert fastattn.get_num_threads() == fastattn._threads._from_environment()


def test_threadpool_controller_select():
    controller = threadpoolctl.ThreadpoolController().select(internal_api="fastattn")
    assert len(controller.lib_controllers) == 1
    with fastattn.set_num_threads(2), controller.limit(limits=1):
        assert fastattn.get_num_threads() == 1


# --------------------------------------------------------------------------------------
# show_config, namespace, version


def test_show_config(capsys):
    fastattn.show_config()
    text = capsys.readouterr().out
    lines = dict(line.split(": ", 1) for line in text.strip().splitlines())
    assert lines["fastattn"] == fastattn.__version__
    assert lines["isa"] == fastattn._core.active_isa()
    assert lines["num_threads"] == str(fastattn.get_num_threads())
    assert set(lines["isas_available"].split(", ")) == set(fastattn._core.available_isas())
    assert {"python", "platform", "compiler", "openmp", "isas_compiled"} <= set(lines)


def test_show_config_follows_isa_and_file(capsys):
    previous = fastattn._core.active_isa()
    try:
        fastattn._core.set_isa("scalar")
        buf = io.StringIO()
        fastattn.show_config(file=buf)
        assert "isa: scalar" in buf.getvalue().splitlines()
        assert capsys.readouterr().out == ""  # file= was honoured
    finally:
        fastattn._core.set_isa(previous)


def test_public_namespace():
    assert sorted(fastattn.__all__) == sorted(set(fastattn.__all__))
    for name in fastattn.__all__:
        assert hasattr(fastattn, name), name
    assert {
        "scaled_dot_product_attention",
        "get_num_threads",
        "set_num_threads",
        "show_config",
        "__version__",
    } <= set(fastattn.__all__)
    assert callable(fastattn.reference.scaled_dot_product_attention)
    assert callable(fastattn.reference.masked_softmax)
    for name in fastattn.reference.__all__:
        assert hasattr(fastattn.reference, name)


def test_version_matches_metadata():
    from importlib.metadata import version

    assert fastattn.__version__ == fastattn._core.version == version("fastattn")


def test_isa_lists_are_consistent():
    available = fastattn._core.available_isas()
    compiled = fastattn._core.compiled_isas()
    assert "scalar" in available
    assert set(available) <= set(compiled)
    assert fastattn._core.active_isa() in available


# --------------------------------------------------------------------------------------
# Doctests


@pytest.mark.parametrize(
    "module",
    [fastattn._sdpa, fastattn._threads, fastattn._config, fastattn.reference],
    ids=lambda m: m.__name__,
)
def test_doctests(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False, report=True)
    assert result.attempted > 0
    assert result.failed == 0


# --------------------------------------------------------------------------------------
# FASTATTN_ISA


def _python(code: str, **env_overrides):
    env = dict(os.environ)
    env.update(env_overrides)
    # cwd: a tests/ folder, so the child imports the installed fastattn, not the source tree
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
        cwd=os.path.dirname(__file__),
    )


def test_fastattn_isa_bogus_fails_naming_variable():
    proc = _python("import fastattn", FASTATTN_ISA="bogus")
    assert proc.returncode != 0
    assert "FASTATTN_ISA" in proc.stderr
    assert "bogus" in proc.stderr
    assert "ImportError" in proc.stderr


@pytest.mark.parametrize("isa", fastattn._core.available_isas())
def test_fastattn_isa_selects(isa):
    code = (
        "import numpy as np, fastattn; print(fastattn._core.active_isa()); "
        "q = np.ones((3, 4), np.float32); "
        "print(fastattn.scaled_dot_product_attention(q, q, q).sum())"
    )
    proc = _python(code, FASTATTN_ISA=f" {isa.upper()} ")  # trimmed, case-insensitive
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    assert lines[0] == isa
    assert float(lines[1]) == 12.0


def test_fastattn_isa_unsupported_fails():
    missing = [
        n for n in fastattn._core.compiled_isas() if n not in fastattn._core.available_isas()
    ]
    if not missing:
        pytest.skip("this CPU supports every compiled ISA")
    proc = _python("import fastattn", FASTATTN_ISA=missing[0])
    assert proc.returncode != 0
    assert "FASTATTN_ISA" in proc.stderr and missing[0] in proc.stderr
