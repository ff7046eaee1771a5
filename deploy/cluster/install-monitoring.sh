#!/usr/bin/env bash
# Install Prometheus and Grafana on the head node (head_setup_commands in deploy/cluster-*.yaml);
# `rlvitals stack up` starts them with this repository's provisioning, on 127.0.0.1 only.
# Debian/Ubuntu: Prometheus from the distribution, Grafana from https://apt.grafana.com. The
# packages' own services are disabled: they would listen on every interface (Prometheus on 9090,
# the port the stack uses).
set -euo pipefail
# DPkg::Lock::Timeout: a fresh cloud machine may still be running its own apt upgrades.
APT=(sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends)
UPDATE=(sudo apt-get -o DPkg::Lock::Timeout=600 update -qq)

if ! command -v prometheus >/dev/null 2>&1; then
    "${UPDATE[@]}"
    "${APT[@]}" prometheus >/dev/null
    sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
fi

if ! command -v grafana >/dev/null 2>&1 && ! command -v grafana-server >/dev/null 2>&1 \
        && [[ ! -x /usr/sbin/grafana ]]; then
    "${UPDATE[@]}"
    "${APT[@]}" gnupg wget ca-certificates >/dev/null
    sudo mkdir -p /etc/apt/keyrings
    wget -q -O - https://apt.grafana.com/gpg.key | gpg --dearmor | sudo tee /etc/apt/keyrings/grafana.gpg >/dev/null
    echo "deb [signed-by=/etc/apt/keyrings/grafana.gpg] https://apt.grafana.com stable main" \
        | sudo tee /etc/apt/sources.list.d/grafana.list >/dev/null
    "${UPDATE[@]}"
    "${APT[@]}" grafana >/dev/null
    sudo systemctl disable --now grafana-server >/dev/null 2>&1 || true
fi
echo "install-monitoring: $(prometheus --version 2>&1 | head -n 1)" >&2
