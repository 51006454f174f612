"""The API reference (docs/api.rst) documents every public name and every reference twin,
each public computation has its twin in fastattn.reference, and the benchmark page's
report section is the one tools/benchmarks_page.py writes from the latest report."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import fastattn
import fastattn.reference

from helpers import REPO

API = (REPO / "docs" / "api.rst").read_text()

# Public names that compute nothing a NumPy twin could check: configuration, the C API's
# header folder, a plot, and the containers a computation takes (BlockMask, from
# block_mask) or keeps (KVCache). Each is documented all the same.
NO_TWIN = {
    "__version__",
    "get_num_threads",
    "set_num_threads",
    "show_config",
    "get_include",
    "plot_attention",
    "block_mask",
    "BlockMask",
    "KVCache",
}


def documented(module: str) -> set[str]:
    """The names an ``.. autofunction::`` or ``.. autoclass::`` documents under
    ``.. currentmodule:: <module>`` in api.rst."""
    names: set[str] = set()
    current = None
    for line in API.splitlines():
        m = re.match(r"\.\. currentmodule:: (\S+)", line)
        if m:
            current = m.group(1)
        m = re.match(r"\.\. auto(?:function|class):: (\S+)", line)
        if m and current == module:
            names.add(m.group(1))
    return names


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def test_every_public_name_has_its_api_entry():
    public = set(fastattn.__all__) - {"__version__"}
    assert public - documented("fastattn") == set(), "add them to docs/api.rst"
    assert documented("fastattn") - public == set(), "api.rst documents names not in __all__"


def test_every_glue_function_has_its_api_entry():
    """fastattn.torch and fastattn.jax (their __all__ read from the source: the test needs
    neither framework)."""
    for module in ("torch", "jax"):
        tree = ast.parse((REPO / "fastattn" / f"{module}.py").read_text())
        (names,) = [
            ast.literal_eval(node.value)
            for node in tree.body
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__"
        ]
        assert set(names) == documented(f"fastattn.{module}") and names, module


def test_every_reference_function_has_its_api_entry():
    twins = set(fastattn.reference.__all__)
    assert twins - documented("fastattn.reference") == set(), "add them to docs/api.rst"
    assert documented("fastattn.reference") - twins == set()


def test_every_public_computation_has_a_reference_twin():
    """scaled_dot_product_attention -> reference.scaled_dot_product_attention, and the layer
    MultiHeadAttention -> reference.multi_head_attention."""
    computations = set(fastattn.__all__) - NO_TWIN
    assert {snake(name) for name in computations} - set(fastattn.reference.__all__) == set()
    assert NO_TWIN <= set(fastattn.__all__), "NO_TWIN names a name that is not public"


def test_the_parser_reads_the_page():
    """documented() finds the directives (an empty parse would make the tests above pass
    on a page that lost its entries only half-way)."""
    assert "scaled_dot_product_attention" in documented("fastattn")
    assert "scaled_dot_product_attention" in documented("fastattn.reference")
    assert documented("no.such.module") == set()


def test_benchmarks_page_is_generated_from_the_latest_report():
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "benchmarks_page.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_isa_names_are_listed_from_the_code_only():
    """The instruction sets are listed in one place, the code (compiled_isas, which
    getting-started.md shows through its {{ isas_compiled }} substitution, filled in by
    docs/conf.py): no page spells out a list of them by hand ("scalar|baseline|...",
    "avx2, avx512"), which would go stale when an ISA is added (reports under docs/bench/
    print what their run had, and are left alone)."""
    names = "|".join(sorted(fastattn._core.compiled_isas(), key=len, reverse=True))
    hand_list = re.compile(rf"`?\b({names})\b`?\s*(\||,|\bor\b|\band\b)\s*`?\b({names})\b")
    pages = [REPO / "README.md"] + [
        p for p in sorted((REPO / "docs").rglob("*.md")) if "bench" not in p.parts[-2:-1]
    ]
    offenders = [
        f"{page.relative_to(REPO)}: {m.group(0)}"
        for page in pages
        if "_build" not in page.parts and "auto_examples" not in page.parts
        for m in hand_list.finditer(page.read_text())
    ]
    assert offenders == []
    assert "{{ isas_compiled }}" in (REPO / "docs" / "getting-started.md").read_text()
