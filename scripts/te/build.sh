#!/usr/bin/env bash
# `make te`: .venv-te, a venv with jax's CUDA 13 plugin and Transformer Engine JAX built from PyPI's sdist (cached),
# plus a libcuda.so.1 stub for machines without a driver. Enough to lower and export for CUDA on a CPU machine.
# Idempotent: a second run checks its stamp and returns in seconds.
#
# One build at a time per venv: a second `make te` started meanwhile says so and waits on the first's lock (flock on
# .venv-te.lock), then finds the venv up to date. The stamp (.venv-te/.te-installed) is removed before a build
# changes anything and written only when the venv imports Transformer Engine, so an interrupted build (Ctrl-C, a
# kill, a full disk) leaves a venv that scripts/te/python.sh refuses and the next `make te` rebuilds; the cached
# wheel and the libcuda stub are written under temporary names and renamed when complete.
#
#   scripts/te/build.sh [--stamp]      (--stamp: print the stamp a finished build writes, build nothing)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/scripts/te"
PINS="$HERE/requirements.txt"
PYTHON="${PYTHON:-python3}"
VENV="${TE_VENV:-$ROOT/.venv-te}"
CACHE="${MAXTEXT_NVFP4_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/maxtext_nvfp4}/wheels"
STUB_DIR="$VENV/lib/libcuda-stub"
LOGS="$VENV/logs"
PHASES=6

trap 'echo "make te: interrupted; the venv is not marked finished (run make te again)" >&2; exit 130' INT
trap 'echo "make te: stopped; the venv is not marked finished (run make te again)" >&2; exit 143' TERM

say() { echo "te: $*"; }
STAMP_ONLY=""
[[ "${1:-}" == --stamp ]] && STAMP_ONLY=1
phase() { [[ -n "$STAMP_ONLY" ]] || say "[$1/$PHASES] $2"; }
fail() { echo "make te: error: $1" >&2; exit "${2:-2}"; }

# One pip call, its output in a log; on failure one line pointing at the log (and at the network when that is it).
pip_logged() {
  local name="$1"; shift
  mkdir -p "$LOGS"
  if ! "$VENV/bin/python" -m pip "$@" >"$LOGS/$name.log" 2>&1; then
    if grep -qiE 'Could not find a version|No matching distribution|connection|resolve host|timed out' "$LOGS/$name.log"; then
      fail "pip could not download what '$name' needs (offline, or a package missing from the index); see $LOGS/$name.log"
    fi
    fail "pip $name failed; see $LOGS/$name.log" 1
  fi
}

# --- 1. this Python, this jax -------------------------------------------------------------------------------------
phase 1 "checking Python and the pinned versions"
TE_CUDA="$(sed -nE 's/^transformer-engine-(cu[0-9]+)==.*/\1/p' "$PINS")"
TE_VERSION="$(sed -nE 's/^transformer-engine-cu[0-9]+==([0-9.]+).*/\1/p' "$PINS")"
[[ -n "$TE_VERSION" ]] || fail "$PINS pins no transformer-engine-cuXX==X" 1
command -v "$PYTHON" >/dev/null || fail "no '$PYTHON' on PATH; run with PYTHON=/path/to/python3.11 make te"
PY_TAG="$("$PYTHON" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
"$PYTHON" -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 13))' \
  || fail "$PYTHON is Python $("$PYTHON" -V 2>&1 | cut -d' ' -f2); Transformer Engine $TE_VERSION needs 3.10-3.13: run PYTHON=python3.11 make te"
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null \
  || fail "$PYTHON cannot create venvs (no venv/ensurepip module); install python3-venv or use another Python via PYTHON=..."
JAX_VERSION="$(sed -nE 's/^jaxlib==([0-9.]+).*/\1/p' "$ROOT/requirements.txt")"
[[ -n "$JAX_VERSION" ]] || fail "requirements.txt pins no jaxlib==X; .venv-te takes its jax version from there" 1
KEY="te-$TE_VERSION-$TE_CUDA-jax-$JAX_VERSION-$PY_TAG"
STAMP_TEXT="$KEY $(cat "$PINS" "$HERE/build.sh" "$HERE/libcuda_stub.c" "$ROOT/requirements.txt" "$ROOT/requirements-dev.txt" | cksum)"
if [[ -n "$STAMP_ONLY" ]]; then
  echo "$STAMP_TEXT"
  exit 0
fi
up_to_date() {
  [[ -f "$VENV/.te-installed" && "$(cat "$VENV/.te-installed")" == "$STAMP_TEXT" ]] \
    && MAXTEXT_TE_BUILDING=1 "$HERE/python.sh" -c 'import jax; jax.devices(); import transformer_engine.jax' \
      >/dev/null 2>&1
}
# The lock: another build of this venv running means wait for it (its pid in the lock file), then look again.
if command -v flock >/dev/null; then
  LOCK="${VENV%/}.lock"
  mkdir -p "$(dirname "$LOCK")"
  exec 9<>"$LOCK"
  if ! flock -n 9; then
    say "another make te (pid $(head -c 20 "$LOCK" | tr -dc 0-9)) is building ${VENV#"$ROOT/"}; waiting for it to finish"
    flock 9
  fi
  echo "$$" >"$LOCK"
else
  say "no flock here: a second make te started meanwhile would build alongside this one"
fi
if up_to_date; then
  say "up to date ($KEY in ${VENV#"$ROOT/"}); nothing to do"
  exit 0
