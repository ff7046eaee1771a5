#!/usr/bin/env bash
# Install rlvitals on one node of a Ray cluster; `ray up` runs it on every node (setup_commands in
# deploy/cluster-*.yaml), from the working copy it synced to ~/rlvitals-src (not ~/rlvitals: from the
# home directory, `python -c 'import rlvitals'` would import that folder instead of the package).
#
#   setup-node.sh               ~/rlvitals-src/.venv by deploy/setup.sh, with the versions pinned in
#                               deploy/cluster/constraints.txt; the CUDA build of torch where
#                               nvidia-smi sees a GPU, the CPU build elsewhere
#   setup-node.sh --venv DIR    use an environment that already holds rlvitals and its dependencies
#                               (the loopback cluster test uses the checkout's own .venv)
#
# Then it puts the venv first on PATH and RAY_AUTH_MODE=token in ~/.bashrc, which Ray sources
# for every command it runs on the node (`ray start`, `ray exec`, `ray attach`). Running it
# again (every `ray up` does) only checks what is there.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
VENV=""
case "${1:-}" in
    --venv) VENV="${2:?--venv needs a directory}" ;;
    "") ;;
    *) echo "setup-node: unknown argument '$1' (expected nothing or --venv DIR)" >&2; exit 2 ;;
esac

if [[ -n $VENV ]]; then
    ln -sfn "$VENV" "$REPO/.venv"
else
    if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then   # Ubuntu ships venv separately
        # (a fresh cloud machine may still be running its own apt upgrades: wait for the lock)
        sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
        sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3-venv >/dev/null
    fi
    if ! nvidia-smi -L >/dev/null 2>&1; then
        # No GPU here: the CPU build of torch (about 200 MB instead of several GB of CUDA libraries).
        export PIP_EXTRA_INDEX_URL="https://download.pytorch.org/whl/cpu"
    fi
    PIP_CONSTRAINT="$REPO/deploy/cluster/constraints.txt" bash "$REPO/deploy/setup.sh"
fi
"$REPO/.venv/bin/python" -c 'import rlvitals, ray' # fail now, not at the first run

LINE="export PATH=\"$REPO/.venv/bin:\$PATH\" RAY_AUTH_MODE=token  # rlvitals: deploy/cluster/setup-node.sh"
touch ~/.bashrc
grep -qxF "$LINE" ~/.bashrc || echo "$LINE" >> ~/.bashrc
echo "setup-node: rlvitals $("$REPO/.venv/bin/python" -c 'import rlvitals; print(rlvitals.__version__)')," \
     "ray $("$REPO/.venv/bin/python" -c 'import ray; print(ray.__version__)') in $REPO/.venv" >&2
