"""The CUDA path: dispatch, the kernels' build, a CPU emulation of them, a real GPU."""
