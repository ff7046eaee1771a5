"""Atari (ALE) vector envs with the standard preprocessing; needs the `atari` extra (ale-py).

Observations are uint8 [N, 4, 84, 84]: grayscale, 84x84, 4 stacked frames, each
step repeating the action for 4 frames and max-pooling the last two, episodes
starting with up to 30 no-ops (and FIRE where the game needs it). ale-py's
native AtariVectorEnv does this in C++ threads; where it is missing (ale-py
older than 0.11) the same preprocessing runs as gymnasium wrappers over a
synchronous vector env. The env id chooses the game, the sticky-action
probability and the action set (`ALE/Pong-v5`: 0.25 and the minimal set);
the frame skip is always 4. ale-py ships its ROMs: nothing is downloaded.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import gymnasium as gym

from .env_contract import AUTORESET_MODE, EnvError

INSTALL_HINT = "pip install rlvitals[atari]"
FRAME_SKIP, FRAME_STACK, SCREEN_SIZE, NOOP_MAX = 4, 4, 84, 30
_LEGACY_ID = re.compile(r"^[A-Z][A-Za-z]*(NoFrameskip|Deterministic)?-v[04]$")
ENV_KWARGS = ("repeat_action_probability", "full_action_space", "max_num_frames_per_episode")
"""What `env_kwargs` may set for an ALE id (what the id itself sets); the preprocessing above is fixed."""


@dataclass(frozen=True)
class AtariOptions:
    """Choices of the Atari preprocessing that are not fixed by the standard."""

    episodic_life: bool = False
    """End the episode (terminated) when a life is lost."""
    reward_clipping: bool = True
    """Clip rewards to [-1, 1] (episode returns are then clipped returns too)."""
    native: bool | None = None
    """None: ale-py's native vector env when it has one; False: gymnasium wrappers; True: native or an error."""
    num_threads: int = 0
    """Threads of the native env; 0: one per env, at most one per CPU this process may use."""


def ale_installed() -> bool:
    try:
        import ale_py  # noqa: F401
    except ImportError:
        return False
    return True


def register(env_id: str) -> None:
    """Make ALE ids known to gymnasium (importing ale-py registers them).

    `ALE/...` ids without ale-py are a one-line EnvError; legacy ids such as
    `PongNoFrameskip-v4` are tried only when ale-py is there.
    """
    if env_id.startswith("ALE/"):
        if not ale_installed():
            raise EnvError(f"env={env_id!r} is an Atari env and needs ale-py, which is not installed: {INSTALL_HINT}")
    elif not (_LEGACY_ID.match(env_id) and ale_installed()):
        return
    import ale_py

    gym.register_envs(ale_py)


def is_atari(spec: gym.envs.registration.EnvSpec) -> bool:
    entry = spec.entry_point
    name = entry if isinstance(entry, str) else f"{getattr(entry, '__module__', '')}:{getattr(entry, '__name__', '')}"
    return name.startswith("ale_py.")


def native_available() -> bool:
    try:
        from ale_py.vector_env import AtariVectorEnv  # noqa: F401
    except ImportError:
        return False
    return True


def game_name(spec: gym.envs.registration.EnvSpec) -> str:
    """ROM name of an ALE id: `ALE/MsPacman-v5` -> `ms_pacman`."""
    if spec.kwargs.get("game"):
        return str(spec.kwargs["game"])
    name = spec.name.split("NoFrameskip")[0].split("Deterministic")[0]
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def make_atari_vector_env(env_id: str, num_envs: int, options: AtariOptions | None = None,
                          env_kwargs: dict | None = None) -> gym.vector.VectorEnv:
    """`num_envs` preprocessed copies of an ALE game in NEXT_STEP autoreset mode; `env_kwargs` from ENV_KWARGS."""
    options = options or AtariOptions()
    spec = gym.spec(env_id)
    native = native_available() if options.native is None else options.native
    if native and not native_available():
        raise EnvError(f"env={env_id!r}: ale-py {_ale_version()} has no native vector env; "
                       "expected ale-py>=0.11 or native=False")
    env_kwargs = dict(env_kwargs or {})
    if native:
        return _native(spec, num_envs, options, {**spec.kwargs, **env_kwargs})
    return _wrapped(env_id, num_envs, options, env_kwargs)


def _ale_version() -> str:
    import ale_py

    return getattr(ale_py, "__version__", "?")


def _native(spec, num_envs: int, options: AtariOptions, settings: dict) -> gym.vector.VectorEnv:
    """`settings`: the id's own arguments, with the run's env_kwargs over them."""
    from ale_py.vector_env import AtariVectorEnv

    class _OwnMetadata(AtariVectorEnv):
        # AtariVectorEnv writes its autoreset mode into `self.metadata`, which without this
        # is gymnasium's class-level VectorEnv.metadata shared by every vector env.
        metadata: dict = {}

    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    env = _OwnMetadata(
        game_name(spec), num_envs, autoreset_mode=AUTORESET_MODE,
        num_threads=options.num_threads or min(num_envs, cpus),
        repeat_action_probability=float(settings.get("repeat_action_probability", 0.25)),
        full_action_space=bool(settings.get("full_action_space", False)),
        max_num_frames_per_episode=int(settings.get("max_num_frames_per_episode") or 108_000),
        img_height=SCREEN_SIZE, img_width=SCREEN_SIZE, grayscale=True, stack_num=FRAME_STACK,
        frameskip=FRAME_SKIP, maxpool=True, noop_max=NOOP_MAX, use_fire_reset=True,
        episodic_life=options.episodic_life, reward_clipping=options.reward_clipping)
    env.metadata = dict(env.metadata)
    return env


class FireReset(gym.Wrapper):
    """Press FIRE after every reset in games that wait for it (as the native env's use_fire_reset)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()
        self.fire = meanings.index("FIRE") if "FIRE" in meanings else None

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        if self.fire is not None:
            obs, _, terminated, truncated, info = self.env.step(self.fire)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


def _wrapped(env_id: str, num_envs: int, options: AtariOptions, env_kwargs: dict) -> gym.vector.VectorEnv:
    from gymnasium.wrappers import AtariPreprocessing, ClipReward, FrameStackObservation

    try:
        import cv2  # noqa: F401  (AtariPreprocessing resizes with it)
    except ImportError:
        raise EnvError(f"env={env_id!r}: gymnasium's Atari wrappers (the fallback for an ale-py without a native "
                       f"vector env; this is {_ale_version()}) need opencv: pip install opencv-python-headless, "
                       "or ale-py>=0.11") from None

    def make():
        env = gym.make(env_id, frameskip=1, **env_kwargs)  # AtariPreprocessing does the skipping and max-pooling
        env = AtariPreprocessing(env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, screen_size=SCREEN_SIZE,
                                 terminal_on_life_loss=options.episodic_life, grayscale_obs=True, scale_obs=False)
        env = FireReset(env)
        if options.reward_clipping:
            env = ClipReward(env, -1.0, 1.0)
        return FrameStackObservation(env, FRAME_STACK, padding_type="zero")  # as the native env

    return gym.vector.SyncVectorEnv([make] * num_envs, autoreset_mode=AUTORESET_MODE)
