"""Sphinx configuration of the fastattn documentation (how to build it: README.md here)."""

from __future__ import annotations

import sys
from pathlib import Path

import fastattn

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

project = "fastattn"
author = "the fastattn authors"
copyright = "the fastattn authors, BSD-3-Clause"
release = fastattn.__version__  # the installed package the pages document
version = release

extensions = [
    "myst_parser",  # Markdown pages: the contract (semantics.md), the benchmark report
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",  # `sphinx-build -b doctest`: every >>> in the pages and docstrings
    "sphinx.ext.mathjax",
    "sphinx_gallery.gen_gallery",
    "docstring_notes",  # _ext/: prose after a docstring's field list, as its Notes
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = [
    "_build",
    "_ext",
    "README.md",
    "auto_examples/*.ipynb",
    "auto_examples/*.py",
    "auto_examples/*.zip",
    "auto_examples/*.json",
]

# Every cross-reference must resolve. There is no intersphinx: the build never goes online
# (CI has no network but PyPI), so references to NumPy/Python objects stay plain text.
nitpicky = True

# The installed package is documented; type hints would be a second, terser copy of the
# numpydoc "Parameters" types (and unresolvable names under nitpicky).
autodoc_typehints = "none"
autodoc_member_order = "bysource"
numpydoc_show_class_members = False  # the API page lists the members it documents
numpydoc_xref_param_type = False
numpydoc_validation_checks: set[str] = set()

myst_enable_extensions = ["dollarmath", "substitution"]
# Facts the pages state from the code, not by hand: {{ isas_compiled }} in Markdown.
_isas = [f"`{name}`" for name in fastattn._core.compiled_isas()]
myst_substitutions = {
    "isas_compiled": "the instruction sets " + ", ".join(_isas[:-1]) + " and " + _isas[-1]
    if len(_isas) > 1
    else "the instruction set " + _isas[0],
}
myst_heading_anchors = 3

doctest_global_setup = "import numpy as np\nimport fastattn"

sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"\.py$",  # run every example
    "image_scrapers": ("gallery_png.scraper",),
    "download_all_examples": False,
    "remove_config_comments": True,
    "abort_on_example_error": True,
    "only_warn_on_example_error": False,
    "show_memory": False,
    "plot_gallery": "True",
}

html_theme = "pydata_sphinx_theme"
html_title = f"fastattn {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    # The reports' tables are wide: their pages have no "on this page" column.
    "secondary_sidebar_items": {"**": ["page-toc"], "bench/report": [], "benchmarks": []},
}
# No navigation column on the pages that have no sub-pages: the text gets its width.
html_sidebars = {
    page: []
    for page in [
        "index",
        "getting-started",
        "semantics",
        "benchmarks",
        "bench/report",
        "cuda",
        "dask",
        "capi",
        "reliability",
        "development",
        "api",
    ]
}
html_static_path = ["_static"]
html_css_files = ["fastattn.css"]  # code blocks wrap rather than hide their ends
html_show_sourcelink = False
html_last_updated_fmt = None
