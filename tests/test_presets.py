"""Presets per env family: `train --preset`, its place among the config layers, `rlvitals presets`, the family hint.

The layers go through the real parser and config builder; the listing, the bad name, the hint and the runs go
through the installed command as subprocesses, started together and awaited together (tests/test_cli.py).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import shutil
from pathlib import Path

import gymnasium as gym
import pytest
import yaml
from test_cli import cli_env, finish, start

from rlvitals.cli import build_parser, train_config_from_args
from rlvitals.config import ConfigError, TrainConfig, build_config, coerce, load_yaml
from rlvitals.presets import PRESETS, SOURCES, family_hint, family_preset, show
from rlvitals.presets import docs as preset_docs
from rlvitals.presets.model import CITATION

ROOT = Path(__file__).resolve().parent.parent
NAMES = list(PRESETS)


def parsed(*argv: str) -> TrainConfig:
    return train_config_from_args(build_parser().parse_args(["train", *map(str, argv)]))


# ------------------------------------------------------------------------------------------------- the data
@pytest.mark.parametrize("name", NAMES)
def test_every_preset_is_a_valid_config_whose_every_value_cites_a_known_source(name):
    preset = PRESETS[name]
    fields = [f.name for f in dataclasses.fields(TrainConfig)]
    assert list(preset.settings) == [f for f in fields if f in preset.settings], "in TrainConfig's order"
    for field, setting in preset.settings.items():
        assert CITATION.findall(setting.source), f"{name}.{field}: no [source]"
        assert set(CITATION.findall(setting.source)) <= set(SOURCES), f"{name}.{field}: {setting.source}"
    cfg = build_config(None, {"preset": name})
    assert cfg.preset == name
    for field, setting in preset.settings.items():
        assert getattr(cfg, field) == coerce(field, setting.value), field
    assert not {"mode", "run_dir", "verbosity", "metrics_port", "address"} & set(preset.settings), "never where it runs"


def test_the_classic_preset_is_the_defaults():
    defaults = TrainConfig()
    assert {f: coerce(f, s.value) for f, s in PRESETS["classic"].settings.items()} == \
        {f: getattr(defaults, f) for f in PRESETS["classic"].settings}


def test_the_atari_preset_is_pong_yaml_less_its_ray_mode_and_pongs_threshold():
    pong = load_yaml(ROOT / "bench" / "configs" / "pong.yaml")
    atari = PRESETS["atari"].values()
    assert {f: coerce(f, v) for f, v in atari.items()} == {f: coerce(f, pong[f]) for f in atari}
    left_out = set(pong) - set(atari)
    assert left_out == {"mode", "return_threshold", "rollouts_in_flight", "vtrace_rho_clip", "vtrace_c_clip"}
    defaults = TrainConfig()
    assert all(coerce(f, pong[f]) == getattr(defaults, f) for f in left_out - {"mode", "return_threshold"}), \
        "the Ray-mode values left out are the defaults anyway"


def test_the_mujoco_preset_is_the_benchs_cleanrl_mujoco_settings():
    tree = ast.parse((ROOT / "bench" / "diagnosis.py").read_text())
    bench = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "CLEANRL_MUJOCO" for t in node.targets))
    mujoco = PRESETS["mujoco"].values()
    assert {f: mujoco[f] for f in bench} == bench


# ----------------------------------------------------------------------------------------------- the layers
def test_flags_beat_the_config_file_which_beats_the_preset_which_beats_the_defaults(tmp_path):
    config = tmp_path / "my.yaml"
    config.write_text("learning_rate: 1.0e-3\nupdate_epochs: 5\n")
    cfg = parsed("--preset", "mujoco", "--config", config, "--update-epochs", 7)
    assert cfg.update_epochs == 7, "flag over file over preset"
    assert cfg.learning_rate == 1e-3, "file over preset"
    assert (cfg.num_minibatches, cfg.rollout_length, cfg.normalize_rewards) == (32, 2048, True), "preset over defaults"
    assert cfg.torch_threads == TrainConfig().torch_threads, "what no layer sets keeps its default"
    assert cfg.preset == "mujoco"


def test_the_config_files_preset_applies_under_it_and_a_flag_chooses_another(tmp_path):
    config = tmp_path / "my.yaml"
    config.write_text("preset: box2d\ngamma: 0.98\n")
    from_file = parsed("--config", config)
    assert (from_file.preset, from_file.num_minibatches, from_file.gamma) == ("box2d", 256, 0.98)
    flagged = parsed("--config", config, "--preset", "mujoco")
    assert (flagged.preset, flagged.num_minibatches, flagged.gamma) == ("mujoco", 32, 0.98)


def test_what_presets_name_shows_is_a_config_file_of_the_same_settings(tmp_path):
    for name in NAMES:
        saved = tmp_path / f"{name}.yaml"
        saved.write_text(show(name))
        assert build_config(str(saved)) == build_config(None, {"preset": name}), name
        text = show(name)
        for field, setting in PRESETS[name].settings.items():
            line = next(line for line in text.splitlines() if line.startswith(f"{field}: "))
            assert line.endswith(f"# {setting.source}"), line
        assert all(f"[{key}] {SOURCES[key]}" in text for key in PRESETS[name].cited())


@pytest.mark.parametrize("given", ["nope", "MuJoCo", "classic,mujoco"])
def test_a_bad_preset_in_a_config_or_the_api_is_named_with_the_accepted_ones(tmp_path, given):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump({"preset": given}))
    for attempt in (lambda: build_config(str(config)), lambda: build_config(None, {"preset": given})):
        with pytest.raises(ConfigError) as raised:
            attempt()
        assert f"preset={given!r} is invalid" in str(raised.value) and ", ".join(NAMES) in str(raised.value)


def test_the_generated_page_is_current():
    assert preset_docs.main(["--check"]) == 0, "docs/presets.md is stale: run python -m rlvitals.presets"


# ------------------------------------------------------------------------------------------------ the family
@pytest.mark.parametrize("env, family", [("HalfCheetah-v5", "mujoco"), ("Hopper-v5", "mujoco"),
                                         ("LunarLander-v3", "box2d"), ("ALE/Pong-v5", "atari"),
                                         ("CartPole-v1", "classic"), ("Acrobot-v1", "classic")])
def test_the_family_is_read_from_the_registered_spec(env, family):
    # gymnasium registers its MuJoCo and Box2D specs whether or not mujoco or Box2D is installed: no env is built
    assert family_preset(env).name == family


def test_an_env_of_no_known_family_has_none_and_neither_has_a_classic_one():
    gym.register("PresetTest/Mine-v0", entry_point="tiny_envs:Corridor")  # the user's own module
    try:
        assert family_preset("PresetTest/Mine-v0") is None
    finally:
        gym.registry.pop("PresetTest/Mine-v0")
    assert family_preset("rlvitals/Probe3-v0") is None
    assert family_preset("NotAnEnv-v9") is None
    assert family_hint("CartPole-v1") is None and family_hint("Pendulum-v1") is None
    hint = family_hint("Walker2d-v5")
    assert hint.startswith("Walker2d-v5 is a MuJoCo env: `--preset mujoco` has settings published for MuJoCo envs")
    assert "\n" not in hint and "classic-control defaults" in hint


# -------------------------------------------------------------------------------- the command, end to end
def _mujoco_installed() -> bool:
    try:
        import mujoco  # noqa: F401
    except ImportError:
        return False
    return True


def test_the_command_lists_shows_refuses_and_trains(tmp_path):
    """One table of subprocesses: the listing, a shown preset, two bad names, three short runs."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    runs = tmp_path / "runs"
    quiet = ["--verbosity", "off", "--progress", "false", "--total-env-steps", 4096]
    jobs = {
        "listing": ["presets"],
        "shown": ["presets", "atari"],
        "bad_show": ["presets", "nope"],
        "bad_train": ["train", "--preset", "nope", "--run-dir", runs / "bad"],
        "classic": ["train", "--preset", "classic", "--run-dir", runs / "classic", *quiet],
        "cartpole": ["train", "--env", "CartPole-v1", "--run-dir", runs / "cartpole", *quiet],
    }
    if _mujoco_installed():
        jobs["cheetah"] = ["train", "--env", "HalfCheetah-v5", "--run-dir", runs / "cheetah", *quiet]
    # the bad names in a folder of their own: MuJoCo writes MUJOCO_LOG.TXT where its runs start
    procs = {key: start(args, cwd if key.startswith("bad") else tmp_path, cli_env()) for key, args in jobs.items()}
    done = {key: finish(proc) for key, proc in procs.items()}

    listing = done["listing"].stdout.splitlines()
    assert done["listing"].returncode == 0 and listing[0].split() == ["preset", "family", "fits", "settings"]
    assert [line.split()[0] for line in listing[1:]] == NAMES, "one line each"
    for line, preset in zip(listing[1:], PRESETS.values(), strict=True):
        assert preset.family in line and preset.fits in line and preset.origin in line
    assert done["shown"].returncode == 0 and done["shown"].stdout.strip() == show("atari")

    for key in ("bad_show", "bad_train"):
        result = done[key]
        assert result.returncode == 2 and result.stdout == "", (key, result.stderr)
        assert len(result.stderr.splitlines()) == 1, result.stderr
        assert "'nope'" in result.stderr and ", ".join(NAMES) in result.stderr
    assert not (runs / "bad").exists() and list(cwd.iterdir()) == [], "nothing written"

    assert done["classic"].returncode == 0, done["classic"].stderr
    summary = json.loads(done["classic"].stdout.splitlines()[-1])
    assert summary["status"] == "completed" and summary["env_steps"] >= 4096
    assert load_yaml(runs / "classic" / "config.yaml")["preset"] == "classic"
    assert "--preset" not in done["classic"].stderr, "a preset given: no hint"
    assert done["cartpole"].returncode == 0 and "--preset" not in done["cartpole"].stderr, "CartPole: no hint"
    assert load_yaml(runs / "cartpole" / "config.yaml")["preset"] == ""
    if "cheetah" in done:
        assert done["cheetah"].returncode == 0, done["cheetah"].stderr
        hints = [line for line in done["cheetah"].stderr.splitlines() if "--preset" in line]
        assert hints == [f"rlvitals: {family_hint('HalfCheetah-v5')}"]

    _resume_and_list(runs, tmp_path)


