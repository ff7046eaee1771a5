"""`rlvitals report`: real runs, the page opened in a real headless Chromium with the network trapped.

Three real runs start together (two that finish, one killed with SIGKILL part
way); a run that is still being written (its last line cut in half) and a run
that has written nothing yet are made from their files. Chromium loads each
page from file:// with every request sent to a local trap that answers
nothing, so a page that fetched anything (a CDN script, a web font) would show
up there; it must also log nothing to the console, and every plot must hold
drawn data.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest

from rlvitals.report.signals import bands_for, catalogue_bands, signal_of

RLVITALS = str(Path(sys.executable).with_name("rlvitals"))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHORT = ["--env", "CartPole-v1", "--total-env-steps", "4096", "--num-envs", "8", "--rollout-length", "64",
         "--metrics-port", "0"]
BROWSER_SERVICE_HOSTS = {  # Chromium's own background calls (updates, clock, sign-in), not the page's
    "clients2.google.com", "update.googleapis.com", "accounts.google.com", "redirector.gvt1.com",
    "optimizationguide-pa.googleapis.com", "content-autofill.googleapis.com", "android.clients.google.com",
    "safebrowsingohttpgateway.googleapis.com", "edgedl.me.gvt1.com", "www.google.com"}
QUIET_BROWSER = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-default-apps", "--no-pings", "--enable-logging=stderr", "--v=0",
                 "--virtual-time-budget=10000"]


def start(args: list, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([RLVITALS, *map(str, args)], cwd=cwd, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


@dataclass
class Runs:
    root: Path
    a: Path
    b: Path
    crashed: Path
    partial: Path
    empty: Path
    a_stdout: str
    a_stderr: str


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    root = tmp_path_factory.mktemp("report")
    a, b, crashed = root / "A", root / "B", root / "crashed"
    proc_a = start(["train", *SHORT, "--seed", "1", "--run-dir", a], root)  # progress on: the human summary
    proc_b = start(["train", *SHORT, "--seed", "2", "--learning-rate", "0.001", "--progress", "false",
                    "--run-dir", b], root)
    proc_c = start(["train", *SHORT, "--total-env-steps", "50000000", "--seed", "3", "--progress", "false",
                    "--run-dir", crashed], root)
    deadline = time.monotonic() + 240
    rows = crashed / "metrics.jsonl"
    while time.monotonic() < deadline and proc_c.poll() is None:
        if rows.is_file() and len(rows.read_text().splitlines()) >= 2:
            break
        time.sleep(0.2)
    proc_c.send_signal(signal.SIGKILL)  # no handler runs: no summary, no final row
    proc_c.communicate()
    out_a, err_a = proc_a.communicate(timeout=240)
    out_b, err_b = proc_b.communicate(timeout=240)
    assert proc_a.returncode == 0, err_a
    assert proc_b.returncode == 0, err_b
    assert rows.is_file() and rows.read_text().strip(), "the killed run wrote no rows"

    partial = root / "partial"  # a run being written: its last row is half on disk
    shutil.copytree(a, partial)
    (partial / "summary.json").unlink()
    lines = (partial / "metrics.jsonl").read_text().splitlines()
    (partial / "metrics.jsonl").write_text("\n".join(lines[:-1] + [lines[-1][: len(lines[-1]) // 2]]))
    empty = root / "empty"  # what `rlvitals train` has written before its first row
    empty.mkdir()
    for name in ("config.yaml", "meta.json"):
        shutil.copy(a / name, empty / name)
    return Runs(root, a, b, crashed, partial, empty, out_a, err_a)


# ------------------------------------------------------------------ the browser
class Trap:
    """A proxy that answers nothing and remembers every request line sent to it."""

    def __init__(self):
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        self.requests: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            conn.settimeout(2)
            try:
                self.requests.append(conn.recv(300).decode(errors="replace").split("\r\n")[0])
            except OSError:
                self.requests.append("")
            conn.close()

    def page_requests(self) -> list[str]:
        hosts = [(r, re.sub(r"^(CONNECT |\w+ https?://)([^/:\s]+).*$", r"\2", r)) for r in self.requests]
        return [r for r, host in hosts if host not in BROWSER_SERVICE_HOSTS]

    def close(self):
        self.server.close()


@dataclass
class Loaded:
    dom: str
    console: list[str]
    page_requests: list[str]


def open_in_chromium(page: Path, screenshot: Path | None = None) -> Loaded:
    if CHROMIUM is None:
        pytest.skip("Debian's `chromium` is not on PATH: install it (apt-get install chromium; "
                    "bash deploy/setup.sh --test does)")
    trap = Trap()
    flags = [*QUIET_BROWSER, f"--proxy-server=http://127.0.0.1:{trap.port}", "--proxy-bypass-list=<-loopback>"]
    try:
        dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", page.resolve().as_uri()], capture_output=True,
                             text=True, timeout=180)
        if screenshot is not None:
            shot = subprocess.run([CHROMIUM, *flags, "--window-size=1400,2400", f"--screenshot={screenshot}",
                                   page.resolve().as_uri()], capture_output=True, text=True, timeout=180)
            assert shot.returncode == 0, shot.stderr[-2000:]
    finally:
        trap.close()
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    return Loaded(dom.stdout, console, trap.page_requests())


class PlotCensus(HTMLParser):
    """Per plotly div of a dumped DOM: its SVG layers, drawn line paths and markers, and legend texts."""

    def __init__(self):
        super().__init__()
        self.plots: dict[str, dict] = {}
        self.current: str | None = None
        self.depth = 0
        self.in_legend_text = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "div":
            if self.current is None and "js-plotly-plot" in classes:
                self.current, self.depth = a.get("id", f"anon-{len(self.plots)}"), 0
                self.plots[self.current] = {"svg": 0, "lines": 0, "points": 0, "traces": 0, "legend": []}
            if self.current is not None:
                self.depth += 1
        if self.current is None:
            return
        plot = self.plots[self.current]
        if tag == "svg" and "main-svg" in classes:
            plot["svg"] += 1
        if tag == "path" and "js-line" in classes and (a.get("d") or "").startswith("M"):
            plot["lines"] += 1
        if tag == "path" and "point" in classes:
            plot["points"] += 1
        if tag == "g" and "trace" in classes and "scatter" in classes:
            plot["traces"] += 1
        self.in_legend_text = tag == "text" and "legendtext" in classes

    def handle_data(self, data):
        if self.current is not None and self.in_legend_text:
            self.plots[self.current]["legend"].append(data)

    def handle_endtag(self, tag):
        self.in_legend_text = False
        if tag == "div" and self.current is not None:
            self.depth -= 1
            if self.depth == 0:
                self.current = None


def census(dom: str) -> dict[str, dict]:
    parser = PlotCensus()
    parser.feed(dom)
    return parser.plots


def assert_offline_page(html: str) -> None:
    """No tag loads anything from the network: every script and style is inline."""
    loads = re.findall(r"<(?:script|link|img|iframe|source|audio|video)\b[^>]*\b(?:src|href)\s*=\s*['\"]?([^'\" >]+)",
                       html, flags=re.I)
    assert not loads, f"the page loads {loads[:5]}"
    assert not re.search(r"@import|url\(\s*['\"]?https?:", html.split("<script", 1)[0], flags=re.I)
    assert "Plotly.newPlot" in html


def plots_in(html: str) -> int:
    return int(re.search(r"(\d+) plots", html).group(1))


def report(*args) -> tuple[int, str, str]:
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from rlvitals.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["report", *map(str, args)])
    return code, out.getvalue(), err.getvalue()


# ------------------------------------------------------------------ tests
@pytest.mark.slow
def test_report_of_a_run_renders_offline_in_chromium(runs, tmp_path):
    proc = subprocess.run([RLVITALS, "report", runs.a], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    page = runs.a / "report.html"
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"report": str(page), "bytes": page.stat().st_size}
    html = page.read_text()
    assert_offline_page(html)
    for words in ("Episode return", "Relative policy entropy", "KL(behaviour || learner)", "Health verdicts",
                  "Config", "healthy "):
        assert words in html, words
    assert re.search(r"""id=['"]rlvitals_learner_kl_divergence_nats['"]""", html), "the metric reference is on the page"
    assert re.search(r"""href=['"]#rlvitals_learner_kl_divergence_nats['"]""", html), "plots link to it"

    shot = tmp_path / "report.png"
    loaded = open_in_chromium(page, screenshot=shot)
    assert loaded.page_requests == [], f"the page made network requests: {loaded.page_requests}"
    assert loaded.console == [], f"the page logged to the console: {loaded.console}"
    plots = census(loaded.dom)
    assert len([p for p in plots if p.startswith("plot-")]) == plots_in(html) >= 10
    for pid, plot in plots.items():
        assert plot["svg"] >= 1, f"{pid}: plotly drew no SVG"
        assert plot["lines"] + plot["points"] >= 1, f"{pid}: no data drawn"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


