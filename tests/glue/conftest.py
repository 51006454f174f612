"""The autograd glue's tests (fastattn.torch, fastattn.jax): each module skips without its
framework (neither is a test dependency of a plain install)."""
