#!/usr/bin/env bash
# Start an rlvitals run on the Ray cluster this head node leads, as a Ray job. From your machine:
#
#   ray exec deploy/cluster-aws.yaml '~/rlvitals-src/deploy/cluster/submit.sh --num-actors 16 --total-env-steps 5000000'
#
# Every `rlvitals train` flag may be given; --name NAME names the run (default <env>-<date>-<time>).
#   1. The run directory is ~/runs/NAME on the head (--resume DIR continues the run in DIR instead).
#   2. `rlvitals stack up --run-dir` adds it to what Prometheus on the head watches (and starts the
#      stack if it is down), so the learner, every actor and every node sidecar are scraped from
#      their first second.
#   3. `ray job submit --no-wait` of deploy/cluster/job.py, which Ray places on the head (the
#      `learner` resource, and the GPU when there is one); the job scales the workers to the actors
#      and becomes `rlvitals train --mode ray --address auto --metrics-host node --actor-resources actor=1 ...`.
# The job's submission id is NAME: `ray job logs -f NAME`, `ray job status NAME`, `ray job stop NAME`.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
BIN="$REPO/.venv/bin"

name="" env_id="CartPole-v1" resume="" args=()
while (($#)); do
    case $1 in
        --name) name=${2:?--name needs a value}; shift 2 ;;
        --name=*) name=${1#--name=}; shift ;;
        --env) env_id=${2:-}; args+=("$1" "${2:-}"); shift 2 || shift ;;
        --env=*) env_id=${1#--env=}; args+=("$1"); shift ;;
        --resume) resume=${2:-}; args+=("$1" "${2:-}"); shift 2 || shift ;;
        --resume=*) resume=${1#--resume=}; args+=("$1"); shift ;;
        --run-dir|--run-dir=*) echo "submit: the run directory is ~/runs/NAME; give --name NAME instead of --run-dir" >&2
                               exit 2 ;;
        *) args+=("$1"); shift ;;
    esac
done
if [[ -n $resume ]]; then
    run_dir=$(cd "$resume" && pwd)
    name=${name:-$(basename "$run_dir")-$(date +%H%M%S)}
else
    slug=${env_id##*:}
    name=${name:-${slug//\//-}-$(date +%Y%m%d-%H%M%S)}
    run_dir="$HOME/runs/$name"
    if [[ -e $run_dir ]]; then
        echo "submit: $run_dir already exists; choose another --name" >&2
        exit 2
    fi
    args=(--run-dir "$run_dir" "${args[@]}")
fi
if [[ ! $name =~ ^[A-Za-z0-9._-]+$ ]]; then
    echo "submit: --name '$name' is invalid: expected letters, digits, '.', '_' or '-'" >&2
    exit 2
fi

"$BIN/rlvitals" stack up --run-dir "$run_dir"

placement=(--entrypoint-resources '{"learner": 1}')
if nvidia-smi -L >/dev/null 2>&1; then
    placement+=(--entrypoint-num-gpus 1)   # the learner's GPU, visible to the job as CUDA_VISIBLE_DEVICES
fi
"$BIN/ray" job submit --no-wait --submission-id "$name" "${placement[@]}" -- \
    "$BIN/python" "$REPO/deploy/cluster/job.py" "${args[@]}"

cat <<EOF
submit: run $name, archive in $run_dir on the head
  follow it:   ray exec CLUSTER.yaml 'ray job logs -f $name'
  stop it:     ray exec CLUSTER.yaml 'ray job stop $name'
  watch it:    ray attach CLUSTER.yaml -p 3000 -p 9090, then http://localhost:3000 (Grafana), http://localhost:9090 (Prometheus)
EOF
