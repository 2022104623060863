#!/usr/bin/env bash
# .venv-te's python, with the libcuda.so.1 stub on the library path only when no real driver loads (CPU machines).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${TE_VENV:-$ROOT/.venv-te}"
if [[ ! -x "$VENV/bin/python" ]]; then
  echo "error: ${VENV} does not exist; run 'make te' first" >&2
  exit 2
fi
# A venv without the stamp build.sh writes last is one a build didn't finish (interrupted, or still running).
if [[ ! -f "$VENV/.te-installed" && -z "${MAXTEXT_TE_BUILDING:-}" ]]; then
  echo "error: ${VENV} is not finished (a make te was interrupted, or is still running); run 'make te'" >&2
  exit 2
fi
if ! "$VENV/bin/python" -c 'import ctypes; ctypes.CDLL("libcuda.so.1")' >/dev/null 2>&1; then
  export LD_LIBRARY_PATH="$VENV/lib/libcuda-stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # jax's CUDA plugin checks the CUDA libraries' versions through CUPTI, which needs a driver: without one the check
  # fails and the plugin doesn't register, and compiling for a GPU target (compile-only devices) needs it registered.
  export JAX_SKIP_CUDA_CONSTRAINTS_CHECK="${JAX_SKIP_CUDA_CONSTRAINTS_CHECK:-1}"
fi
exec "$VENV/bin/python" "$@"
