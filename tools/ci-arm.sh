#!/usr/bin/env bash
# The ARM (aarch64) job of .ci/run: cross-compile fastattn's C++ core for aarch64 and run the
# kernel, semantics, family, varlen, low-precision, layer and gradient tests under qemu-user,
# on every ARM ISA variant the build has (FASTATTN_ISA): scalar, baseline, neon and
# neon_bf16 (qemu's default CPU, "max", reports FEAT_BF16).
#
#   tools/ci-arm.sh               # the quick profile (CI's default; installs what it needs)
#   tools/ci-arm.sh --full        # the full profile: every test on every ISA
#   tools/ci-arm.sh -- -x -k foo  # anything after "--" goes to every pytest run
#
# Steps:
#  1. Host tools from the host's apt (a Debian or Ubuntu host): qemu-user-static (with
#     binfmt_misc, so that arm64 programs run in a chroot and the tests' subprocesses run
#     too), mmdebstrap and g++-aarch64-linux-gnu. Every network fetch (apt, the Debian
#     mirror, PyPI) is tried three times before the job fails, saying which one failed.
#  2. A Debian arm64 root (the host's release, from the mirror the host's apt uses), made
#     once and kept in FASTATTN_ARM_CACHE: python3, python3-dev (the headers the extension
#     is compiled against) and libgomp1 from Debian, with their dependencies, unpacked by
#     mmdebstrap's "extract" variant on the host (nothing configured: a debootstrap root
#     runs every package's scripts under emulation, 7 to 13 minutes here, the extraction
#     under a minute); numpy, pytest, pytest-xdist, hypothesis, ml_dtypes and threadpoolctl
#     as aarch64 wheels installed by the host's pip (--platform, with the host's pip
#     configuration and CA certificates), because the tests need releases newer than
#     Debian's (hypothesis >= 6.80; ml_dtypes is not packaged) and pip under emulation is
#     slow.
#  3. The extension cross-compiled on the host (tools/aarch64-linux-gnu.cmake) against the
#     root's headers: an emulated build takes over 20 minutes, the cross build a few.
#  4. The tests under emulation, in a chroot of the root (tools/ci_arm_isa.py says which
#     ISA meets which test):
#     quick (default): one pytest run, as `pytest` runs on an ARM machine: every test under
#       the default ISA (neon_bf16 under qemu, the one users with FEAT_BF16 get), and the
#       ISA-parametrised kernel tests (the `isa` and `sdpa_impl` fixtures) under scalar,
#       baseline and neon too, those under FASTATTN_ARM_OTHER_ISA_PATHS only (default
#       tests/sdpa: the SDPA kernels' properties and semantics, the kernels the other paths
#       call too; and for neon tests/lowp/test_storage.py, whose bfloat16 cases check its
#       widening, where it differs from neon_bf16).
#     full: one run per ISA with FASTATTN_ISA set; each keeps its own ISA's case of the
#       ISA-parametrised tests and every other test, so every test meets every ISA once.
#     Both deselect the few tests too slow under emulation (listed below; each runs in
#     every x86 job). Any failure fails the job.
#
# Knobs (environment):
#   FASTATTN_ARM_PROFILE  quick (default) or full (the --quick and --full options)
#   FASTATTN_ARM_CACHE   where the arm64 root lives (default ~/.cache/fastattn-arm)
#   FASTATTN_ARM_BUILD   the cross build tree (default build-arm, ignored by git)
#   FASTATTN_ARM_MIRROR  Debian mirror for mmdebstrap (default: the host's apt mirror)
#   FASTATTN_ARM_ISAS    full profile: the ISAs to test (default: every one the build has)
#   FASTATTN_ARM_TESTS   test paths (default: tests/sdpa tests/family tests/varlen tests/lowp
#                        tests/layer tests/grad)
#   FASTATTN_ARM_OTHER_ISA_PATHS  quick profile: where the other ISAs meet the
#                        ISA-parametrised tests; ISA=path for one ISA only (default:
#                        tests/sdpa neon=tests/lowp/test_storage.py)
set -euo pipefail
cd "$(dirname "$0")/.."

