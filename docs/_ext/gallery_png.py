"""sphinx-gallery glue for the scripts in examples/.

The scripts draw on a ``matplotlib.figure.Figure`` (no pyplot, so they run without a
display) and save it as ``<script name>.png`` in the current directory, which under
sphinx-gallery is examples/. The scraper moves that PNG to where sphinx-gallery keeps the
example's images: the picture on the page is the one the script writes for a user, and
nothing is left in the source tree.
"""

from __future__ import annotations

import os
from pathlib import Path

from sphinx_gallery.scrapers import figure_rst


def scraper(block, block_vars, gallery_conf) -> str:
    script = Path(block_vars["src_file"])
    written = script.with_suffix(".png")
    if not written.exists():  # a block that saves nothing (the scripts save once, at the end)
        return ""
    image = Path(next(block_vars["image_path_iterator"]))
    os.replace(written, image)
    return figure_rst([image], gallery_conf["src_dir"])
