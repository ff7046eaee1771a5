#!/usr/bin/env bash
# Set up rlvitals in ./.venv from a clean clone.
#   bash deploy/setup.sh          the package and its dependencies
#   bash deploy/setup.sh --test   also the test tools and Debian's prometheus (promtool)
# TORCH_SPEC overrides the torch requirement (default: keep an installed torch >= 2.4,
# else torch==2.13.0; on a GPU machine set e.g. TORCH_SPEC='torch>=2.4' to get a CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
WITH_TESTS=0
[[ "${1:-}" == "--test" ]] && WITH_TESTS=1

PYTHON="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
    "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

if ! .venv/bin/python - <<'PY' 2>/dev/null
import sys, torch
major, minor = (int(x) for x in torch.__version__.split(".")[:2])
sys.exit(0 if (major, minor) >= (2, 4) else 1)
PY
then
    "${PIP[@]}" "${TORCH_SPEC:-torch==2.13.0}"
fi

if [[ $WITH_TESTS == 1 ]]; then
    "${PIP[@]}" -e ".[test]"
    if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
        if [[ $(id -u) == 0 ]]; then
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
        elif command -v sudo >/dev/null 2>&1; then
            sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
        else
            echo "setup: the tests need Prometheus: install Debian's 'prometheus' package (apt-get install prometheus)" >&2
            exit 1
        fi
    fi
else
    "${PIP[@]}" -e .
fi
echo "setup: ready (.venv, rlvitals $(.venv/bin/python -c 'import rlvitals; print(rlvitals.__version__)'))" >&2
