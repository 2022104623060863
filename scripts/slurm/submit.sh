#!/usr/bin/env bash
# Submit a training job to a GB200 / GB300 NVL72 Slurm cluster (pyxis/enroot containers).
#
#   scripts/slurm/submit.sh --gpu gb200|gb300 --nodes N --model CONFIG --quantization MODE \
#       [--image IMAGE] [--partition P] [--account A] [--time HH:MM:SS] [--job-name NAME] \
#       [--output-dir DIR] [--nsys] [--dry-run] [-- key=value ...]
#
# One task per node (hardware=gpu), 4 GPUs per node; the trainer forms the job from
# JAX_COORDINATOR_IP/PORT, NNODES and NODE_RANK (set in train.sbatch). dcn_data_parallelism=-1 makes
# the nodes beyond the config's dcn_* product data-parallel replicas. --nsys runs every task under
# nsys profile for the trainer's profiled steps (skip_first_n_steps_for_profiler, profiler_steps),
# reports in OUTPUT_DIR/nsys/. --dry-run prints the exact sbatch command line and the environment the
# job runs with, and submits nothing.
#
# Paths: --model and --output-dir are read against the directory submit.sh is started in. The job runs in the
# image's copy of this repository (/opt/maxtext-nvfp4): a config inside this repository is passed to it by its
# path in the repository, one outside it is mounted into the job (its directory, at the same path); OUTPUT_DIR
# is mounted at the same path. Paths in key=value overrides are read in the job, against the image's
# repository (and checked here against this one): give data outside it as absolute paths on a shared filesystem.
#
# Checked before anything is written or submitted, also on a login node without jax: the options (a path
# sbatch's --export or pyxis's --container-mounts would split at a ',' or ':' is refused), the job name (it names
# the run directory), that OUTPUT_DIR can be made and that sbatch is here, and, where python3 has pyyaml, the
# config with the trainer's own rules (keys, values, recipe) and its mesh against the job (dcn_* product vs
# --nodes, ici_* vs 4 GPUs); without pyyaml the recipe name alone. The run directory is made just before sbatch,
# and removed again (when it was new and is still empty) if sbatch refuses the job.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
GPU="" NODES="" MODEL="" QUANT="" DRY_RUN=0 NSYS=""
IMAGE="${MAXTEXT_IMAGE:-ghcr.io/nvidia/jax:maxtext-nvfp4}"
PARTITION="${SLURM_PARTITION:-}" ACCOUNT="${SLURM_ACCOUNT:-}" TIME="01:00:00" JOB_NAME="" OUTPUT_DIR="${PWD}/outputs"
GPUS_PER_NODE=4
MAX_NODES=65536  # 262144 GPUs: past any Slurm cluster (a larger --nodes is a typo, and overflows shell arithmetic)

