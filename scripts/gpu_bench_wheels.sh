#!/usr/bin/env bash
# Wheels of the data stack the trainer imports (grain, array-record, TFDS and their pure-Python dependencies) for a
# GPU host whose image has jax, flax, optax and orbax but neither these packages nor a package index:
#
#   scripts/gpu_bench_wheels.sh [DIR] [PYTHON_VERSION]      (defaults: .whl, 3.12: the jax containers' Python)
#
# Run it where pip reaches the index, take DIR to the GPU host; scripts/gpu_bench.sh installs DIR/*.whl there
# (--no-index) when an import fails (GPU_BENCH_WHEELS=DIR if not .whl). Versions: requirements.txt's pins where it
# has one, the newest release otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.whl} py_version=${2:-3.12}
pinned() { grep -iE "^$1==" requirements.txt || echo "$1"; }
# What grain, array-record and tensorflow-datasets import at run time, beside what the jax images already have.
packages=(
  "$(pinned grain)" "$(pinned array-record)" "$(pinned tensorflow-datasets)" "$(pinned tensorboardX)"
  dm-tree portpicker immutabledict simple_parsing docstring_parser tensorflow-metadata googleapis-common-protos
  termcolor toml
)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
  manylinux2014_x86_64; do
  platforms+=(--platform "$p")
done
mkdir -p "$dir"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$py_version" --implementation cp \
  "${platforms[@]}" -d "$dir" "${packages[@]}"
# promise (a tensorflow-datasets dependency) is published as a source archive only: its wheel is built here.
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
python3 -m pip download --quiet --no-deps --no-binary=:all: -d "$src" promise==2.3
python3 -m pip wheel --quiet --no-deps -w "$dir" "$src"/promise-*.tar.gz
echo "$(ls "$dir"/*.whl | wc -l) wheels in $dir for Python $py_version"
