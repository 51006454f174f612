#!/usr/bin/env bash
# Build fastattn with AddressSanitizer + UndefinedBehaviorSanitizer and run tests against it.
#
#   tools/sanitize.sh                 # the sanitizer subset (every kernel, every ISA here)
#   tools/sanitize.sh --smoke         # a few minutes: one module per kernel family + the fuzz
#   tools/sanitize.sh --all           # the whole test suite
#   tools/sanitize.sh -- tests/sdpa   # anything after "--" goes to pytest as is
#
# Everything lives in its own build directory (default build-asan/, ignored by git): the
# CMake build tree (build-asan/cmake) and a virtual environment (build-asan/venv) with a
# regular (non-editable) install of the instrumented extension, so it never touches a
# development install. Rebuilds are incremental. Knobs (environment):
#   FASTATTN_ASAN_DIR    build directory (default build-asan)
#   CXX                  compiler (g++ or clang++; default g++)
#   PYTHON               interpreter for the venv (default python3)
#   FASTATTN_FUZZ_EXAMPLES  fuzz cases per function (default here: 150)
#
# Why the environment below: the Python interpreter is not instrumented, so the ASan runtime
# must be loaded first (LD_PRELOAD); CPython keeps objects alive until exit on purpose, so
# leak detection is off (tests/reliability/test_leaks.py measures fastattn's own memory instead);
# allocator_may_return_null lets a huge scratch request fail into the library's bad_alloc
# path as in production; every UBSan finding is fatal (-fno-sanitize-recover).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=default
pytest_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --smoke) mode=smoke ;;
    --all) mode=all ;;
    --) shift; pytest_args=("$@"); mode=custom; break ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "tools/sanitize.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

dir=${FASTATTN_ASAN_DIR:-build-asan}
venv="$dir/venv"
cxx=${CXX:-g++}
python=${PYTHON:-python3}
start=$(date +%s)

if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
fi
"$venv/bin/pip" install -q scikit-build-core pybind11 numpy pytest hypothesis threadpoolctl \
  pytest-benchmark matplotlib cython ml_dtypes

# -O2 -g (RelWithDebInfo): optimised like the release build, with line numbers in reports.
san="-fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all"
flags="$san -fno-omit-frame-pointer -D_GLIBCXX_ASSERTIONS"
echo "+ building the sanitized extension in $dir/cmake ($cxx $flags)"
CXX="$cxx" CXXFLAGS="$flags" LDFLAGS="$san" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-1} \
  "$venv/bin/pip" install -q --no-build-isolation --force-reinstall --no-deps . \
  -Cbuild-dir="$dir/cmake" -Ccmake.build-type=RelWithDebInfo
built=$(date +%s)

# The ASan runtime goes first, and libstdc++ with it: python does not link libstdc++, and
# ASan resolves the real __cxa_throw when it starts, so without the preload the first C++
# exception thrown by any extension (pybind11's error translation) aborts in ASan's CHECK.
if "$cxx" --version | grep -qi clang; then
  runtime=$("$cxx" -print-file-name=libclang_rt.asan-x86_64.so)
else
  runtime=$("$cxx" -print-file-name=libasan.so)
fi
cxxlib=$("$cxx" -print-file-name=libstdc++.so)
for lib in "$runtime" "$cxxlib"; do
  if [[ ! -f "$lib" ]]; then
    echo "tools/sanitize.sh: cannot find $lib (the ASan runtime and libstdc++)" >&2
    exit 2
  fi
done

case "$mode" in
  smoke)
    pytest_args=(tests/sdpa/test_semantics.py tests/family/test_masked_softmax.py
                 tests/family/test_additive_attention.py tests/family/test_attention_general.py
                 tests/family/test_nadaraya_watson.py tests/reliability/test_fuzz.py
                 tests/reliability/test_edge_inputs.py tests/capi/test_capi.py
                 tests/varlen/test_varlen.py tests/tile_skipping/test_tile_skipping.py
                 tests/lowp tests/sdpa/test_sinks_alibi.py tests/grad/test_sdpa_backward.py
                 tests/grad/test_varlen_backward.py tests/family/test_gradients.py) ;;
  default)
    pytest_args=(tests/sdpa/test_semantics.py tests/sdpa/test_properties.py
                 tests/sdpa/test_errors.py tests/sdpa/test_exp2.py tests/family tests/layer
                 tests/reliability/test_fuzz.py tests/reliability/test_edge_inputs.py
                 tests/reliability/test_concurrency.py tests/reliability/test_large_index.py
                 tests/capi tests/varlen tests/tile_skipping tests/lowp tests/sdpa/test_sinks_alibi.py
                 tests/grad) ;;
  all)
    pytest_args=(tests) ;;
esac
# Only modules that exist in this checkout (a module may not have been written yet).
existing=()
for a in "${pytest_args[@]}"; do
  if [[ "$a" == tests/* && ! -e "${a%%::*}" ]]; then
    echo "  (skipping $a: not in this checkout)"
  else
    existing+=("$a")
  fi
done

# Reports go to files as well as stderr: pytest captures a test's stderr, and a process
# that the sanitizer ends takes the captured text with it (subprocesses report here too).
reports="$dir/reports"
rm -rf "$reports"
mkdir -p "$reports"
export LD_PRELOAD="$runtime:$cxxlib${LD_PRELOAD:+:$LD_PRELOAD}"
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:abort_on_error=1:log_path=$PWD/$reports/asan:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$PWD/$reports/ubsan:${UBSAN_OPTIONS:-}"
export FASTATTN_FUZZ_EXAMPLES=${FASTATTN_FUZZ_EXAMPLES:-150}
# The venv's pytest script (not `python -m pytest`, which would put the source tree first on
# sys.path): `import fastattn` finds the instrumented install.
echo "+ $venv/bin/pytest ${existing[*]}"
status=0
"$venv/bin/pytest" -q -p no:cacheprovider "${existing[@]}" || status=$?
end=$(date +%s)
# Only findings fail the run (ASan also logs warnings, e.g. about swapcontext).
if compgen -G "$reports/*" > /dev/null; then
  if grep -l -E "ERROR: |runtime error:|SUMMARY: " "$reports"/* > /dev/null; then
    echo "tools/sanitize.sh: sanitizer findings:" >&2
    cat "$reports"/* >&2
    status=1
  else
    echo "tools/sanitize.sh: sanitizer notes (not findings):" >&2
    cat "$reports"/* >&2
  fi
fi
echo "tools/sanitize.sh: build $((built - start)) s, tests $((end - built)) s, exit $status"
exit $status
