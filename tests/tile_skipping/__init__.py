"""Masks that hide whole tiles: the kernels' skipping against the reference, and
fastattn.block_mask."""
