"""``python -m fastattn.bench``: see ``python -m fastattn.bench --help``."""

from fastattn.bench._cli import main

raise SystemExit(main())