@pytest.mark.slow
def test_two_runs_overlaid_with_their_config_differences(runs, tmp_path):
    out = tmp_path / "compare.html"
    code, stdout, stderr = report(runs.a, runs.b, "-o", out)
    assert code == 0 and stderr == "", stderr
    html = out.read_text()
    assert_offline_page(html)
    differs = re.search(r"What differs:</b>(.*?)</p>", html).group(1)
    assert "learning_rate" in differs and "seed" in differs and "run_dir" not in differs
    assert "num_envs" not in differs

    loaded = open_in_chromium(out)
    assert loaded.page_requests == [] and loaded.console == [], (loaded.page_requests, loaded.console)
    plots = {pid: p for pid, p in census(loaded.dom).items() if pid.startswith("plot-")}
    assert len(plots) == plots_in(html)
    for pid, plot in plots.items():
        legend = " ".join(plot["legend"])
        assert "A" in legend and "B" in legend, f"{pid}: both runs must be in the legend: {legend!r}"
        assert plot["traces"] >= 2, f"{pid}: one trace per run at least"


@pytest.mark.slow
def test_crashed_partial_and_empty_runs(runs, tmp_path):
    for run, note in ((runs.crashed, "no summary.json"), (runs.partial, "did not parse"),
                      (runs.empty, "no metrics rows yet")):
        code, stdout, stderr = report(run)
        assert code == 0 and stderr == "", stderr
        html = (run / "report.html").read_text()
        assert note in html, f"{run.name}: the page must say {note!r}"
    assert ">crashed<" in (runs.crashed / "report.html").read_text()

    out = tmp_path / "all.html"
    code, _, stderr = report(runs.crashed, runs.partial, runs.empty, "-o", out)
    assert code == 0, stderr
    loaded = open_in_chromium(out)
    assert loaded.page_requests == [] and loaded.console == [], (loaded.page_requests, loaded.console)
    plots = census(loaded.dom)
    assert plots and all(p["lines"] + p["points"] >= 1 for p in plots.values())
    loaded = open_in_chromium(runs.empty / "report.html")
    assert loaded.console == [] and census(loaded.dom) == {}


