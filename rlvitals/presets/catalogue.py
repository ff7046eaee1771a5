"""The presets shipped with rlvitals, one per env family, every value with its source.

A preset sets the learning settings of its family's published runs and the family's reference env and budget;
nothing about where a run goes (mode, run_dir, telemetry), which stays the user's. A value carries `[KEY]` for
each source that gives it (SOURCES below), then what that source says where it differs or needs converting.
The classic preset is the defaults of TrainConfig; tests/test_presets.py keeps the two equal, keeps the atari
preset equal to bench/configs/pong.yaml and the mujoco preset equal to bench/diagnosis.py's CLEANRL_MUJOCO.
"""

from __future__ import annotations

from .model import Preset, Setting

SOURCES = {
    "rlvitals": "this project's defaults, tuned on CartPole-v1: bench/cartpole.py reaches a last-100 mean return of "
                "475 in 98k-114k env steps, median 4 s on two CPU cores (README, Performance)",
    "PPO": "Schulman et al. 2017, \"Proximal Policy Optimization Algorithms\", arXiv:1707.06347: Table 3 (MuJoCo), "
           "Table 5 (Atari)",
    "CleanRL": "CleanRL (Huang et al. 2022, JMLR 23(274)), the argument defaults of cleanrl/ppo.py (classic control), "
               "cleanrl/ppo_continuous_action.py (MuJoCo: its published benchmark, 1M steps) and cleanrl/ppo_atari.py",
    "37details": "Huang et al. 2022, \"The 37 Implementation Details of Proximal Policy Optimization\", ICLR blog "
                 "track: the details CleanRL's files implement",
    "IMPALA": "Espeholt et al. 2018, \"IMPALA\", Table G.1 and section 5 (Atari: discount, reward clipping, entropy "
              "cost 0.01)",
    "Machado": "Machado et al. 2018, \"Revisiting the Arcade Learning Environment\": sticky actions (ALE v5's "
               "repeat_action_probability 0.25)",
    "pong.yaml": "bench/configs/pong.yaml of this project: the PPO paper's Atari settings as CleanRL runs them, "
                 "cited per field; the atari preset is that file less its Ray mode and Pong's return threshold",
    "SB3 zoo": "rl-baselines3-zoo (Raffin 2020, DLR-RM/rl-baselines3-zoo), hyperparams/ppo.yml, entry LunarLander-v2 "
               "(gymnasium 1.0's LunarLander-v3 is v2 with bug fixes)",
    "SB3": "Stable-Baselines3 (Raffin et al. 2021, JMLR 22(268)), PPO's constructor defaults "
           "(stable_baselines3/ppo/ppo.py), which the zoo entry leaves as they are",
}
"""Every source a preset cites, by the key its settings write in brackets."""


CLASSIC = Preset(
    name="classic", family="classic control", origin="rlvitals's defaults, tuned on CartPole-v1",
    fits="CartPole-v1, Acrobot-v1 (gymnasium.envs.classic_control)",
    entry_modules=("gymnasium.envs.classic_control",), install="",
    settings={
        "total_env_steps": Setting(200_000, "[rlvitals] past CartPole-v1's 475 (reached at 98k-114k env steps)"),
        "env": Setting("CartPole-v1", "[rlvitals] the env the defaults were tuned on"),
        "num_envs": Setting(32, "[rlvitals] 32 envs x 128 steps: 4,096 samples a batch ([CleanRL] ppo.py: 4 x 128)"),
        "rollout_length": Setting(128, "[rlvitals] [CleanRL] ppo.py num_steps 128"),
        "learning_rate": Setting(2.5e-3, "[rlvitals] 10x [CleanRL] ppo.py's 2.5e-4"),
        "anneal_lr": Setting(True, "[rlvitals] [CleanRL] ppo.py anneal_lr"),
        "gamma": Setting(0.99, "[rlvitals] [CleanRL] ppo.py"),
        "gae_lambda": Setting(0.95, "[rlvitals] [CleanRL] ppo.py"),
        "update_epochs": Setting(4, "[rlvitals] [CleanRL] ppo.py"),
        "num_minibatches": Setting(8, "[rlvitals] 8 minibatches of 512 ([CleanRL] ppo.py: 4 of 128)"),
        "clip_coef": Setting(0.2, "[rlvitals] [CleanRL] ppo.py"),
        "value_coef": Setting(0.5, "[rlvitals] [CleanRL] ppo.py vf_coef"),
        "entropy_coef": Setting(0.0, "[rlvitals] no entropy bonus ([CleanRL] ppo.py: 0.01)"),
        "max_grad_norm": Setting(0.5, "[rlvitals] [CleanRL] ppo.py"),
        "normalize_advantages": Setting(True, "[rlvitals] [CleanRL] ppo.py norm_adv, per minibatch"),
        "normalize_observations": Setting(False, "[rlvitals] [CleanRL] ppo.py: raw observations"),
        "normalize_rewards": Setting(False, "[rlvitals] [CleanRL] ppo.py: raw rewards"),
        "hidden_sizes": Setting((64, 64), "[rlvitals] [CleanRL] ppo.py: two tanh layers of 64, policy and value "
                                          "apart"),
    })

