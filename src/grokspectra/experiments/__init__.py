"""Per-chapter experiments: parameters in, stored arrays out.

Each chapter module (``ch1`` … ``ch7``) declares ``SECTION`` (its notebook's name and section in the profile files
``params/*.yaml``), ``SCHEMA`` (the notebook's parameters) and its experiments with :func:`experiment`. An
:class:`Experiment` runs through the result store: :meth:`Experiment.run` computes (or finds) a result for the
given parameters, :meth:`Experiment.best` returns the largest-scale *current* result available — the ``paper``
profile's when the store holds it for the current code, otherwise the live one — so the book never shows a stale
result as current.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Callable, Iterable, Mapping

import torch

from ..device import get_device
from ..params import ParamError, load_profile
from ..store import Result, Store, code_version, load_or_compute

CHAPTERS = ["ch1", "ch2", "ch3", "ch4", "ch5", "ch6", "ch7"]
REGISTRY: dict[str, "Experiment"] = {}


class Experiment:
    """A named computation ``fn(params, device) -> {name: array}`` over the subset ``keys`` of a notebook's
    parameters, whose code version hashes ``modules`` (and the module that defines ``fn``)."""

    def __init__(self, name: str, fn: Callable[[dict, torch.device], Mapping[str, Any]], section: str,
                 keys: Iterable[str], modules: Iterable[str]):
        self.name, self.fn, self.section = name, fn, section
        self.keys = tuple(keys)
        self.modules = tuple(sorted(set(modules) | {fn.__module__}))

    def __repr__(self) -> str:
        return f"Experiment({self.name!r}, keys={self.keys})"

    def params(self, P: Mapping[str, Any]) -> dict[str, Any]:
        missing = [k for k in self.keys if k not in P]
        if missing:
            raise ParamError(f"experiment {self.name} needs parameter(s) {missing}")
        return {k: P[k] for k in self.keys}

    def code(self) -> str:
        return code_version(*self.modules)

    def run(self, P: Mapping[str, Any], *, store: Store | None = None, force: bool = False,
            device: torch.device | str | None = None) -> Result:
        """Compute (or load) this experiment for the notebook parameters ``P`` (needs ``P['profile']``)."""
        dev = get_device(device if device is not None else P.get("device", "auto"))
        sub = self.params(P)
        return load_or_compute(self.name, sub, lambda p: self.fn(p, dev), code=self.code(),
                               profile=str(P.get("profile", "custom")), device=dev, store=store, force=force)

    def best(self, live: Result, *, store: Store | None = None, profile: str = "paper") -> Result:
        """The ``profile``-scale result when the store holds a current one, else ``live``. A stale stored result
        is never returned; ``live`` then carries a note naming the commit that made the stale one."""
        if live.meta.get("profile") == profile:
            return live
        try:
            P = load_profile(profile, self.section)
            sub = self.params(P)
        except ParamError:
            return live
        stored = (store or Store()).latest(self.name, profile, sub, self.code())
        if stored is None:
            return live
        if stored.stale:
            live.meta["note"] = (f"a {profile}-scale result (commit `{stored.meta.get('commit')}`) exists but is stale "
                                 f"and is not shown")
            return live
        return stored


def experiment(section: str, keys: Iterable[str], modules: Iterable[str] = (), name: str | None = None):
    """Decorator: register ``fn(params, device)`` as ``<chapter>.<fn name>``."""

    def wrap(fn):
        chapter = fn.__module__.rsplit(".", 1)[-1]
        exp = Experiment(name or f"{chapter}.{fn.__name__}", fn, section, keys, modules)
        REGISTRY[exp.name] = exp
        return exp

    return wrap


def load_chapters() -> list[str]:
    """Import every chapter module that exists; return their names."""
    found = []
    for ch in CHAPTERS:
        mod = f"{__name__}.{ch}"
        if importlib.util.find_spec(mod) is not None:
            importlib.import_module(mod)
            found.append(ch)
    return found


def chapter(name: str):
    return importlib.import_module(f"{__name__}.{name}")
