"""Print the pinned requirements of pyproject.toml's "docs" extra, one per line.

The documentation is built in the environment the tests ran in (its fastattn is the one just
built and tested), so the docs tools go into that venv without reinstalling fastattn, which
`pip install ".[docs]"` would compile again:

    .venv/bin/python tools/docs_requirements.py | .venv/bin/pip install -r /dev/stdin

`.ci/run` installs them this way; docs/README.md says how to build the pages.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def docs_requirements() -> list[str]:
    with PYPROJECT.open("rb") as f:
        return list(tomllib.load(f)["project"]["optional-dependencies"]["docs"])


if __name__ == "__main__":
    print("\n".join(docs_requirements()))