@pytest.mark.slow
def test_end_of_run_summary_for_a_person(runs):
    summary = json.loads(runs.a_stdout.strip().splitlines()[-1])  # scripts still read the JSON line
    assert summary == json.loads((runs.a / "summary.json").read_text())
    text = runs.a_stderr[runs.a_stderr.index("rlvitals: run completed"):]
    assert f"{summary['env_steps']:,} env steps" in text
    assert f"{summary['mean_return_last_100']:,.2f}" in text
    assert "verdicts" in text and f"rlvitals report {runs.a}" in text and f"archive     {runs.a}/" in text


@pytest.mark.slow
def test_rule_conditions_and_verdicts_are_drawn(runs, tmp_path):
    """A run whose rows break a health rule's threshold: the page draws when the condition held; a verdicts.json
    beside it is what the verdict table shows, linked to the metric the rule reads."""
    from rlvitals.telemetry.rules import RULES, thresholds
    from rlvitals.telemetry.verdicts import Verdict, write_verdicts

    simple = [r for r in RULES if len(thresholds(r)) == 1 and len(r.condition.keys()) == 1
              and thresholds(r)[0][1] in (">", ">=") and signal_of(thresholds(r)[0][0])]
    rule = min(simple, key=lambda r: r.after_updates)  # one whose warm-up a short run gets past
    key, op, value = thresholds(rule)[0]
    broken = tmp_path / "broken"
    shutil.copytree(runs.a, broken)
    rows = [json.loads(line) for line in (broken / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["updates"] > rule.after_updates
    for i, row in enumerate(rows):
        row[key] = value * 2 + 1
        # One row a second: the evaluator decides on a 1 s grid, and a fast machine wrote these 8 rows in
        # under a second, before its first grid point (CI: no evaluation, no timeline).
        row["wall_seconds"] = i + 0.5
    (broken / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_verdicts(broken / "verdicts.json", [Verdict(rule.name, rule.severity, rule.component, 1.0, 2, "seen")])
    code, _, err = report(broken)
    assert code == 0, err
    html = (broken / "report.html").read_text()
    start = html.index('Plotly.newPlot("health-timeline"')
    assert rule.name in html[start:html.index("</script>", start)], "the rule's condition held and must be drawn"
    table = html[html.index("<h2>Health verdicts</h2>"):html.index("When each rule")]
    assert rule.name in table and f"#{signal_of(key).metric.name}" in table and "update 2" in table
    loaded = open_in_chromium(broken / "report.html")
    assert loaded.console == [] and loaded.page_requests == []
    assert census(loaded.dom)["health-timeline"]["lines"] >= 1


def _tree(path: Path) -> dict[str, int]:
    return {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*"))}


@pytest.mark.parametrize("args, names", [
    (["{tmp}/nowhere"], ["'{tmp}/nowhere'", "does not exist", "run directory"]),
    (["{tmp}/file.txt"], ["'{tmp}/file.txt'", "not a directory"]),
    (["{tmp}/not-a-run"], ["'{tmp}/not-a-run'", "config.yaml", "metrics.jsonl"]),
    (["{tmp}/run", "{tmp}/nowhere"], ["'{tmp}/nowhere'"]),
    (["{tmp}/run", "-o", "{tmp}/no-such-dir/r.html"], ["'{tmp}/no-such-dir/r.html'", "does not exist"]),
    (["{tmp}/run", "-o", "{tmp}/run"], ["'{tmp}/run'", "is a directory"]),
    (["{tmp}"], ["'{tmp}'", "directory of runs", "{tmp}/run"]),
    ([], ["RUN_DIR"]),
], ids=["missing-dir", "a-file", "not-a-run-dir", "one-of-two-missing", "output-dir-missing", "output-is-dir",
        "parent-of-runs", "no-run-dir"])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, names):
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "not-a-run" / "notes.txt").write_text("x")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("env: CartPole-v1\nseed: 0\n")
    before = _tree(tmp_path)
    code, out, err = report(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert code == 2 and out == "", (code, out)
    assert len(err.splitlines()) == 1 and err.startswith("rlvitals: error: "), err
    for name in names:
        assert name.replace("{tmp}", str(tmp_path)) in err, err
    assert _tree(tmp_path) == before, "bad input must leave nothing behind"


@pytest.mark.parametrize("text, bands", [
    ("Healthy: 0.05-0.3. Near 1: too far.", [(0.05, 0.3)]),
    ("Healthy: within [-10, 10], ideally [-3, 3]. Larger: scale rewards.", [(-10, 10), (-3, 3)]),
    ("Healthy: below about 0.3 (small values such as 0.01 are fine). Persistently above 0.4: bad.", [(None, 0.3)]),
    ("so healthy targets read at most about 1 on any env. Well above 1: wrong.", [(None, 1)]),
    ("Healthy: well below 0.5; rising means units are dying.", [(None, 0.5)]),
    ("Stuck near 1: no policy is being learned. Near 0: collapsed.", []),
])
def test_catalogue_bands_are_read_from_what_healthy_sentences_say(text, bands):
    assert catalogue_bands(text) == bands


def test_every_band_drawn_is_stated_in_its_catalogue_entry():
    from rlvitals.telemetry.catalogue import METRICS

    stated = {m.name: catalogue_bands(m.help) for m in METRICS}
    assert any(stated.values()), "the catalogue states no healthy range in numbers any more"
    for name, bands in stated.items():
        help_text = next(m.help for m in METRICS if m.name == name)
        for edge in (e for band in bands for e in band if e is not None):
            assert f"{edge:g}" in help_text, (name, edge)
    assert bands_for("clip_fraction") == stated["rlvitals_learner_clip_fraction_ratio"] or \
        bands_for("clip_fraction"), "the health rules or the catalogue give clip_fraction a band"
    assert bands_for("advantage_std") == [] or signal_of("advantage_std") is None