fi
rm -f "$VENV/.te-installed"
WHEEL_DIR="$CACHE/$KEY"
WHEEL="$(ls "$WHEEL_DIR"/transformer_engine_jax-*.whl 2>/dev/null | head -1 || true)"
command -v gcc >/dev/null || fail "no C compiler (gcc) on PATH; install build-essential (apt-get install build-essential)"
[[ -n "$WHEEL" ]] || command -v g++ >/dev/null \
  || fail "no C++ compiler (g++) on PATH to build transformer-engine-jax; install build-essential (apt-get install build-essential)"
# The package index reachable? One small download through pip's own settings (index, proxy), no retries, so an
# offline machine gets one line now instead of pip's retries later.
if "$PYTHON" -m pip --version >/dev/null 2>&1; then
  PROBE="$(mktemp -d "${TMPDIR:-/tmp}/te-probe.XXXXXX")"
  if ! "$PYTHON" -m pip download --no-deps --retries 0 --timeout 20 --dest "$PROBE" \
      "transformer-engine==$TE_VERSION" >"$PROBE/log" 2>&1; then
    why="$(grep -m1 -iE '^error|could not|failed' "$PROBE/log" | cut -c1-160 || true)"
    rm -rf "$PROBE"
    fail "cannot download transformer-engine==$TE_VERSION from the package index (${why:-pip download failed}); check the network, the proxy or PIP_INDEX_URL"
  fi
  rm -rf "$PROBE"
fi

# --- 2. the venv ----------------------------------------------------------------------------------------------------
phase 2 "venv ${VENV#"$ROOT/"} ($("$PYTHON" -V 2>&1))"
if [[ ! -x "$VENV/bin/python" ]] || [[ "$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")' 2>/dev/null)" != "$PY_TAG" ]]; then
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV" || fail "could not create $VENV with $PYTHON" 1
fi
pip_logged pip-upgrade install --upgrade pip

# --- 3. jax with the CUDA plugin, the project's requirements, TE's core library and build dependencies -------------
phase 3 "jax[${TE_CUDA/cu/cuda}]==$JAX_VERSION, requirements.txt (+ -dev: the te tests), scripts/te/requirements.txt (several GB on a first run)"
pip_logged deps install "jax[${TE_CUDA/cu/cuda}]==$JAX_VERSION" -r "$ROOT/requirements.txt" -r "$ROOT/requirements-dev.txt" -r "$PINS"
# The metapackage only marks TE as installed (TE checks it at import); its dependencies would pull the cu12 core.
pip_logged metapackage install --no-deps "transformer-engine==$TE_VERSION"

# --- 4. transformer-engine-jax: PyPI ships an sdist only; build it once per (TE, CUDA, jax, Python) and cache it ----
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [[ -n "$WHEEL" ]]; then
  phase 4 "transformer-engine-jax $TE_VERSION from the cache (${WHEEL#"$HOME/"})"
else
  phase 4 "building transformer-engine-jax $TE_VERSION from its sdist, one compile job (6-8 minutes on 2 cores)"
  CUDA_HOME_DIR="$SITE/nvidia/$TE_CUDA"
  [[ -d "$CUDA_HOME_DIR/include" ]] || fail "$CUDA_HOME_DIR is missing: jax's CUDA plugin did not bring the CUDA headers" 1
  BUILD="$(mktemp -d "${TMPDIR:-/tmp}/te-wheel.XXXXXX")"
  trap 'rm -rf "$BUILD"' EXIT
  NVTE_FRAMEWORK=jax NVTE_BUILD_USE_NVIDIA_WHEELS=1 CUDA_HOME="$CUDA_HOME_DIR" MAX_JOBS=1 \
    pip_logged wheel wheel --no-build-isolation --no-deps --no-binary transformer-engine-jax \
      -w "$BUILD" "transformer-engine-jax==$TE_VERSION"
  mkdir -p "$WHEEL_DIR"
  built="$(ls "$BUILD"/transformer_engine_jax-*.whl)"
  # Into the cache under a temporary name, then renamed: an interrupted build never leaves a partial wheel there.
  cp "$built" "$WHEEL_DIR/.partial-$$" && mv "$WHEEL_DIR/.partial-$$" "$WHEEL_DIR/$(basename "$built")"
  WHEEL="$WHEEL_DIR/$(basename "$built")"
fi
pip_logged install-wheel install --no-deps --force-reinstall "$WHEEL"

# --- 5. the libcuda.so.1 stub (used by scripts/te/python.sh only where no driver loads) ----------------------------
phase 5 "libcuda.so.1 stub for machines without a driver"
mkdir -p "$STUB_DIR"
gcc -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -o "$STUB_DIR/libcuda.so.1.partial" "$HERE/libcuda_stub.c" \
  || fail "gcc could not build $HERE/libcuda_stub.c" 1
mv "$STUB_DIR/libcuda.so.1.partial" "$STUB_DIR/libcuda.so.1"

# --- 6. it imports --------------------------------------------------------------------------------------------------
phase 6 "checking that transformer_engine.jax imports"
# jax first, as te_backend does (it asks jax for GPUs): jax's CUDA plugin loads the NVIDIA libraries from their wheels
# (NCCL among them), which TE's core library links by name.
if ! MAXTEXT_TE_BUILDING=1 "$HERE/python.sh" \
    -c 'import jax; jax.devices(); import transformer_engine.jax, transformer_engine.jax.flax' >"$LOGS/import.log" 2>&1; then
  fail "transformer_engine.jax does not import in ${VENV#"$ROOT/"}; see $LOGS/import.log" 1
fi
echo "$STAMP_TEXT" >"$VENV/.te-installed"
say "ready: ${VENV#"$ROOT/"} (Transformer Engine $TE_VERSION, jax $JAX_VERSION, $PY_TAG); run the te tests with 'make test-te'"
