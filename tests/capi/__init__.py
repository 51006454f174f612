"""The C API: the header, the capsule table, the Cython .pxd and the ctypes/Numba side."""