pytest_extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --) shift; pytest_extra=("$@"); break ;;
    --quick) FASTATTN_ARM_PROFILE=quick ;;
    --full) FASTATTN_ARM_PROFILE=full ;;
    -h|--help) sed -n '2,52p' "$0"; exit 0 ;;
    *) echo "tools/ci-arm.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
profile=${FASTATTN_ARM_PROFILE:-quick}
if [[ $profile != quick && $profile != full ]]; then
  echo "tools/ci-arm.sh: FASTATTN_ARM_PROFILE is '$profile', expected quick or full" >&2
  exit 2
fi

if [[ $(id -u) != 0 ]]; then
  echo "tools/ci-arm.sh: needs root (apt-get, binfmt_misc, mount and chroot);" \
    "FASTATTN_CI_ARM=0 skips the ARM job in .ci/run" >&2
  exit 2
fi
if ! command -v apt-get > /dev/null; then
  echo "tools/ci-arm.sh: needs a Debian or Ubuntu host (apt-get) for its tools" >&2
  exit 2
fi

# A network fetch: tried three times, 20 then 40 s apart, before the job fails naming it.
# $1 says what it fetches; the rest is the command.
fetch() {
  local what=$1 try
  shift
  for try in 1 2 3; do
    "$@" && return 0
    if [[ $try != 3 ]]; then
      echo "tools/ci-arm.sh: $what failed (try $try of 3), again in $((20 * try)) s" >&2
      sleep $((20 * try))
    fi
  done
  echo "tools/ci-arm.sh: $what failed 3 times: is the network (or the mirror) reachable?" >&2
  exit 1
}
start=$(date +%s)
cache=${FASTATTN_ARM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fastattn-arm}
build=${FASTATTN_ARM_BUILD:-build-arm}
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
root=$cache/$suite-arm64
mkdir -p "$cache"

# 1. Host tools. binfmt_misc first, so that installing qemu-user-static registers its
# handlers (flag F: the interpreter is opened now, so it also runs inside the chroot).
if [[ ! -e /proc/sys/fs/binfmt_misc/register ]]; then
  mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || {
    echo "tools/ci-arm.sh: cannot mount binfmt_misc (a container without the privilege?):" \
      "arm64 programs cannot run under qemu-user here" >&2
    exit 1
  }
fi
need=()
for pkg in qemu-user-static binfmt-support mmdebstrap g++-aarch64-linux-gnu; do
  # installed, not merely known to dpkg (a removed package keeps its config files, and
  # `dpkg -s` succeeds on it)
  [[ $(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2> /dev/null) == installed ]] ||
    need+=("$pkg")
