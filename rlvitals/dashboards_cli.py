"""`rlvitals dashboards push|generate`: upload the dashboards to a running Grafana, or regenerate them.

`push` talks to Grafana's HTTP API through the grafana-client library: it
creates the folder if it is missing (GET/POST /api/folders) and saves each
dashboard with POST /api/dashboards/db (overwrite, so pushing again updates
them). Credentials come from the environment only: GRAFANA_TOKEN (a service
account token, sent as a Bearer token) or GRAFANA_USER and GRAFANA_PASSWORD
(basic auth). Credentials inside the URL are refused, so they never end up in
shell history or a file in the repository.

Exit codes: 0 pushed; 1 Grafana could not be reached or refused a request
(one line saying why: nothing listening, a host that does not resolve, no
answer within --timeout, an HTTP error); 2 bad input (the URL, the timeout,
missing credentials).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import ssl
import sys
from pathlib import Path
from urllib.parse import urlparse

FOLDER_TITLE = "rlvitals"
FOLDER_UID = "rlvitals"
CREDENTIALS_HELP = ("set GRAFANA_TOKEN to a service account token, or GRAFANA_USER and GRAFANA_PASSWORD, in the "
                    "environment")


class PushError(Exception):
    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def credentials() -> str | tuple[str, str]:
    token = os.environ.get("GRAFANA_TOKEN")
    if token:
        return token
    user, password = os.environ.get("GRAFANA_USER"), os.environ.get("GRAFANA_PASSWORD")
    if user and password:
        return user, password
    raise PushError(f"no Grafana credentials: {CREDENTIALS_HELP}", code=2)


def check_url(url: str | None) -> str:
    if not url:
        raise PushError("--url is required (or GRAFANA_URL in the environment): the base URL of a running Grafana, "
                        "e.g. http://127.0.0.1:3000", code=2)
    try:
        parsed = urlparse(url)
        parsed.port  # noqa: B018  (raises ValueError for a port outside 0-65535)
    except ValueError:  # an unclosed [IPv6] bracket, a port out of range
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise PushError(f"--url={url!r} is invalid: expected http(s)://host[:port][/path]", code=2)
    if parsed.username or parsed.password:
        raise PushError(f"--url must not contain credentials: {CREDENTIALS_HELP}", code=2)
    return url.rstrip("/")


def _causes(exc: BaseException):
    """`exc` and every exception behind it: the HTTP client wraps urllib3's, which wraps the socket's."""
    seen, pending = set(), [exc]
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        reason = getattr(current, "reason", None)
        pending += [a for a in (reason, *getattr(current, "args", ())) if isinstance(a, BaseException)]
        pending += [current.__cause__, current.__context__]


def _unreachable(exc: Exception, url: str, timeout: float) -> str | None:
    """Why nothing answered at `url`, in words, from the socket-level cause; None when it is not that."""
    parsed = urlparse(url)
    where = f"{parsed.hostname}:{parsed.port or (443 if parsed.scheme == 'https' else 80)}"
    for cause in _causes(exc):
        if isinstance(cause, ConnectionRefusedError):
            return f"nothing is listening at {where} (connection refused): is Grafana running?"
        if isinstance(cause, socket.gaierror):
            return f"host {parsed.hostname!r} does not resolve ({_words(cause)}): check --url"
        if isinstance(cause, TimeoutError):
            return f"no answer from {where} within {timeout:g} s (--timeout): is Grafana running there?"
        if isinstance(cause, ssl.SSLError):
            return f"the TLS handshake with {where} failed ({cause.reason or _words(cause)}): check --url's scheme"
    last_os_error = next((c for c in _causes(exc) if isinstance(c, OSError) and c.strerror), None)
    if last_os_error is not None:
        return f"cannot connect to {where} ({last_os_error.strerror})"
    return None


def _words(error: OSError) -> str:
    return error.strerror or str(error.args[0] if error.args else error)


def _explain(exc: Exception, url: str, timeout: float) -> PushError:
    from grafana_client.client import GrafanaException

    unreachable = _unreachable(exc, url, timeout)
    if unreachable is not None:
        return PushError(f"cannot reach Grafana at {url}: {unreachable}")
    if isinstance(exc, GrafanaException) and exc.status_code:
        hint = {401: f"Grafana refused the credentials; {CREDENTIALS_HELP}",
                403: "the credentials lack permission to write dashboards and folders (needs the Editor or Admin role)",
                404: "no Grafana HTTP API there: check --url (and any sub-path Grafana is served under)"}
        return PushError(f"Grafana at {url} answered HTTP {exc.status_code}: {hint.get(exc.status_code, exc.message)}")
    innermost = list(_causes(exc))[-1]  # the outer ones repeat it inside the HTTP library's own wording
    said = " ".join(str(innermost).split())
    return PushError(f"cannot reach Grafana at {url}: {type(innermost).__name__}: "
                     f"{said if len(said) <= 200 else said[:200] + '...'}")


def push(url: str, files: list[Path], folder_title: str = FOLDER_TITLE, folder_uid: str = FOLDER_UID,
         timeout: float = 10.0) -> list[dict]:
    """Upload `files` (dashboard JSON models) into the folder; returns Grafana's answer for each."""
    from grafana_client import GrafanaApi
    from grafana_client.client import GrafanaClientError

    url = check_url(url)
    if not (math.isfinite(timeout) and timeout > 0):
        raise PushError(f"--timeout={timeout!r} is invalid: expected a finite number of seconds > 0", code=2)
    api = GrafanaApi.from_url(url, credential=credentials(), timeout=timeout)
    try:
        api.client.GET("/health")
        try:
            api.folder.get_folder(folder_uid)
        except GrafanaClientError as exc:
            if exc.status_code != 404:
                raise
            api.folder.create_folder(folder_title, uid=folder_uid)
        answers = []
        for path in files:
            dashboard = json.loads(path.read_text())
            dashboard["id"] = None  # matched by uid: created the first time, overwritten after
            answers.append(api.dashboard.update_dashboard({
                "dashboard": dashboard, "folderUid": folder_uid, "overwrite": True,
                "message": "rlvitals dashboards push (generated from the telemetry catalogue)"}))
        return answers
    except PushError:
        raise
    except Exception as exc:  # the client raises its own errors and the HTTP library's
        raise _explain(exc, url, timeout) from None


