"""`rlvitals train` options as RL users expect them: grouped help with defaults, and boolean switches.

The help is read from the real command's output; parsing goes through the real parser and config
builder; resuming uses a real short run.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from test_cli import cli_env, finish, start
from test_resume_validation import snapshot

from rlvitals.cli import build_parser, main, train_config_from_args
from rlvitals.config import TrainConfig, field_docs, field_types
from rlvitals.train_parser import field_sections, shown_default

BOOLEAN_FIELDS = [name for name, hint in field_types().items() if hint is bool]
TRUE_SPELLINGS = ["true", "True", "yes", "on", "1", "ON"]
FALSE_SPELLINGS = ["false", "False", "no", "off", "0", "NO"]


@functools.cache
def parser():
    return build_parser()  # one for the module: it is rebuilt from the config class's source each time


def parsed(*argv: str) -> TrainConfig:
    return train_config_from_args(parser().parse_args(["train", *map(str, argv)]))


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def test_the_sections_are_the_config_class_section_comments():
    sections = field_sections()
    assert list(sections) == ["run", "environment", "actors", "Ray mode", "PPO with V-trace correction",
                              "network and device", "telemetry and archive"]
    placed = [name for names in sections.values() for name in names]
    assert placed == [f.name for f in dataclasses.fields(TrainConfig)], "every field in exactly one section, in order"
    assert {"env", "atari_episodic_life"} <= set(sections["environment"])
    assert {"sync", "num_actors"} <= set(sections["Ray mode"])
    assert {"hidden_sizes", "device"} <= set(sections["network and device"])


@dataclass
class _Unsectioned:
    before: int = 0
    """A field above every section comment."""
    # --- later ---
    after: int = 1


def test_a_field_outside_every_section_is_refused():
    with pytest.raises(ValueError, match="before stands above every"):
        field_sections(_Unsectioned)


@pytest.fixture(scope="module")
def help_text(tmp_path_factory) -> str:
    """`rlvitals train --help` from the installed command, wide enough that no line wraps inside a help text."""
    result = finish(start(["train", "--help"], tmp_path_factory.mktemp("help"), cli_env(COLUMNS="400")))
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return result.stdout


def _sections_of(help_text: str) -> dict[str, dict[str, str]]:
    """heading -> {first flag of an option: its invocation and help text on one line}."""
    sections: dict[str, dict[str, str]] = {}
    heading, option = None, None
    for line in help_text.splitlines():
        if re.match(r"^\S.*:$", line):
            heading, option = line[:-1], None
            sections[heading] = {}
        elif heading is not None and line.startswith("  -"):
            option = line.split()[0].rstrip(",")
            sections[heading][option] = line.strip()
        elif heading is not None and option is not None and line.strip():
            sections[heading][option] += " " + line.strip()
    return sections


def test_help_groups_every_option_under_its_section_with_docstring_and_default(help_text):
    shown = _sections_of(help_text)
    sections = field_sections()
    assert [h for h in shown if h != "options"] == list(sections), "headings in the config's order"
    docs, defaults = field_docs(), TrainConfig()
    for title, names in sections.items():
        assert list(shown[title]) == [flag(name) for name in names], title
        for name in names:
            text = " ".join(shown[title][flag(name)].split())
            assert docs[name] in text, f"{name}: the docstring is the help"
            assert text.endswith(f"(default: {shown_default(getattr(defaults, name))})"), text
    assert "(default: 64,64)" in shown["network and device"]["--hidden-sizes"]
    assert "(default: false)" in shown["Ray mode"]["--sync"] and "(default: true)" in shown[
        "telemetry and archive"]["--progress"]


def test_help_shows_each_boolean_as_a_switch_pair(help_text):
    shown = {option: text for options in _sections_of(help_text).values() for option, text in options.items()}
    for name in BOOLEAN_FIELDS:
        assert shown[flag(name)].startswith(f"{flag(name)} [BOOL], --no-{flag(name)[2:]} "), shown[flag(name)]


@pytest.mark.parametrize("name", BOOLEAN_FIELDS)
def test_every_boolean_field_is_a_switch_that_still_takes_a_value(name):
    default = getattr(TrainConfig(), name)
    assert getattr(parsed(), name) is default
    assert getattr(parsed(flag(name)), name) is True
    assert getattr(parsed(f"--no-{flag(name)[2:]}"), name) is False
    for spelling in TRUE_SPELLINGS:
        assert getattr(parsed(flag(name), spelling), name) is True, spelling
        assert getattr(parsed(f"{flag(name)}={spelling}"), name) is True, spelling
    for spelling in FALSE_SPELLINGS:
        assert getattr(parsed(flag(name), spelling), name) is False, spelling
    # the last one given wins, as with any repeated option
    assert getattr(parsed(flag(name), f"--no-{flag(name)[2:]}"), name) is False
    assert getattr(parsed(f"--no-{flag(name)[2:]}", flag(name)), name) is True


def test_a_switch_sits_before_another_option_without_taking_its_value():
    cfg = parsed("--sync", "--num-actors", "1", "--no-progress", "--seed", "4")
    assert (cfg.sync, cfg.num_actors, cfg.progress, cfg.seed) == (True, 1, False, 4)


@pytest.mark.parametrize("args, names", [
    (["--no-sync", "true"], ["--no-sync takes no value", "--sync=false"]),
    (["--sync", "maybe"], ["sync='maybe'", "true or false"]),
    (["--no-progress=yes"], ["--no-progress takes no value"]),
], ids=["negative-with-value", "unknown-spelling", "negative-with-equals"])
def test_a_misused_switch_is_one_line_exit_2(tmp_path, capsys, args, names):
    capsys.readouterr()
    code = main(["train", *args, "--run-dir", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out)
    assert len(err.splitlines()) == 1 and err.startswith("rlvitals: error: "), err
    for name in names:
        assert name in err, f"{name!r} missing from {err!r}"
    assert not (tmp_path / "run").exists()


def test_switches_override_the_config_file_both_ways(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("sync: true\nprogress: false\ntensorboard: true\nanneal_lr: no\n")
    cfg = parsed("--config", config)
    assert (cfg.sync, cfg.progress, cfg.tensorboard, cfg.anneal_lr) == (True, False, True, False)
    cfg = parsed("--config", config, "--no-sync", "--progress", "--anneal-lr", "on")
    assert (cfg.sync, cfg.progress, cfg.tensorboard, cfg.anneal_lr) == (False, True, True, True)
    assert parsed("--config", config, "--sync", "false").sync is False


def test_a_config_file_is_read_with_yaml_1_2_scalars(tmp_path):
    """YAML 1.1 reads off/no/on as booleans and 1e-3 as text: `verbosity: off` was refused as 'False', and a
    float written 1e-3 reached the env as the string '1e-3'."""
    config = tmp_path / "run.yaml"
    config.write_text("verbosity: off\nsync: yes\nprogress: off\nlearning_rate: 1e-3\n"
                      "env_kwargs: {g: 1e-3, name: no, on_off: true}\n")
    cfg = parsed("--config", config)
    assert (cfg.verbosity, cfg.sync, cfg.progress, cfg.learning_rate) == ("off", True, False, 0.001)
    assert cfg.env_kwargs == {"g": 0.001, "name": "no", "on_off": True}


@pytest.fixture(scope="module")
def short_run(tmp_path_factory) -> Path:
    """A finished 64-step CartPole run (no sync, progress on), made by the real command."""
    run_dir = tmp_path_factory.mktemp("resume") / "run"
    result = finish(start(["train", "--run-dir", run_dir, "--num-envs", "4", "--rollout-length", "16",
                           "--num-minibatches", "2", "--update-epochs", "1", "--total-env-steps", "64",
                           "--verbosity", "off", "--no-sync", "--progress", "--device", "cpu"],
                          run_dir.parent))
    assert result.returncode == 0, result.stderr
    return run_dir


def test_resume_refuses_a_switch_that_changes_the_run_and_says_what_it_has(short_run, capsys):
    before = snapshot(short_run)
    capsys.readouterr()
    code = main(["train", "--resume", str(short_run), "--total-env-steps", "128", "--sync"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and "sync cannot change when resuming (the run has sync=False" in err, err
    assert snapshot(short_run) == before


@pytest.mark.slow
def test_resume_takes_switches_that_repeat_the_run_or_may_change(short_run):
    """`--no-sync` repeats the run's value, `--no-progress` is a setting a resume may change."""
    result = finish(start(["train", "--resume", short_run, "--total-env-steps", "128", "--no-sync",
                           "--no-progress", "--mode", "local"], short_run.parent))
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load((short_run / "config.yaml").read_text())
    assert (config["sync"], config["progress"], config["total_env_steps"]) == (False, False, 128)


def test_resume_refuses_the_config_file_as_before(short_run, tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("sync: true\n")
    capsys.readouterr()
    code = main(["train", "--resume", str(short_run), "--config", str(tmp_path / "c.yaml")])
    assert code == 2 and "--config cannot be combined with --resume" in capsys.readouterr().err
