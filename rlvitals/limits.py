"""Bounds on sizes and numbers: values no machine can hold are refused before anything starts, limit named.

Two kinds. Fixed bounds (seeds, counters, threads, envs per actor) hold on every
machine and are checked with the rest of the config. The memory estimate needs
the env's spaces, so it runs in the pre-flight check: the network (weights,
gradients and Adam's two moments), one rollout, and the learner's activations
on one minibatch, against this machine's memory.
"""

from __future__ import annotations

import dataclasses
import math
import os
import stat
from pathlib import Path

from .config_error import ConfigError
from .config_yaml import NESTING_MAX

SEED_MAX = 2**32 - 1
"""numpy seeds are 32-bit; torch's and the envs' seeds are derived from the run's seed."""
COUNT_MAX = 2**62
"""Step and update counters are int64 in tensors and checkpoints; leave headroom for sums."""
TORCH_THREADS_MAX = 256
NUM_ENVS_MAX = 65_536
"""Envs one actor steps in one process; more is spread over Ray actors."""
DURATION_MAX_SECONDS = 30 * 24 * 3600
"""Timeouts and intervals (`*_seconds` fields): 30 days; beyond that sleeps and deadlines overflow."""
EVAL_EPISODES_MAX = 1_000_000
"""`rlvitals eval` keeps every episode's return in memory."""
CONFIG_BYTES_MAX = 1 << 20
"""A config file or a run's config.yaml: a few hundred bytes in practice."""
JSON_BYTES_MAX = 64 << 20
"""meta.json, summary.json, verdicts.json of a run: kilobytes in practice."""

FLOAT_BYTES = 4
PER_SAMPLE_EXTRA_BYTES = 64
"""Besides the observation, a sample stores action, reward, flags, log-probability, value and age."""
TRAINING_COPIES = 4
"""Weights, gradients and Adam's two moments, each the size of the weights."""
ACTIVATION_COPIES = 3
"""Forward activations kept for the backward pass, their gradients, and slack."""


class LimitError(ConfigError):
    """A size or number beyond what the program or the machine can hold; one line naming the limit."""


def check_seed(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        raise LimitError(f"{name}={value!r} is invalid: expected an integer from 0 to {SEED_MAX} (2**32 - 1)")


def check_config_limits(cfg) -> None:
    """Fixed bounds of a TrainConfig whose fields already have the right types."""
    check_seed("seed", cfg.seed)
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        if isinstance(value, int) and not isinstance(value, bool) and value > COUNT_MAX:
            raise LimitError(f"{field.name}={value} is invalid: expected at most {COUNT_MAX} (2**62)")
        if field.name.endswith("_seconds") and isinstance(value, float) and value > DURATION_MAX_SECONDS:
            raise LimitError(f"{field.name}={value!r} is invalid: expected at most {DURATION_MAX_SECONDS} (30 days)")
    if cfg.torch_threads > TORCH_THREADS_MAX:
        raise LimitError(f"torch_threads={cfg.torch_threads} is invalid: expected at most {TORCH_THREADS_MAX}")
    if cfg.num_envs > NUM_ENVS_MAX:
        raise LimitError(f"num_envs={cfg.num_envs} is invalid: expected at most {NUM_ENVS_MAX} per actor "
                         "(spread more over Ray actors with --mode ray --num-actors)")


class UnreadableFile(ConfigError):
    """A file that is not a regular file (a FIFO, a device, a folder) or is larger than its kind may be."""


def open_regular(path: str | Path, what: str) -> int:
    """A read descriptor of `path` once it is known to be a regular file: never blocks on a FIFO, never reads
    a device. UnreadableFile (one line) otherwise; OSError where it cannot be opened at all."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket")
        raise UnreadableFile(f"{what} {str(path)!r} is unreadable: it is {kind}, not a regular file; expected a "
                             "regular file")
    return fd


def read_bounded(path: str | Path, limit: int, what: str) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them: UnreadableFile (one line, naming the
    limit) for a larger file or one that is no regular file; OSError where it cannot be read."""
    fd = open_regular(path, what)
    try:
        if os.fstat(fd).st_size > limit:
            raise UnreadableFile(f"{what} {str(path)!r} is invalid: it holds {size_text(os.fstat(fd).st_size)}; "
                                 f"expected at most {size_text(limit)}")
        with open(fd, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)  # a file growing meanwhile is still cut at the limit
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UnreadableFile(f"{what} {str(path)!r} is invalid: it holds more than {size_text(limit)}; "
                             f"expected at most {size_text(limit)}")
    return data


def check_nesting(name: str, value, limit: int = NESTING_MAX) -> None:
    """LimitError when `value` nests lists and mappings more than `limit` deep (walked without recursion)."""
    todo = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, (list, tuple, dict)):
            if depth > limit:
                raise LimitError(f"{name} is invalid: it nests lists and mappings more than {limit} levels deep; "
                                 f"expected at most {limit}")
            todo.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))


def machine_memory() -> int:
    """Bytes of memory this process may use: physical memory, or the cgroup's limit where lower."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if text.isdigit():
            total = min(total, int(text))
    except OSError:
        pass
    return total


def size_text(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB", "PB"):
        if n < 1024 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PB"


def check_memory(cfg, obs_space, action_space, available: int | None = None) -> None:
    """LimitError when the network or one rollout cannot fit in this machine's memory."""
    import torch

    from .parts import make_network

    available = machine_memory() if available is None else available
    where = f"more than this machine's {size_text(available)} of memory"
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        net = make_network(cfg, obs_space, action_space)
    params = sum(p.numel() for p in net.parameters())
    network_bytes = params * FLOAT_BYTES * TRAINING_COPIES
    if network_bytes > available:
        raise LimitError(f"hidden_sizes={list(cfg.hidden_sizes)} is invalid: the network would have {params:,} "
                         f"parameters, about {size_text(network_bytes)} with gradients and Adam's moments, {where}; "
                         "expected smaller layers")
    obs_bytes = math.prod(obs_space.shape or (1,)) * obs_space.dtype.itemsize
    rollout_bytes = cfg.num_envs * (cfg.rollout_length + 1) * (obs_bytes + PER_SAMPLE_EXTRA_BYTES)
    if network_bytes + rollout_bytes > available:
        raise LimitError(f"num_envs={cfg.num_envs} x rollout_length={cfg.rollout_length} is invalid: one rollout "
                         f"of {obs_bytes}-byte observations would take about {size_text(rollout_bytes)}, {where}; "
                         "expected fewer envs or shorter rollouts")
    minibatch = max(cfg.num_envs * cfg.rollout_length // cfg.num_minibatches, 1)
    activation_bytes = minibatch * sum(cfg.hidden_sizes) * FLOAT_BYTES * ACTIVATION_COPIES
    if network_bytes + rollout_bytes + activation_bytes > available:
        raise LimitError(f"hidden_sizes={list(cfg.hidden_sizes)} with minibatches of {minibatch} samples is "
                         f"invalid: the learner's activations would take about {size_text(activation_bytes)}, "
                         f"{where}; expected smaller layers or more --num-minibatches")