def _resume_and_list(runs: Path, tmp_path: Path) -> None:
    """The recorded preset through --resume, `runs --filter` and `report`, and a run dir older than the field."""
    from rlvitals.report import build_report
    from rlvitals.runs import list_runs

    refused = finish(start(["train", "--resume", runs / "classic", "--preset", "mujoco"], tmp_path, cli_env()))
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1
    assert "preset cannot change when resuming" in refused.stderr and "'classic'" in refused.stderr
    resumed = finish(start(["train", "--resume", runs / "classic", "--total-env-steps", 8192, "--progress", "false"],
                           tmp_path, cli_env()))
    assert resumed.returncode == 0, resumed.stderr
    assert load_yaml(runs / "classic" / "config.yaml")["preset"] == "classic"

    older = runs / "older"  # as a run written before the field existed
    shutil.copytree(runs / "cartpole", older)
    config = load_yaml(older / "config.yaml")
    del config["preset"]
    (older / "config.yaml").write_text(yaml.safe_dump(config))
    rows = json.loads(list_runs(str(runs), filters=["preset=classic"], as_json=True))
    assert [Path(row["path"]).name for row in rows] == ["classic"]
    unset = json.loads(list_runs(str(runs), filters=["preset="], as_json=True))
    assert sorted(Path(row["path"]).name for row in unset) == sorted(["cartpole", "older"]
                                                                        + (["cheetah"] if (runs / "cheetah").exists()
                                                                           else []))
    path, size = build_report([str(runs / "classic"), str(older)], tmp_path / "report.html")
    assert path.is_file() and size > 0


def test_the_api_applies_a_preset_named_in_a_train_config_or_a_keyword_under_the_fields_given():
    from rlvitals.api import make_config

    mujoco = build_config(None, {"preset": "mujoco"})
    named = make_config(TrainConfig(preset="mujoco", env="Hopper-v5", seed=3))
    assert named == dataclasses.replace(mujoco, env="Hopper-v5", seed=3)
    assert make_config(TrainConfig(env="Hopper-v5"), preset="mujoco") == dataclasses.replace(mujoco, env="Hopper-v5")
    # A field given away from its default stays; one meant to keep its default under a preset is a keyword.
    assert make_config(TrainConfig(preset="mujoco", num_envs=4)).num_envs == 4
    assert make_config(TrainConfig(preset="mujoco"), num_envs=TrainConfig().num_envs).num_envs == TrainConfig().num_envs
    # A config the builder made already holds its preset's values: building it again changes nothing.
    assert make_config(mujoco) == mujoco
