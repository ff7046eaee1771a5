#!/usr/bin/env bash
# Issue 22's device measurements in one call on the lent GPU machine, everything written under $OUT.
#
#   PART=profile (default, about 8 minutes):
#     1. the learner profile on the GPU (bench/learner_profile.py), float32, then with bfloat16 autocast,
#        cuDNN autotuning and channels-last: $OUT/learner-profile_cuda*.json, chrome traces gzipped;
#     2. ../shared/tools/gpu-pong-profile as the issue's figures were measured (env limit, Ray pipeline
#        ceiling, 136 s of Ray training scraped every 10 s): $OUT/pong-profile/.
#   PART=pong-config (TRAIN_SECONDS, default 540): `rlvitals train --config bench/configs/pong.yaml` (Ray mode),
#     stopped by SIGTERM, for the return curve: $OUT/pong-config/ (summary.json, metrics.jsonl).
#
# Prepare on the CPU machine, from the repo root (the wheels hold this checkout: rebuild after every change):
#     ../shared/tools/gpu-wheels
#     mkdir -p .gpu && cp ../shared/tools/gpu-pong-profile .gpu/      (.gpu/ is git-ignored)
#     DRY_RUN=1 OUT=/tmp/dry bash bench/gpu_pong.sh                    (checks all of the above, no GPU needed)
# Then on the device:  run  command="bash bench/gpu_pong.sh"  carry=[".whl", ".gpu"]  timeout_s=600
set -uo pipefail
R=$(cd "$(dirname "$0")/.." && pwd)
PART=${PART:-profile}
DRY=${DRY_RUN:-0}
SITE=${SITE:-/tmp/site}
: "${OUT:?set OUT to the folder results go to}"
mkdir -p "$OUT"

say() { echo "gpu_pong: $*"; }
fail() { echo "gpu_pong: $*" >&2; exit 2; }
step() {  # a command, printed; in a dry run only printed
    say "+ $*"
    [ "$DRY" = 1 ] || "$@"
}

case "$PART" in profile|pong-config) ;; *) fail "PART=$PART: expected profile or pong-config" ;; esac
# What must have travelled: the wheels (this project's included) and the copied profile script.
for wheel in rlvitals ray gymnasium ale_py; do
    ls "$R"/.whl/"$wheel"-*.whl >/dev/null 2>&1 || fail "no $wheel wheel in $R/.whl: run ../shared/tools/gpu-wheels"
done
[ -f "$R/.gpu/gpu-pong-profile" ] || fail "no $R/.gpu/gpu-pong-profile: mkdir -p .gpu && cp ../shared/tools/gpu-pong-profile .gpu/"
[ -f "$R/bench/configs/pong.yaml" ] || fail "no bench/configs/pong.yaml"

if [ "$DRY" = 1 ]; then
    PYTHON=${PYTHON:-$R/.venv/bin/python}   # the CPU machine: the checkout's own environment
    PROFILE_ARGS=(--shapes cartpole --updates 2 --warmup 0 --collects 1)
else
    PYTHON=python3
    PROFILE_ARGS=(--updates 20 --warmup 3 --collects 3)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$R"/.whl/*.whl || fail "installing the wheels failed"
    export PYTHONPATH="$SITE" PATH="$SITE/bin:$PATH"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
    nproc >> "$OUT/gpu.txt"
fi
export PYTHONUNBUFFERED=1

if [ "$PART" = profile ]; then
    # The learner as it runs by default, then the optional speed-ups, each measured on the same machine.
    "$PYTHON" "$R/bench/learner_profile.py" "${PROFILE_ARGS[@]}" --actor --trace "$OUT/traces" \
        --results-dir "$OUT" --name learner-profile_cuda_fp32 2>&1 | tail -4
    step "$PYTHON" "$R/bench/learner_profile.py" "${PROFILE_ARGS[@]}" --mixed-precision --cudnn-benchmark \
        --channels-last --results-dir "$OUT" --name learner-profile_cuda_bf16
    gzip -f "$OUT"/traces/*.json 2>/dev/null
    step env OUT="$OUT/pong-profile" RUN_DIR=/tmp/pong-profile bash -c \
        "mkdir -p \"\$OUT\" && cd '$R' && bash .gpu/gpu-pong-profile 2>&1 | tail -20"
else
    # SIGTERM ends a run cleanly (final checkpoint, last row, summary.json): training stops at TRAIN_SECONDS.
    mkdir -p "$OUT/pong-config"
    step timeout -s TERM "${TRAIN_SECONDS:-540}" "$PYTHON" -c "import sys; from rlvitals.cli import main; sys.exit(main())" \
        train --config "$R/bench/configs/pong.yaml" --run-dir /tmp/pong-config --no-progress ${TRAIN_ARGS:-}
    step cp /tmp/pong-config/summary.json /tmp/pong-config/metrics.jsonl "$OUT/pong-config/"
fi
say "done: $(ls "$OUT" | tr '\n' ' ')"