MUJOCO = Preset(
    name="mujoco", family="MuJoCo", origin="CleanRL ppo_continuous_action.py's MuJoCo benchmark settings",
    fits="HalfCheetah-v5, Hopper-v5, Walker2d-v5, Ant-v5, Humanoid-v5, InvertedPendulum-v5 (gymnasium.envs.mujoco)",
    entry_modules=("gymnasium.envs.mujoco",), install="rlvitals[mujoco]",
    settings={
        "total_env_steps": Setting(1_000_000, "[CleanRL] total_timesteps 1M, the budget of its MuJoCo table"),
        "env": Setting("HalfCheetah-v5", "[CleanRL] env_id HalfCheetah-v4 (v5: gymnasium 1.x's revision)"),
        "num_envs": Setting(1, "[CleanRL] num_envs 1"),
        "rollout_length": Setting(2048, "[CleanRL] num_steps 2048; [PPO] Table 3 horizon 2048"),
        "learning_rate": Setting(3e-4, "[CleanRL] learning_rate 3e-4; [PPO] Table 3 Adam stepsize 3e-4"),
        "anneal_lr": Setting(True, "[CleanRL] anneal_lr: linear to 0 over the run"),
        "gamma": Setting(0.99, "[CleanRL] [PPO] Table 3"),
        "gae_lambda": Setting(0.95, "[CleanRL] [PPO] Table 3"),
        "update_epochs": Setting(10, "[CleanRL] update_epochs 10; [PPO] Table 3 epochs 10"),
        "num_minibatches": Setting(32, "[CleanRL] num_minibatches 32: minibatches of 64, [PPO] Table 3's size"),
        "clip_coef": Setting(0.2, "[CleanRL] clip_coef 0.2; [PPO] epsilon 0.2"),
        "value_coef": Setting(0.5, "[CleanRL] vf_coef 0.5"),
        "entropy_coef": Setting(0.0, "[CleanRL] ent_coef 0.0; [PPO] c2 = 0 on MuJoCo"),
        "max_grad_norm": Setting(0.5, "[CleanRL] max_grad_norm 0.5"),
        "normalize_advantages": Setting(True, "[CleanRL] norm_adv, per minibatch"),
        "normalize_observations": Setting(True, "[CleanRL] gym.wrappers.NormalizeObservation; [37details] "
                                                "observation normalization"),
        "normalize_rewards": Setting(True, "[CleanRL] gym.wrappers.NormalizeReward(gamma) on the discounted return; "
                                           "[37details] reward scaling"),
        "normalize_clip": Setting(10.0, "[CleanRL] observations and scaled rewards clipped to [-10, 10]"),
        "hidden_sizes": Setting((64, 64), "[CleanRL] two tanh layers of 64, policy and value apart; [PPO] Table 3"),
    })

