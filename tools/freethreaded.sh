#!/usr/bin/env bash
# fastattn on a free-threaded CPython (PEP 703, no GIL): build one, install fastattn into it
# and run the concurrency and thread tests with the GIL off.
#
#   tools/freethreaded.sh                # everything (root for apt; a CPython build, minutes)
#   tools/freethreaded.sh -- -x -k foo   # anything after "--" goes to pytest
#
# No Debian package ships a free-threaded CPython, so this builds one:
#  1. Debian trixie's python3.13 source package (apt-get source, from a deb-src list kept in
#     FASTATTN_FT_CACHE: the host's own apt configuration is not touched), configured with
#     --disable-gil and installed into the cache (once; about 5 minutes on 2 quiet cores).
#  2. A venv of it with NumPy's cp313t wheel, pytest, hypothesis, threadpoolctl, Cython (the
#     C API's Cython test) and the build tools from PyPI; fastattn built from this checkout
#     into it (a regular, non-editable install, in FASTATTN_FT_BUILD).
#  3. pytest on the concurrency, thread-setting, Dask-free kernel and fast-path tests, run
#     from outside the checkout so that the installed package is the one imported, with
#     PYTHON_GIL unset: the module declares itself free-threading safe, so the GIL stays off
#     (pyproject's filterwarnings=error turns CPython's warning about a module that re-enables
#     it into a failure). Then a check that `import fastattn` leaves the GIL off.
#  The PyPI wheels it needs for cp313t: NumPy's (binary only: an sdist build takes long),
#  and hypothesis 6.155.7 (later releases need a Rust toolchain for 3.13t).
#
# Knobs (environment):
#   FASTATTN_FT_CACHE   where the source and the built CPython live (default
#                       ~/.cache/fastattn-freethreaded)
#   FASTATTN_FT_BUILD   the extension's build tree (default build-ft, ignored by git)
#   FASTATTN_FT_TESTS   test paths (default below)
set -euo pipefail
cd "$(dirname "$0")/.."

pytest_extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --) shift; pytest_extra=("$@"); break ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "tools/freethreaded.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
start=$(date +%s)
cache=${FASTATTN_FT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fastattn-freethreaded}
build=${FASTATTN_FT_BUILD:-build-ft}
tests=${FASTATTN_FT_TESTS:-tests/reliability/test_concurrency.py tests/reliability/test_threads_config.py tests/reliability/test_threads_sharing.py tests/sdpa/test_fast_path.py tests/sdpa/test_fast_call_order.py tests/sdpa/test_semantics.py tests/family tests/varlen tests/grad tests/capi/test_cython.py}
prefix=$cache/py313t
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
prefix=$cache/py313t

# 1. CPython 3.13 with --disable-gil.
if [[ ! -x $prefix/bin/python3.13t ]]; then
  apt_dir=$cache/apt
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/sources.list.d"
  cat > "$apt_dir/sources.list" <<'EOF'
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main
EOF
  apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=$apt_dir/sources.list.d"
            -o "Dir::State::Lists=$apt_dir/lists" -o "APT::Sandbox::User=root")
  echo "+ apt-get source python3.13 (Debian trixie)"
  apt-get "${apt_opts[@]}" update -qq
  src=$cache/src
  rm -rf "$src" && mkdir -p "$src"
  (cd "$src" && apt-get "${apt_opts[@]}" source -qq --download-only python3.13)
  tarball=$(ls "$src"/python3.13_*.orig.tar.xz | head -n 1)
  tar -C "$src" -xf "$tarball"
  tree=$(ls -d "$src"/Python-3.13.* | head -n 1)
  echo "+ configure --disable-gil && make ($(basename "$tree"))"
  (cd "$tree" && ./configure -q --disable-gil --prefix="$prefix" --without-ensurepip > "$cache/configure.log" 2>&1 \
    && make -s -j"$(nproc)" > "$cache/make.log" 2>&1 && make -s install > "$cache/install.log" 2>&1) || {
    tail -n 30 "$cache"/configure.log "$cache"/make.log "$cache"/install.log 2>/dev/null >&2
    exit 1
  }
fi
py=$prefix/bin/python3.13t
"$py" -c 'import sys, sysconfig; assert sysconfig.get_config_var("Py_GIL_DISABLED") == 1; print(sys.version)'

# 2. The venv and fastattn.
venv=$cache/venv
[[ -x $venv/bin/python ]] || "$py" -m venv "$venv"
if ! "$venv/bin/python" -c 'import Cython, numpy, pytest, hypothesis' 2> /dev/null; then
  "$venv/bin/pip" install -q --disable-pip-version-check --only-binary :all: numpy pytest \
    "hypothesis==6.155.7" threadpoolctl "scikit-build-core>=0.10" "pybind11>=2.13" ninja cmake \
    "cython>=3.1"
fi
echo "+ pip install . (free-threaded $("$venv/bin/python" -c 'import sys; print(sys.version.split()[0])'))"
"$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --no-deps . \
  -Cbuild-dir="$build" > "$cache/pip-install.log" 2>&1 || { tail -n 40 "$cache/pip-install.log" >&2; exit 1; }

# 3. The tests, GIL off, from outside the checkout (the installed package is imported).
repo=$(pwd)
paths=()
for t in $tests; do paths+=("$repo/$t"); done
echo "+ pytest ${tests} (GIL off)"
(cd "$cache" && env -u PYTHON_GIL "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  --rootdir="$repo" -c "$repo/pyproject.toml" "${paths[@]}" "${pytest_extra[@]}")
# The module declares itself free-threading safe (py::mod_gil_not_used()): importing it
# must leave the GIL off.
(cd "$cache" && env -u PYTHON_GIL "$venv/bin/python" -c '
import sys
import fastattn
assert not sys._is_gil_enabled(), "import fastattn turned the GIL on"
print("after import fastattn the GIL is off")
')
echo "tools/freethreaded.sh: passed in $(( $(date +%s) - start )) s"
