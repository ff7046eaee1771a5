"""The env's reset re-derived from its own inputs: an episode of a long-lived env, replayed on a fresh instance.

Whatever its time limit, rewards or dynamics, a correct env's `reset` restores its whole state: an episode
is a function of the state `reset` draws from the env's own generator (`self.np_random`) and of the actions,
and of nothing the instance did before. So an episode that one of the run's long-lived sub-envs played after
many others is played again, step for step, by a fresh instance of the same env (built from the same spec),
given the generator's state the run's sub-env had when it autoreset and the same actions; the two must
return the same observations, rewards, terminated and truncated flags. State carried across `reset` breaks
it: a step counter not reset (its own time limit truncating every later episode at once), a consumed
resource, a cached observation, a generator other than `np_random` that is never reseeded.

inv_env_reset_restores (per update; NaN when no episode was replayed)
    Number of replayed episodes whose transitions differ from the run's. Derivation: the fresh instance
    computes the same functions of the same inputs in the same process, so a correct env gives identical
    values (compared exactly, the fresh observation cast to the dtype the vector env stores). False alarms:
    an env whose episode does not follow from `np_random` and the actions (it draws from the global
    generator, the clock, or a generator of its own seeded at construction or by `reset(seed=...)`) is told
    apart first: on any difference a second fresh instance, reset with another seed before it is given the
    same generator state, replays the episode too, and when the two fresh instances disagree with each
    other the env is not judged for the rest of the run (nothing it returns follows from its inputs). An env
    whose episode follows from the generator's state and differs from the run's after a fresh start carries
    state across `reset`, which is what the invariant names. Not judged: vector envs without sub-envs
    (vector entry points such as CartPole's, ALE's native vector env), sub-envs whose spec cannot rebuild the
    same wrapper stack, episodes longer than LONGEST_EPISODE, envs that raise during a replay.
    Cost: episodes are sampled (one sub-env at a time, round robin) while the steps replayed stay under
    REPLAY_FREE_STEPS + REPLAY_SHARE of the steps witnessed, counted in steps (never timed), so local mode
    and Ray's one-actor sync mode replay the same episodes; the replay runs in the actor's process on its
    own instances, never on the run's envs, with the process's global generators put back afterwards. Building
    an instance counts as BUILD_STEPS steps.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import warnings

import gymnasium as gym
import numpy as np

from .time_limit import StepsSinceReset, TimeLimitDecision

REPLAY_SHARE = 1 / 512
"""Steps replayed per step witnessed, once the free steps are spent."""
REPLAY_FREE_STEPS = 1024
"""Steps replayed before the share applies: the first episodes are judged at once."""
BUILD_STEPS = 16
"""What building a fresh instance counts as, in steps, against the share (a bandit's episodes are one step long,
and building its instance costs more than stepping it)."""
LONGEST_EPISODE = 4096
"""An episode still going after this many steps is not captured (its replay would cost too much)."""
SEEDS = (0x5EED, 0xFACE)
"""The seeds the two fresh instances are reset with before the run's generator state is put in them."""
PROBES = (StepsSinceReset, TimeLimitDecision)
"""The witness's own wrappers in a sub-env's stack: not part of the env."""


@dataclasses.dataclass
class Episode:
    """One episode of one sub-env as the vector env returned it, from the autoreset that began it."""

    env_index: int
    generator: np.random.Generator
    """A copy of the sub-env's `np_random` just before its autoreset drew the episode's start."""
    first_obs: np.ndarray | None = None
    actions: list = dataclasses.field(default_factory=list)
    steps: list = dataclasses.field(default_factory=list)
    """(observation, reward, terminated, truncated) per step."""