ATARI = Preset(
    name="atari", family="Atari",
    origin="the PPO paper's Atari settings as CleanRL runs them (bench/configs/pong.yaml)",
    fits="ALE/Pong-v5, ALE/Breakout-v5, ALE/BeamRider-v5, ... (ale_py)",
    entry_modules=("ale_py",), install="rlvitals[atari]",
    settings={
        "total_env_steps": Setting(10_000_000, "[pong.yaml] [PPO] [CleanRL]: 10M agent steps (40M frames) per game"),
        "env": Setting("ALE/Pong-v5", "[pong.yaml] the game of issue 22's runs"),
        "env_kwargs": Setting({"repeat_action_probability": 0.0},
                              "[pong.yaml] no sticky actions, as [PPO] and [CleanRL] ran the v4 ids ([Machado]: v5 "
                              "repeats the last action with p = 0.25)"),
        "atari_episodic_life": Setting(False, "[pong.yaml] ([CleanRL] ends an episode per life; Pong has none)"),
        "atari_reward_clipping": Setting(True, "[pong.yaml] [PPO] [IMPALA]: rewards clipped to [-1, 1]"),
        "num_envs": Setting(16, "[pong.yaml] 16 envs x 128 steps: 2,048 samples a batch ([PPO] 8 x 128)"),
        "rollout_length": Setting(128, "[pong.yaml] [PPO] Table 5 horizon T = 128"),
        "learning_rate": Setting(2.5e-4, "[pong.yaml] [PPO] Table 5 2.5e-4 x alpha; [CleanRL] 2.5e-4"),
        "anneal_lr": Setting(True, "[pong.yaml] [PPO] alpha annealed 1 -> 0; [CleanRL] linear decay"),
        "gamma": Setting(0.99, "[pong.yaml] [PPO] [IMPALA]"),
        "gae_lambda": Setting(0.95, "[pong.yaml] [PPO] Table 5"),
        "update_epochs": Setting(4, "[pong.yaml] [CleanRL] 4 ([PPO] 3)"),
        "num_minibatches": Setting(4, "[pong.yaml] [CleanRL] 4 ([PPO]: minibatch 32 x 8 actors = 256 of 1,024)"),
        "clip_coef": Setting(0.1, "[pong.yaml] [PPO] 0.1 x alpha; [CleanRL] 0.1, not annealed"),
        "value_coef": Setting(0.5, "[pong.yaml] [CleanRL] vf_coef 0.5 ([PPO] c1 = 1 with a shared network)"),
        "entropy_coef": Setting(0.01, "[pong.yaml] [PPO] c2 = 0.01; [IMPALA] 0.01"),
        "max_grad_norm": Setting(0.5, "[pong.yaml] [CleanRL]"),
        "normalize_advantages": Setting(True, "[pong.yaml] [CleanRL] per minibatch"),
        "image_network": Setting("nature", "[pong.yaml] [PPO] [CleanRL]: the Nature-DQN CNN"),
    })

BOX2D = Preset(
    name="box2d", family="Box2D", origin="the SB3 zoo's settings tuned for LunarLander",
    fits="LunarLander-v3, LunarLanderContinuous-v3 (gymnasium.envs.box2d)",
    entry_modules=("gymnasium.envs.box2d",), install="rlvitals[box2d]",
    settings={
        "total_env_steps": Setting(1_000_000, "[SB3 zoo] n_timesteps 1e6"),
        "env": Setting("LunarLander-v3", "[SB3 zoo] LunarLander-v2, revised as v3 by gymnasium 1.0"),
        "num_envs": Setting(16, "[SB3 zoo] n_envs 16"),
        "rollout_length": Setting(1024, "[SB3 zoo] n_steps 1024: 16,384 samples a batch"),
        "learning_rate": Setting(3e-4, "[SB3] learning_rate 3e-4 (the zoo entry sets none)"),
        "anneal_lr": Setting(False, "[SB3] a constant learning rate unless given a schedule; the entry gives none"),
        "gamma": Setting(0.999, "[SB3 zoo] gamma 0.999"),
        "gae_lambda": Setting(0.98, "[SB3 zoo] gae_lambda 0.98"),
        "update_epochs": Setting(4, "[SB3 zoo] n_epochs 4"),
        "num_minibatches": Setting(256, "[SB3 zoo] batch_size 64: 16,384 / 64 = 256 minibatches (bench/diagnosis.py's "
                                        "LunarLander run takes 64 of 256, a quarter of the optimizer steps)"),
        "clip_coef": Setting(0.2, "[SB3] clip_range 0.2"),
        "value_coef": Setting(0.5, "[SB3] vf_coef 0.5"),
        "entropy_coef": Setting(0.01, "[SB3 zoo] ent_coef 0.01"),
        "max_grad_norm": Setting(0.5, "[SB3] max_grad_norm 0.5"),
        "normalize_advantages": Setting(True, "[SB3] normalize_advantage, per minibatch"),
        "normalize_observations": Setting(False, "[SB3 zoo] no `normalize:` in the entry: raw observations"),
        "normalize_rewards": Setting(False, "[SB3 zoo] no `normalize:` in the entry: raw rewards"),
        "hidden_sizes": Setting((64, 64), "[SB3] MlpPolicy: two tanh layers of 64, policy and value apart"),
    })

PRESETS = {preset.name: preset for preset in (CLASSIC, MUJOCO, ATARI, BOX2D)}
"""Every preset by name, in the order `rlvitals presets` lists them."""
