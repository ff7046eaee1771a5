"""`rlvitals stack up|down|status`: Prometheus and Grafana for watching runs, on loopback.

`up` starts Prometheus with deploy/prometheus (its rules, and a rendered copy of
prometheus.yml that watches the `--run-dir`s' discovery folders), and Grafana
with deploy/grafana's provisioning where Grafana is installed; or both through
`docker compose` (deploy/docker-compose.yml) where Prometheus is not installed
and Docker is (or with --backend docker). `down` stops exactly what `up`
started: the processes (pid and start time) or the compose project recorded in
the state folder, nothing else.

The Grafana admin password is never a default: it comes from
RLVITALS_GRAFANA_PASSWORD (or GF_SECURITY_ADMIN_PASSWORD), or is generated,
printed once and stored nowhere; it reaches Grafana through its environment.

Modules: `render` (the shipped configuration, rendered for this stack),
`supervise` (the state folder, starting and stopping daemons, readiness),
`tools` (which binaries are installed, which backend to use), `native` and
`compose` (the two backends), `cli` (the commands and their parser).
"""

from .cli import add_parser, run
from .common import StackError
from .render import render_prometheus_config, render_provisioning

__all__ = ["StackError", "add_parser", "render_prometheus_config", "render_provisioning", "run"]
