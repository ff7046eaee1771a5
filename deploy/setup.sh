#!/usr/bin/env bash
# Set up rlvitals in ./.venv from a clean clone.
#   bash deploy/setup.sh          the package and its dependencies
#   bash deploy/setup.sh --test   also the test tools, Debian's prometheus (promtool) and chromium (the report's browser tests)
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
    if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1 \
            || ! command -v chromium >/dev/null 2>&1; then
        if [[ $(id -u) == 0 ]]; then
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus chromium >/dev/null
        elif command -v sudo >/dev/null 2>&1; then
            sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus chromium >/dev/null
        else
            echo "setup: the tests need Prometheus and Chromium: install Debian's packages (apt-get install prometheus chromium)" >&2
            exit 1
        fi
    fi
    # The loopback `ray up` test (tests/test_cluster.py) runs its own sshd, in namespaces of its own,
    # and needs ssh and rsync. The package's ssh service is not started, nor enabled for later boots.
    if [[ ! -x /usr/sbin/sshd ]] || ! command -v ssh >/dev/null 2>&1 || ! command -v rsync >/dev/null 2>&1; then
        HAD_SSHD=$([[ -x /usr/sbin/sshd ]] && echo 1 || true)
        AS_ROOT=()
        if [[ $(id -u) != 0 ]]; then
            command -v sudo >/dev/null 2>&1 || { echo "setup: the tests need sshd and rsync:" \
                "apt-get install openssh-server rsync" >&2; exit 1; }
            AS_ROOT=(sudo)
        fi
        NO_START=/usr/sbin/policy-rc.d   # Debian's switch: while it exits 101, packages start no service
        [[ -e $NO_START ]] || { printf '#!/bin/sh\nexit 101\n' | "${AS_ROOT[@]}" tee $NO_START >/dev/null \
            && "${AS_ROOT[@]}" chmod +x $NO_START && CREATED_NO_START=1; }
        status=0
        "${AS_ROOT[@]}" apt-get update -qq && "${AS_ROOT[@]}" env DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq --no-install-recommends openssh-server openssh-client rsync >/dev/null || status=$?
        [[ -z ${CREATED_NO_START:-} ]] || "${AS_ROOT[@]}" rm -f $NO_START
        if [[ -z $HAD_SSHD && -d /run/systemd/system ]]; then
            "${AS_ROOT[@]}" systemctl disable --now ssh.service ssh.socket >/dev/null 2>&1 || true
        fi
        [[ $status == 0 ]] || exit $status
    fi
else
    "${PIP[@]}" -e .
fi
echo "setup: ready (.venv, rlvitals $(.venv/bin/python -c 'import rlvitals; print(rlvitals.__version__)'))" >&2
