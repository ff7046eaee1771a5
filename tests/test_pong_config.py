"""bench/configs/pong.yaml: the documented Atari settings load through `rlvitals train --config` and validate."""

from __future__ import annotations

from pathlib import Path

from rlvitals.cli import build_parser, train_config_from_args

PONG = Path(__file__).resolve().parent.parent / "bench" / "configs" / "pong.yaml"


def test_pong_config_loads_as_the_train_command_reads_it(tmp_path):
    args = build_parser().parse_args(["train", "--config", str(PONG), "--run-dir", str(tmp_path / "run")])
    cfg = train_config_from_args(args)
    assert (cfg.env, cfg.mode, cfg.image_network) == ("ALE/Pong-v5", "ray", "nature")
    # The PPO paper's Atari settings (Schulman et al. 2017, Table 5), as the file's comments cite them.
    assert (cfg.rollout_length, cfg.learning_rate, cfg.clip_coef, cfg.entropy_coef, cfg.gamma, cfg.gae_lambda) == \
        (128, 2.5e-4, 0.1, 0.01, 0.99, 0.95)
    assert cfg.env_kwargs == {"repeat_action_probability": 0.0}
    assert cfg.return_threshold == 18.0