REPO="$(cd "${HERE}/../.." && pwd -P)"

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
die() { echo "error: $*" >&2; exit 2; }
warn() { echo "warning: $*" >&2; }
# A path against the directory this script was started in (no symlinks, '..' folded), whether or not it exists yet.
absolute() { realpath -m -- "$1" 2>/dev/null || case "$1" in /*) echo "$1" ;; *) echo "${PWD}/$1" ;; esac; }
# A value sbatch or pyxis would split or expand: sbatch's --export and pyxis's --container-mounts are comma-separated
# lists, a mount is src:dst, and sbatch's --output reads '%' as a file-name pattern.
refuse_chars() {
  local what="$1" value="$2" c why; shift 2
  for c in "$@"; do
    case "$c" in
      ,) why="sbatch's --export and pyxis's --container-mounts split at" ;;
      :) why="pyxis's --container-mounts reads as src:dst at" ;;
      %) why="sbatch reads as a file-name pattern (%j) at" ;;
    esac
    [[ "$value" != *"$c"* ]] || die "${what} ${value} holds '${c}', which ${why}; use a path without it"
  done
}
need_value() { [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || die "$1 needs a value (see --help)"; }
# The trainer's own checks (python -m MaxText.config --check needs pyyaml, not jax): exit 2 is the user's
# mistake, anything else means this python3 can't run them.
validate_config() {
  local out rc=0
  command -v python3 >/dev/null 2>&1 || { warn "no python3 here: config, recipe and node count not checked"; return 0; }
  # From the repository, as the job reads relative override paths from the image's copy of it.
  out=$(cd "${REPO}" && python3 -m MaxText.config --check --nodes "$NODES" --gpus-per-node "$GPUS_PER_NODE" \
        "$MODEL_ABS" "$@" 2>&1) || rc=$?
  [[ $rc == 0 ]] && return 0
  [[ $rc == 2 ]] && die "${out##*error: }"
  warn "config and node count not checked here (python3 can't load MaxText.config: ${out##*$'\n'};" \
    "pip install pyyaml)"
  validate_recipe
}
# The recipe name alone, from MaxText/quantization/recipes.py (plain Python: the package loads JAX only when its
# numerics are used) when the config can't be loaded.
validate_recipe() {
  local names
  names=$(cd "${REPO}" && python3 -c 'from MaxText.quantization.recipes import recipe_names; print(*recipe_names())' \
          2>/dev/null) || return 0
  [[ -z "$QUANT" || " ${names} " == *" ${QUANT} "* ]] || die "--quantization ${QUANT} is not a recipe; valid: ${names}"
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --gpu) need_value "$@"; GPU="$2"; shift 2 ;;
    --nodes) need_value "$@"; NODES="$2"; shift 2 ;;
    --model) need_value "$@"; MODEL="$2"; shift 2 ;;
    --quantization) need_value "$@"; QUANT="$2"; shift 2 ;;
    --image) need_value "$@"; IMAGE="$2"; shift 2 ;;
    --partition) need_value "$@"; PARTITION="$2"; shift 2 ;;
    --account) need_value "$@"; ACCOUNT="$2"; shift 2 ;;
    --time) need_value "$@"; TIME="$2"; shift 2 ;;
    --job-name) need_value "$@"; JOB_NAME="$2"; shift 2 ;;
    --output-dir) need_value "$@"; OUTPUT_DIR="$2"; shift 2 ;;
    --nsys) NSYS=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
EXTRA=("$@")

[[ "$GPU" == gb200 || "$GPU" == gb300 ]] || die "--gpu must be gb200 or gb300, got '${GPU}'"
[[ "$NODES" =~ ^[1-9][0-9]*$ ]] || die "--nodes must be a positive integer, got '${NODES}'"
[[ ${#NODES} -le ${#MAX_NODES} ]] && (( NODES <= MAX_NODES )) ||
  die "--nodes ${NODES} is more than the ${MAX_NODES} nodes a job here may have ($((MAX_NODES * GPUS_PER_NODE)) GPUs)"
[[ -n "$MODEL" ]] || die "--model CONFIG is required (e.g. configs/${GPU}/llama3_8b_nvfp4.yml)"
[[ -f "$MODEL" ]] || die "--model ${MODEL}: no such file"
MODEL_ABS="$(absolute "$MODEL")" OUTPUT_DIR="$(absolute "$OUTPUT_DIR")"
# The config as the job sees it: its path in the repository (the image holds the same tree at its workdir), or,
# outside the repository, its absolute path with its directory mounted into the job.
CONFIG_MOUNT=""
if [[ "$MODEL_ABS" == "${REPO}/"* ]]; then
  JOB_MODEL="${MODEL_ABS#"${REPO}/"}"
else
  JOB_MODEL="$MODEL_ABS" CONFIG_MOUNT="$(dirname "$MODEL_ABS")"
fi
refuse_chars "--output-dir" "$OUTPUT_DIR" , : %
[[ -z "$CONFIG_MOUNT" ]] || refuse_chars "--model's directory" "$CONFIG_MOUNT" , :
refuse_chars "--image" "$IMAGE" ,
refuse_chars "this repository's path" "$REPO" ,
[[ -n "$QUANT" ]] || die "--quantization is required (bf16, te_fp8_currentscaling, te_nvfp4, te_nvfp4_no_rht, ...)"
[[ "$QUANT" == bf16 ]] && QUANT=""
[[ "$TIME" =~ ^([0-9]+-)?[0-9]+(:[0-9]{1,2}){0,2}$ ]] ||
  die "--time '${TIME}' is not a Slurm time limit (e.g. 01:00:00, 90, 2-00:00:00)"
JOB_NAME="${JOB_NAME:-maxtext-$(basename "${MODEL%.yml}")-${QUANT:-bf16}-${NODES}n}"
[[ "$JOB_NAME" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ && ${#JOB_NAME} -le 128 ]] || die "job name '${JOB_NAME}' must be \
letters, digits, '.', '_' and '-' (at most 128): it names the run directory under ${OUTPUT_DIR}; set --job-name"
RUN_NAME="${JOB_NAME}"
validate_config "quantization=${QUANT}" "gpu_type=${GPU}" "run_name=${RUN_NAME}" "dcn_data_parallelism=-1" \
  "${EXTRA[@]}"

SBATCH=(sbatch --job-name="${JOB_NAME}" --nodes="${NODES}" --ntasks-per-node=1 --gpus-per-node="${GPUS_PER_NODE}"
        --exclusive --time="${TIME}" --output="${OUTPUT_DIR}/${RUN_NAME}/slurm-%j.out")
[[ -n "$PARTITION" ]] && SBATCH+=(--partition="${PARTITION}")
[[ -n "$ACCOUNT" ]] && SBATCH+=(--account="${ACCOUNT}")
# The environment the job sees: train.sbatch derives XLA_FLAGS etc. from these.
EXPORTS="ALL,MAXTEXT_IMAGE=${IMAGE},MAXTEXT_OUTPUT_DIR=${OUTPUT_DIR},MAXTEXT_GPU=${GPU},GPUS_PER_NODE=${GPUS_PER_NODE}"
EXPORTS+=",MAXTEXT_REPO=${REPO},MAXTEXT_NSYS=${NSYS},MAXTEXT_CONFIG_MOUNT=${CONFIG_MOUNT}"
SBATCH+=(--export="${EXPORTS}" "${HERE}/train.sbatch" "${JOB_MODEL}" "quantization=${QUANT}" "gpu_type=${GPU}"
         "run_name=${RUN_NAME}" "dcn_data_parallelism=-1" "${EXTRA[@]}")

if [[ "$DRY_RUN" == 1 ]]; then
  echo "# sbatch command:"
  printf '%q ' "${SBATCH[@]}"; echo
  echo "# job environment and srun command (train.sbatch --print-only):"
  SLURM_JOB_NUM_NODES="${NODES}" SLURM_JOB_NODELIST="node[0001-$(printf '%04d' "${NODES}")]" \
    MAXTEXT_IMAGE="${IMAGE}" MAXTEXT_OUTPUT_DIR="${OUTPUT_DIR}" MAXTEXT_GPU="${GPU}" GPUS_PER_NODE="${GPUS_PER_NODE}" \
    MAXTEXT_REPO="${REPO}" MAXTEXT_NSYS="${NSYS}" MAXTEXT_CONFIG_MOUNT="${CONFIG_MOUNT}" MAXTEXT_PRINT_ONLY=1 \
    bash "${HERE}/train.sbatch" "${JOB_MODEL}" "quantization=${QUANT}" "gpu_type=${GPU}" \
    "run_name=${RUN_NAME}" "dcn_data_parallelism=-1" "${EXTRA[@]}"
  exit 0
fi
command -v sbatch >/dev/null 2>&1 ||
  die "sbatch is not on PATH: submit from a Slurm login node (or add --dry-run to see the job); nothing was written"
# OUTPUT_DIR must be makeable here (and the job's nodes mount it at the same path): its nearest existing ancestor a
# writable directory.
EXISTING="${OUTPUT_DIR}"
while [[ ! -e "$EXISTING" ]]; do EXISTING="$(dirname "$EXISTING")"; done
[[ -d "$EXISTING" && -w "$EXISTING" && -x "$EXISTING" ]] ||
  die "--output-dir ${OUTPUT_DIR} can't be made: ${EXISTING} is not a writable directory; give another --output-dir"
# The run directory (sbatch writes the job's log there), made now; what this made is removed if sbatch refuses.
MADE=()
for dir in "${OUTPUT_DIR}/${RUN_NAME}" ${NSYS:+"${OUTPUT_DIR}/nsys"}; do
  top="$dir"
  while [[ ! -e "$(dirname "$top")" ]]; do top="$(dirname "$top")"; done
  [[ -e "$dir" ]] || MADE+=("$top")
  mkdir -p "$dir" || die "can't make ${dir}; give another --output-dir"
done
if ! SUBMITTED="$("${SBATCH[@]}" 2>&1)"; then
  for top in "${MADE[@]}"; do
    find "$top" -depth -type d -empty -delete 2>/dev/null || true
  done
  WHY="$(grep -v '^[[:space:]]*$' <<<"${SUBMITTED}" | tail -n 1)"
  die "sbatch refused the job (${WHY:-no message}); nothing was submitted"
fi
echo "${SUBMITTED}"
