"""sphinx-gallery glue for the scripts in examples/.

The scripts draw on a ``matplotlib.figure.Figure`` (no pyplot, so they run without a
display) and save it to the path given as their first argument. sphinx-gallery runs each
script inside the examples/ folder, so ``reset_argv`` hands it a path in the gallery's
build output instead, and ``scraper`` moves that PNG to where sphinx-gallery keeps the
example's images: the picture on the page is the one the script writes for a user.
"""

from __future__ import annotations

import os
from pathlib import Path

from sphinx_gallery.scrapers import figure_rst


def _png_path(script_vars) -> Path:
    target = Path(script_vars["target_file"])  # the script's copy in the gallery folder
    return target.with_name(f"{target.stem}.written.png")


def reset_argv(gallery_conf, script_vars) -> list[str]:
    return [str(_png_path(script_vars))]


def scraper(block, block_vars, gallery_conf) -> str:
    written = _png_path(block_vars)
    if not written.exists():  # a block that saves nothing (the scripts save once, at the end)
        return ""
    image = Path(next(block_vars["image_path_iterator"]))
    os.replace(written, image)
    return figure_rst([image], gallery_conf["src_dir"])
