# CMake toolchain file: cross-compile fastattn for aarch64 Linux with Debian's
# g++-aarch64-linux-gnu (tools/ci-arm.sh, the ARM job of .ci/run). The Python headers come
# from an arm64 root (FASTATTN_ARM_ROOT, e.g. one made by mmdebstrap or debootstrap): Debian's
# /usr/include/python3.X/pyconfig.h includes <aarch64-linux-gnu/python3.X/pyconfig.h>, so the
# root's /usr/include is searched last (-idirafter), after the cross toolchain's own C and
# C++ headers (a _INIT value reaches only a new build tree's cache: tools/ci-arm.sh passes
# the flag as CMAKE_CXX_FLAGS on every configure, so a moved root is followed).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
if(NOT DEFINED FASTATTN_ARM_ROOT)
  set(FASTATTN_ARM_ROOT "$ENV{FASTATTN_ARM_ROOT}")
endif()
# try_compile projects (the OpenMP check) read this file again: pass the root on to them.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES FASTATTN_ARM_ROOT)
if(NOT IS_DIRECTORY "${FASTATTN_ARM_ROOT}/usr/include")
  message(FATAL_ERROR
    "aarch64-linux-gnu.cmake: set -DFASTATTN_ARM_ROOT (or the environment's FASTATTN_ARM_ROOT) "
    "to an arm64 root with python3-dev")
endif()
set(CMAKE_CXX_FLAGS_INIT "-idirafter ${FASTATTN_ARM_ROOT}/usr/include")
# Programs (the host's python and cmake helpers) from the host; libraries and headers from
# the cross toolchain's own tree first (OpenMP's and the C library's), then the root.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu "${FASTATTN_ARM_ROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