class ResetReplay:
    """Captures sampled episodes of a sync vector env's sub-envs and replays them on fresh instances."""

    def __init__(self, vector_env: gym.vector.SyncVectorEnv):
        self.envs = vector_env.envs
        self.n = len(self.envs)
        self.judged = True
        """False once the env was found not to follow from its inputs (or could not be rebuilt)."""
        self.spent = self.witnessed = 0
        self.target = 0
        """The sub-env whose next episode is captured."""
        self.capture: Episode | None = None
        self.finished: list[Episode] = []
        self._spec = None

    @classmethod
    def attach(cls, vector_env: gym.vector.VectorEnv) -> ResetReplay | None:
        """A replay for a sync vector env whose sub-envs are gymnasium envs; None for other vector envs."""
        envs = getattr(vector_env, "envs", None)
        if not isinstance(envs, list) or not envs or not all(isinstance(e, gym.Env) for e in envs):
            return None
        return cls(vector_env)

    def restart(self) -> None:
        """The vector env was reset: an episode being captured ends unfinished."""
        self.capture = None

    def after_step(self, actions, obs, terminated, truncated, reward) -> None:
        """Called with every vector step's input and output (the witness's)."""
        self.witnessed += self.n
        cap = self.capture
        if cap is None:
            e = self.target
            if (terminated[e] or truncated[e]) and self.judged and self._affordable():
                # The next step autoresets this sub-env from its generator as it is now (read, never created:
                # the `np_random` property would give an env that has none a generator of its own).
                generator = getattr(self.envs[e].unwrapped, "_np_random", None)
                if not isinstance(generator, np.random.Generator):
                    self.judged = False   # its episodes do not start from a generator a replay can be given
                    return
                self.capture = Episode(e, copy.deepcopy(generator))
            return
        e = cap.env_index
        if cap.first_obs is None:   # the autoreset step: its observation is the episode's start
            cap.first_obs = np.array(obs[e], copy=True)
            return
        cap.actions.append(np.array(actions[e], copy=True))
        cap.steps.append((np.array(obs[e], copy=True), float(reward[e]), bool(terminated[e]), bool(truncated[e])))
        if terminated[e] or truncated[e]:
            self.finished.append(cap)
            self.capture, self.target = None, (e + 1) % self.n
        elif len(cap.steps) >= LONGEST_EPISODE:
            self.capture, self.target = None, (e + 1) % self.n

    def _affordable(self) -> bool:
        return self.spent <= REPLAY_FREE_STEPS + self.witnessed * REPLAY_SHARE

    def judge(self) -> tuple[int, int]:
        """(episodes replayed and judged, of them those whose transitions differ from the run's) since the last
        call. The process's global generators are put back afterwards: an env drawing from them is not judged,
        and the run's own envs draw what they would have drawn without the replay."""
        finished, self.finished = self.finished, []
        if not finished or not self.judged:
            return 0, 0
        import torch  # here, not at import: a run refused before its network is built never loads torch

        saved = np.random.get_state(), random.getstate(), torch.get_rng_state()
        judged = differ = 0
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")   # the env checker's warnings were the run's to give
                for episode in finished:
                    verdict = self._judge(episode)
                    if verdict is None:
                        self.judged = False
                        self.capture = None
                        return 0, 0
                    judged += 1
                    differ += verdict
        finally:
            np.random.set_state(saved[0])
            random.setstate(saved[1])
            torch.set_rng_state(saved[2])
        return judged, differ

    def _judge(self, episode: Episode) -> bool | None:
        """Whether a fresh instance's replay differs from the run's episode; None: the env is not judged."""
        first = self._replay(episode, SEEDS[0])
        if first is None:
            return None
        if _same(first, episode):
            return False
        second = self._replay(episode, SEEDS[1])   # do the env's episodes follow from their inputs at all?
        if second is None or not _same(second, first):
            return None
        return True

    def _replay(self, episode: Episode, seed: int) -> Episode | None:
        """The episode played by a fresh instance: reset with `seed`, then given the run's generator state and
        reset as the autoreset did, then stepped with the run's actions; None when it cannot be."""
        try:
            env = self._fresh()
        except Exception:   # an env rebuilt differently from the run's, or not at all: nothing to compare
            return None
        if env is None:
            return None
        replay = Episode(episode.env_index, episode.generator)
        self.spent += BUILD_STEPS
        try:
            env.reset(seed=seed)
            env.unwrapped.np_random = copy.deepcopy(episode.generator)
            obs, _ = env.reset()
            replay.first_obs = np.asarray(obs)
            for action in episode.actions:
                obs, reward, terminated, truncated, _ = env.step(action)
                self.spent += 1
                replay.steps.append((np.asarray(obs), float(reward), bool(terminated), bool(truncated)))
                if terminated or truncated:
                    break
        except Exception:   # the env's own error: the run reports it where the run's envs raise it
            return None
        finally:
            try:
                env.close()
            except Exception:
                pass
        return replay

    def _fresh(self) -> gym.Env | None:
        """A new instance built from the run's sub-env spec, the witness's probes left out; None when its
        wrapper stack is not the run's (wrappers added outside the spec, as the Atari preprocessing)."""
        if self._spec is None:
            spec = self.envs[0].spec
            kept = tuple(w for w in spec.additional_wrappers
                         if not str(w.entry_point).startswith(StepsSinceReset.__module__ + ":"))
            self._spec = dataclasses.replace(spec, additional_wrappers=kept)
        env = gym.make(self._spec)
        if _stack(env) != _stack(self.envs[0]):
            env.close()
            return None
        return env


def _stack(env: gym.Env) -> list[type]:
    """The classes of an env's wrappers, outermost first, and of the env itself; the witness's probes left out."""
    out = []
    while isinstance(env, gym.Wrapper):
        if not isinstance(env, PROBES):
            out.append(type(env))
        env = env.env
    return [*out, type(env)]


def _same(replay: Episode, run: Episode) -> bool:
    """Whether a replay returned exactly what the run's episode returned (observations cast to the run's dtype)."""
    if len(replay.steps) != len(run.steps) or not _same_obs(replay.first_obs, run.first_obs):
        return False
    for (obs, reward, terminated, truncated), (run_obs, run_reward, run_term, run_trunc) in zip(
            replay.steps, run.steps, strict=True):
        if terminated != run_term or truncated != run_trunc or not _same_obs(obs, run_obs):
            return False
        if reward != run_reward and not (reward != reward and run_reward != run_reward):   # NaN equals NaN
            return False
    return True


def _same_obs(obs, run_obs) -> bool:
    run_obs = np.asarray(run_obs)
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            cast = np.asarray(obs).astype(run_obs.dtype)
    except (TypeError, ValueError):
        return False
    return cast.shape == run_obs.shape and np.array_equal(cast, run_obs, equal_nan=run_obs.dtype.kind in "fc")