def add_parser(sub) -> None:
    dashboards = sub.add_parser("dashboards", help="Grafana dashboards: push them to a Grafana, or regenerate them")
    actions = dashboards.add_subparsers(dest="action", required=True)
    p = actions.add_parser("push", help="upload the dashboards to a running Grafana (credentials from the environment)")
    p.add_argument("--url", default=os.environ.get("GRAFANA_URL"),
                   help="base URL of the Grafana, e.g. http://127.0.0.1:3000 (default $GRAFANA_URL); "
                        + CREDENTIALS_HELP)
    p.add_argument("--folder", default=FOLDER_TITLE, help=f"folder title (default {FOLDER_TITLE})")
    p.add_argument("--folder-uid", default=FOLDER_UID, help=f"folder uid (default {FOLDER_UID})")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per HTTP request (default 10)")
    g = actions.add_parser("generate", help="regenerate dashboards/*.json from the telemetry catalogue")
    g.add_argument("--check", action="store_true", help="only check: exit 1 if a committed file is out of date")


def run(args: argparse.Namespace) -> int:
    if args.action == "generate":
        from rlvitals.dashboards.generate import main

        return main(["--check"] if args.check else [])
    from rlvitals.dashboards import dashboard_files

    try:
        files = dashboard_files()
        answers = push(args.url, files, args.folder, args.folder_uid, args.timeout)
    except PushError as exc:
        print(f"rlvitals: error: {exc}", file=sys.stderr)
        return exc.code
    origin = "{0.scheme}://{0.netloc}".format(urlparse(args.url))  # Grafana's answer carries any sub-path
    for path, answer in zip(files, answers, strict=True):
        print(f"rlvitals: pushed {path.name} -> {origin}{answer.get('url', '')} (version {answer.get('version', '?')})")
    return 0
