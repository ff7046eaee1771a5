"""`rlvitals dashboards push` against a Grafana that is not there: one line saying why, exit 1, no HTTP-library text.

Real subprocesses of the installed command against real sockets on 127.0.0.1: a port where nothing
listens, a socket that accepts but never answers, and a host name that cannot resolve (.invalid, RFC 6761).
"""

from __future__ import annotations

import socket

import pytest
from test_cli import cli_env, finish, start

from conftest import free_port

LIBRARY_WORDING = ("urllib3", "HTTPConnectionPool", "object at 0x", "Max retries", "Traceback")


@pytest.fixture(scope="module")
def answers(tmp_path_factory) -> dict:
    """{case: (url, result)}, the three commands started together."""
    cwd = tmp_path_factory.mktemp("push")
    env = cli_env(GRAFANA_TOKEN="glsa_test_token")
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        urls = {"refused": f"http://127.0.0.1:{free_port()}",
                "silent": f"http://127.0.0.1:{silent.getsockname()[1]}",
                "unresolvable": "http://grafana.rlvitals-test.invalid:3000"}
        procs = {case: start(["dashboards", "push", "--url", url, "--timeout", "1"], cwd, env)
                 for case, url in urls.items()}
        return {case: (urls[case], finish(proc)) for case, proc in procs.items()}


@pytest.mark.parametrize("case, says", [
    ("refused", "nothing is listening at 127.0.0.1:{port} (connection refused): is Grafana running?"),
    ("silent", "no answer from 127.0.0.1:{port} within 1 s (--timeout)"),
    ("unresolvable", "host 'grafana.rlvitals-test.invalid' does not resolve"),
])
def test_unreachable_grafana_is_one_line_saying_why(answers, case, says):
    url, result = answers[case]
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    expected = says.format(port=url.rsplit(":", 1)[1])
    assert lines[0].startswith(f"rlvitals: error: cannot reach Grafana at {url}: "), lines[0]
    assert expected in lines[0], lines[0]
    for wording in LIBRARY_WORDING:
        assert wording not in lines[0], f"{wording!r} leaked into {lines[0]!r}"