done
if [[ ${#need[@]} -gt 0 ]]; then
  echo "+ apt-get install ${need[*]}"
  apt_install() {
    apt-get update -q > /dev/null &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" > /dev/null
  }
  fetch "apt-get install ${need[*]}" apt_install "${need[@]}"
fi
if [[ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]]; then
  update-binfmts --enable qemu-aarch64 || true
fi
if [[ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]]; then
  echo "tools/ci-arm.sh: qemu-aarch64 is not registered with binfmt_misc" >&2
  exit 1
fi
tools_done=$(date +%s)

# 2. The arm64 root, remade when its recipe (this list) changes.
# libstdc++6 for the extension; dash and coreutils for the chroot's /bin/sh and env: packages
# that no dependency of python3 pulls in (the extract variant installs no essential ones).
debs=python3,python3-dev,libgomp1,libstdc++6,dash,coreutils
wheels=("numpy>=1.23" "pytest>=7" "hypothesis>=6.80" "ml_dtypes>=0.4" "threadpoolctl>=3.5"
  "pytest-xdist>=3")
recipe="$suite $debs ${wheels[*]}"
if [[ ! -f $root/.fastattn-recipe || $(cat "$root/.fastattn-recipe") != "$recipe" ]]; then
  mirror=${FASTATTN_ARM_MIRROR:-}
  if [[ -z $mirror ]]; then
    # The host's Debian archive: a deb822 URIs: line or a one-line "deb URI suite" entry.
    mirror=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
      grep -E '^(URIs:|deb )' | grep -oE '(https?|file)://[^ ]+' | grep -v security |
      grep -E '/debian/?$' | head -n 1 || true)
  fi
  mirror=${mirror:-http://deb.debian.org/debian}
  echo "+ mmdebstrap --variant=extract --architectures=arm64 --include=$debs $suite $root $mirror"
  make_root() {
    rm -rf "$root"
    mmdebstrap --mode=root --variant=extract --architectures=arm64 --include="$debs" \
      "$suite" "$root" "$mirror" > "$cache/mmdebstrap.log" 2>&1 || {
      tail -n 30 "$cache/mmdebstrap.log" >&2
      return 1
    }
  }
  fetch "mmdebstrap from $mirror" make_root
  # What the unrun package scripts would have made and the job needs.
  ln -sf dash "$root/bin/sh"
  mkdir -p "$root/proc" "$root/dev" "$root/tmp" "$root/root"
  chmod 1777 "$root/tmp"
  pyver=$(cd "$root/usr/include" && ls -d python3.* | head -n 1)
  pytag=${pyver#python}
  echo "+ pip install --platform manylinux_2_28_aarch64 --python-version $pytag ${wheels[*]}"
  fetch "pip install of the aarch64 wheels" python3 -m pip install -q \
    --disable-pip-version-check --only-binary=:all: \
    --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 \
    --platform manylinux2014_aarch64 --python-version "$pytag" --implementation cp \
    --target "$root/usr/local/lib/$pyver/dist-packages" "${wheels[@]}" 2> >(grep -v "^WARNING" >&2)
  echo "$recipe" > "$root/.fastattn-recipe"
fi
pyver=$(cd "$root/usr/include" && ls -d python3.* | head -n 1)
root_done=$(date +%s)

# 3. The cross build (incremental; pybind11's CMake files from a host venv of the job's own).
if [[ ! -x $cache/host-venv/bin/python ]]; then
  python3 -m venv "$cache/host-venv"
fi
fetch "pip install pybind11" "$cache/host-venv/bin/pip" install -q \
  --disable-pip-version-check "pybind11>=2.12" 2> >(grep -v "^WARNING" >&2)
echo "+ cross-compiling the extension for aarch64 in $build (log: $build/build.log)"
# A build tree remembers the root's paths: start over when the root moved or was remade.
if [[ -d $build && $(cat "$build/.arm-root" 2> /dev/null) != "$root $recipe" ]]; then
  rm -rf "$build"
fi
mkdir -p "$build"
echo "$root $recipe" > "$build/.arm-root"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$PWD/tools/aarch64-linux-gnu.cmake" -DFASTATTN_ARM_ROOT="$root" \
  -DCMAKE_CXX_FLAGS="-idirafter $root/usr/include" \
  -DPython_EXECUTABLE="$(command -v python3)" -DPython_INCLUDE_DIR="$root/usr/include/$pyver" \
  -Dpybind11_DIR="$("$cache/host-venv/bin/python" -m pybind11 --cmakedir)" > "$build/build.log"
cmake --build "$build" -j "$(nproc)" >> "$build/build.log" || {
  tail -n 40 "$build/build.log" >&2
  exit 1
}
built=$(date +%s)

# 4. The tests, in a chroot of the root: the package installed into the root's
# site-packages (the tests' subprocesses import it from there too), tests/ beside it.
site=$root/usr/local/lib/$pyver/dist-packages
stage=/opt/fastattn-ci
rm -rf "${root:?}$stage" "${site:?}/fastattn"
mkdir -p "$root$stage"
cp -r tests pyproject.toml tools/ci_arm_isa.py "$root$stage/"
cp -r fastattn "$site/"
find "$root$stage" "$site/fastattn" -name __pycache__ -prune -exec rm -rf {} +
so=$(find "$build" -maxdepth 1 -name '_core*.so' | head -n 1)
pytag=${pyver#python}
cp "$so" "$site/fastattn/_core.cpython-${pytag//./}-aarch64-linux-gnu.so"

cleanup() {
  umount -R "$root/dev" 2> /dev/null || true
  umount "$root/proc" 2> /dev/null || true
}
trap cleanup EXIT
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --make-rslave "$root/dev"
# FASTATTN_ARM_QEMU: tells tests/sdpa/test_arm.py that it runs under qemu (whose QEMU_CPU
# picks the CPU model its subprocesses see). OMP_WAIT_POLICY=passive: OpenMP's idle threads
# sleep instead of spinning. Spinning is emulated instruction by instruction, and the
# pytest-xdist workers' thread teams share two cores: tests/sdpa/test_properties.py on neon
# took 99 s of CPU with the default policy and 56 s passive (one run each, loaded host).
# Results do not depend on it.
in_root() {
  chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
    HYPOTHESIS_PROFILE=ci OMP_WAIT_POLICY=passive FASTATTN_ARM_QEMU=1 "$@"
}
available=$(in_root sh -c "cd $stage && python3 -c \
  'import fastattn; print(*fastattn._core.available_isas())'")
echo "tools/ci-arm.sh: ARM ISAs in this build (under qemu): $available"

# The semantics tests are tests/sdpa/test_semantics.py.
read -r -a tests <<< "${FASTATTN_ARM_TESTS:-tests/sdpa tests/family tests/varlen tests/lowp tests/layer tests/grad}"
existing=()
for t in "${tests[@]}"; do [[ -e $t ]] && existing+=("$t"); done
# Deselected here only, each for its time under emulation (each runs in every x86 job):
deselect=(
  # A 32768-key float32 SDPA in a subprocess (about 137 GFLOP) to read its peak memory:
  # under emulation it runs past the test's 300 s subprocess timeout.
  tests/sdpa/test_semantics.py::test_peak_memory_single_head_32k_keys
)
args=()
for d in "${deselect[@]}"; do args+=(--deselect "$d"); done
# The arguments after "--", quoted for the sh -c below (so that -k "a and b" stays one).
extra=
[[ ${#pytest_extra[@]} -gt 0 ]] && extra=$(printf "%q " "${pytest_extra[@]}")

# One pytest run: $1 names it (its results file), the rest is its environment.
status=0
summary=()
run_tests() {
  local name=$1 t0 t1 rc=0 counts
  shift
  echo "+ $* pytest ${existing[*]} (qemu-aarch64)"
  t0=$(date +%s)
  in_root "$@" sh -c "cd $stage && exec python3 -m pytest -q -p no:cacheprovider \
    -p ci_arm_isa -n $(nproc) --durations=15 --junitxml=results-$name.xml ${existing[*]} \
    ${args[*]} ${extra}" || rc=$?
  t1=$(date +%s)
  counts=$(python3 - "$root$stage/results-$name.xml" <<'PY'
import sys
import xml.etree.ElementTree as ET

try:
    suites = ET.parse(sys.argv[1]).getroot().iter("testsuite")
except (OSError, ET.ParseError):
    print("no results")
    raise SystemExit
n = {k: 0 for k in ("tests", "failures", "errors", "skipped")}
for s in suites:
    for k in n:
        n[k] += int(s.get(k, 0))
passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
print(f"{passed} passed, {n['failures']} failed, {n['errors']} errors, {n['skipped']} skipped")
PY
)
  summary+=("$name: $counts ($((t1 - t0)) s, pytest exit $rc)")
  [[ $rc == 0 ]] || status=1
}

if [[ $profile == full ]]; then
  for isa in ${FASTATTN_ARM_ISAS:-$available}; do
    run_tests "$isa" FASTATTN_ISA="$isa"
  done
else
  # The default ISA is the best available one (the last); the others meet the
  # ISA-parametrised tests under FASTATTN_ARM_OTHER_ISA_PATHS only.
  others=${available% *}
  [[ $others == "$available" ]] && others=
  run_tests quick FASTATTN_ARM_OTHER_ISAS="$others" \
    FASTATTN_ARM_OTHER_ISA_PATHS="${FASTATTN_ARM_OTHER_ISA_PATHS-tests/sdpa neon=tests/lowp/test_storage.py}"
fi
end=$(date +%s)
echo "tools/ci-arm.sh: host tools $((tools_done - start)) s, arm64 root $((root_done - tools_done)) s, cross build $((built - root_done)) s, tests $((end - built)) s"
for line in "${summary[@]}"; do echo "tools/ci-arm.sh: $profile profile, $line"; done
exit $status
