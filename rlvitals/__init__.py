"""rlvitals: the wiring that belongs to neither actors nor learner.

Config, command line, run archive and the run loops live here and may import
every other part (`rlvitals.actors`, `rlvitals.learner`, `rlvitals.telemetry`).

The Python API (rlvitals/api.py) is reachable from here, imported on first use
so that `import rlvitals` stays cheap (no torch, no gymnasium):

    rlvitals.train(config=None, **fields) -> summary dict
    rlvitals.load_policy(run_dir, checkpoint="latest") -> Policy, with .predict(obs, deterministic=True)
"""

__version__ = "0.1.0"

_LAZY = {"train": "api", "load_policy": "api", "make_config": "api", "Policy": "api",
         "TrainConfig": "config", "ConfigError": "config"}
"""Names this package offers, and the module each comes from."""

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'rlvitals' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
