"""Per-chapter experiments: parameters in, stored arrays out — each a sweep of separately stored units.

A chapter is one module ``chN*.py`` in this package, found by :func:`load_chapters` without any hand-kept list. It
declares ``SECTION`` (its notebook's name and its section in ``params/*.yaml``), ``SCHEMA`` (the notebook's
parameters) and its experiments with :func:`experiment`:

* ``@experiment(SECTION, keys=[...])`` on ``fn(p, device) -> {name: array}``: the whole experiment is one unit;
* ``@experiment(SECTION, keys=[...], units=U, reduce=R, cost=C, shrink=S)`` on ``fn(u, device) -> arrays``, which
  computes ONE unit: ``U(p)`` lists the units (JSON-able dicts holding every parameter the unit needs; a unit's
  store key hashes exactly its dict), ``R(p, units, results)`` assembles the experiment's arrays, ``C(u)`` is a
  unit's relative cost and ``S(u)`` a cheap version of it used to time ``--dry-run`` estimates;
* ``@exp.peak_memory`` on ``M(u) -> bytes`` (optional, below ``exp``): a unit's estimated peak memory, so that a
  sweep refuses, before computing anything, a unit its device cannot hold (:func:`grokspectra.sweep.run_units`);
* ``@exp.on_diverged`` on ``D(u, err) -> arrays | None`` (optional, below the experiment ``exp``): the outcome
  of a unit whose engine diverged (:class:`~grokspectra.device.DivergenceError` ``err``), for a grid some of
  whose cells lie beyond an engine's range (chapter 3's δ_NN grid: a DMFT whose step size is too large there).
  The outcome is stored like any unit, marked with the error (``meta["diverged"]``) and versioned by ``D``'s own
  code, so that the unit is computed again when ``D`` changes; ``None`` declines, and the divergence is then an
  error as without ``D``.

:meth:`Experiment.run` loads or computes every unit (:mod:`grokspectra.sweep`, any executor) and assembles the
result; :meth:`Experiment.best` returns the ``paper`` profile's result when the store holds every unit of it for
the current code, otherwise the live one, so the book never shows a stale or partial result as current. The code
version is derived from the functions the experiment runs (:mod:`grokspectra.version`). Results computed with
parameters that differ from the named profile's are stored under their own profile name (``paper+seeds=3``),
never under the profile itself.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import pkgutil
import re
import sys
from typing import Any, Callable, Iterable, Mapping

import torch

from ..device import DivergenceError, get_device
from ..params import ParamError, load_profile
from ..store import Result, Store, canonical
from ..version import code_version

REGISTRY: dict[str, "Experiment"] = {}


class Experiment:
    """A named computation over the subset ``keys`` of a notebook's parameters, split into units."""

    def __init__(self, name: str, fn: Callable[[dict, torch.device], Mapping[str, Any]], section: str,
                 keys: Iterable[str], units: Callable[[dict], list[dict]] | None = None,
                 reduce: Callable[[dict, list[dict], list[dict]], Mapping[str, Any]] | None = None,
                 cost: Callable[[dict], float] | None = None, shrink: Callable[[dict], dict] | None = None,
                 diverged: Callable[[dict, DivergenceError], Mapping[str, Any] | None] | None = None):
        if (units is None) != (reduce is None):
            raise TypeError(f"experiment {name}: give both units= and reduce=, or neither")
        self.name, self.fn, self.section = name, fn, section
        self.keys = tuple(keys)
        self._units, self._reduce, self._cost, self._shrink = units, reduce, cost, shrink
        self._diverged = diverged
        self._memory: Callable[[dict], float] | None = None
        self._code: str | None = None
        self._outcome_code: str | None = None

    def __repr__(self) -> str:
        return f"Experiment({self.name!r}, keys={self.keys})"

    @property
    def schema(self):
        """The notebook's parameter schema (``SCHEMA`` of the chapter module)."""
        return sys.modules[self.fn.__module__].SCHEMA

    def roots(self) -> list[Callable]:
        """What a unit's computation runs: the unit function (the unit list is part of each unit's key, and the
        reduction runs afresh on every load, so neither affects a stored unit)."""
        return [self.fn]

    def code(self) -> str:
        """The code version: a hash of the syntax trees of every package function a unit's computation runs."""
        if self._code is None:
            self._code = code_version(self.roots())
        return self._code

    def on_diverged(self, fn: Callable[[dict, DivergenceError], Mapping[str, Any] | None]):
        """Decorator: register ``fn(u, err)`` as the outcome of a unit whose computation diverged (see the module
        docstring). A separate registration, not an argument of :func:`experiment`, so that adding or changing it
        leaves the code version of the units that did not diverge unchanged (the unit function's source, decorator
        included, is part of it)."""
        self._diverged, self._outcome_code = fn, None
        return fn

    def outcome_code(self) -> str | None:
        """The code version of the ``diverged`` handler (``None`` without one): it makes a stored outcome of a
        diverged unit, so such a unit is current only while the handler is unchanged."""
        if self._diverged is not None and self._outcome_code is None:
            self._outcome_code = code_version([self._diverged])
        return self._outcome_code

    def outcome(self, u: Mapping[str, Any], err: DivergenceError) -> dict | None:
        """The stored outcome of unit ``u`` whose computation raised ``err``, or ``None`` (no handler, or it
        declines): arrays, with the extra metadata that marks them."""
        if self._diverged is None:
            return None
        arrays = self._diverged(dict(u), err)
        if arrays is None:
            return None
        return {"arrays": dict(arrays), "extra": {"diverged": str(err), "outcome_code": self.outcome_code()}}

    def load_unit(self, store: Store, u: Mapping[str, Any], profile: str) -> Result | None:
        """The stored unit ``u`` for the current code, or ``None``; an outcome of a diverged unit counts only
        when the ``diverged`` handler that made it is unchanged."""
        r = store.load(self.name, u, self.code(), profile)
        if r is not None and "diverged" in r.meta and r.meta.get("outcome_code") != self.outcome_code():
            return None
        return r

    def unit_keys(self, *names: str) -> None:
        """Add parameters that only shape the unit list: ``U(p)`` reads them to fill the units' dicts, the unit
        function never sees them (chapter 3's memory cap on a DMFT run, which sets the most paths of the wider
        cells). Registered below the experiment, like :meth:`peak_memory`, so that adding one leaves the code
        version of stored units unchanged (the decorator's ``keys`` are part of the unit function's source): what
        such a parameter changes is the units' dicts, and each unit's key hashes its own dict."""
        self.keys = self.keys + tuple(n for n in names if n not in self.keys)

    def peak_memory(self, fn: Callable[[dict], float]):
        """Decorator: register ``fn(u)``, the estimated peak memory in bytes of computing unit ``u`` (the most it can
        reach, e.g. a bisection's largest path count; models in :mod:`~grokspectra.experiments.costs`). A sweep does
        not start a unit that needs more than its device has (:func:`grokspectra.sweep.run_units`). Registered
        below the experiment, like :meth:`on_diverged`, and part of no code version: it never changes a result."""
        self._memory = fn
        return fn

    def memory_of(self, u: Mapping[str, Any]) -> float | None:
        """The estimated peak memory (bytes) of unit ``u``, or ``None`` without a model (or one that gives none for
        this unit)."""
        need = None if self._memory is None else self._memory(dict(u))
        return None if need is None else float(need)

    def params(self, P: Mapping[str, Any]) -> dict[str, Any]:
        missing = [k for k in self.keys if k not in P]
        if missing:
            raise ParamError(f"experiment {self.name} needs parameter(s) {missing}")
        return {k: P[k] for k in self.keys}

    def units(self, p: Mapping[str, Any]) -> list[dict]:
        """The units of parameters ``p`` (one unit, ``p`` itself, for an unsplit experiment)."""
        return [dict(p)] if self._units is None else [dict(u) for u in self._units(dict(p))]

    def reduce_units(self, p: dict, units: list[dict], results: list[dict]) -> Mapping[str, Any]:
        return results[0] if self._reduce is None else self._reduce(p, units, results)

    def cost_of(self, u: Mapping) -> float:
        return float(self._cost(dict(u))) if self._cost is not None else 1.0

    def probe_unit(self) -> dict | None:
        """A cheap unit for timing: the shrunken cheapest unit of the ``ci`` profile."""
        try:
            us = self.units(self.params(load_profile("ci", self.section)))
        except (ParamError, ValueError):
            return None
        u = min(us, key=self.cost_of)
        return self._shrink(u) if self._shrink is not None else u

    # --- where results go ---------------------------------------------------------------------------------
    def profile_for(self, P: Mapping[str, Any]) -> str:
        """The profile name results of ``P`` are stored under: ``P['profile']`` when this experiment's parameters
        equal that profile's, else ``<profile>+<overrides>`` (so an override never lands under ``paper``)."""
        name = str(P.get("profile", "custom"))
        try:
            ref = self.params(load_profile(name, self.section))
        except (ParamError, OSError):
            return name
        try:
            ref = self.schema.validate(ref, partial=True)
        except ParamError:
            pass
        mine = self.params(P)
        diff = {k: mine[k] for k in self.keys if canonical(mine[k]) != canonical(ref.get(k))}
        if not diff:
            return name
        text = ",".join(f"{k}={json.dumps(canonical(v), separators=(',', ':'))}" for k, v in sorted(diff.items()))
        if len(text) > 40 or not all(c.isalnum() or c in "=,.-_[]+" for c in text):
            text = hashlib.sha256(text.encode()).hexdigest()[:10]
        return f"{name}+{text}"

    # --- running ------------------------------------------------------------------------------------------
    def run(self, P: Mapping[str, Any], *, store: Store | None = None, force: bool = False,
            device: torch.device | str | None = None, executor=None, show: bool = True,
            keep_going: bool = False, max_memory: float | None = None) -> Result:
        """Load or compute every unit of this experiment for the notebook parameters ``P`` and assemble them.

        A :class:`~grokspectra.device.DivergenceError` from an engine is re-raised naming this experiment and its
        parameters; nothing of the diverged unit is stored, unless the experiment's ``on_diverged`` handler gives
        its outcome, which is stored instead. With ``keep_going`` the other units are computed and stored first
        (``sweep.run_units``). A unit whose estimated peak memory (:meth:`peak_memory`) exceeds ``max_memory`` bytes
        (default: the device's) is not started (:class:`~grokspectra.sweep.UnitsTooLarge`)."""
        from .. import sweep

        dev = device if device is not None else P.get("device", "auto")
        get_device(dev)  # a clear error now when the device is unavailable
        dev = str(dev)
        sub = self.params(P)
        profile = self.profile_for(P)
        store = store or Store()
        units = self.units(sub)
        try:
            results = sweep.run_units(self, units, profile=profile, store=store, device=dev, executor=executor,
                                      force=force, show=show, keep_going=keep_going, max_memory=max_memory)
        except sweep.UnitsDiverged as err:
            raise sweep.UnitsDiverged(f"experiment {self.name} with {json.dumps(canonical(sub))}: {err}") from None
        except sweep.UnitsTooLarge as err:
            raise sweep.UnitsTooLarge(f"experiment {self.name} [{profile}]: {err}") from None
        except DivergenceError as err:
            raise DivergenceError(f"experiment {self.name} with {json.dumps(canonical(sub))}: {err}; "
                                  "nothing was stored") from None
        return sweep.assemble(self, sub, units, results, profile)

    def load(self, P: Mapping[str, Any], profile: str, store: Store | None = None) -> tuple[Result | None, int, int]:
        """The assembled stored result of ``P`` in ``profile`` when every unit is stored for the current code,
        plus (units stored, units in all)."""
        from .. import sweep

        store = store or Store()
        sub = self.params(P)
        units = self.units(sub)
        got = [self.load_unit(store, u, profile) for u in units]
        n = sum(r is not None for r in got)
        if n < len(units):
            return None, n, len(units)
        return sweep.assemble(self, sub, units, got, profile), n, len(units)

    def best(self, live: Result, *, store: Store | None = None, profile: str = "paper",
             prefix: str | None = None, min_prefix: int = 2, partial: bool = False) -> Result:
        """The ``profile``-scale result when the store holds every unit of it for the current code, else
        ``live``, which then carries a note when a stale or partial ``profile`` result exists.

        With ``prefix`` (a list parameter whose units do not depend on later entries, e.g. chapter 4's ``d_list``):
        when the whole ``profile`` result is not there yet, the result of the longest leading part of that list
        whose every unit is stored (at least ``min_prefix`` entries: two d for a finite-size fit), with a note
        naming the part and the gap.

        With ``partial`` (for an experiment whose reduction leaves a missing unit's cells as nan, e.g. chapter 3's
        δ_NN grid, one unit per cell): failing both, the ``profile`` result assembled from the units stored so far,
        with ``meta["units_stored"]`` = [stored, total] and a note naming the gap; the caller tells the computed
        cells from the missing ones."""
        if live.meta.get("profile") == profile:
            return live
        store = store or Store()
        try:
            P = self.schema.validate(load_profile(profile, self.section))
            name = self.profile_for(P)
            stored, n, total = self.load(P, name, store)
        except (ParamError, ValueError, OSError):
            return live
        if stored is not None:
            return stored
        if n and prefix is not None:
            full = list(P[prefix])
            for L in range(len(full) - 1, max(min_prefix, 1) - 1, -1):
                part, _, _ = self.load({**P, prefix: full[:L]}, name, store)
                if part is not None:
                    part.meta["note"] = (f"{prefix} up to {full[L - 1]} of the {profile} profile's {full}: "
                                         f"{n} of {total} units of the whole are computed so far")
                    return part
        if n and partial:
            sub = self.params(P)
            units = self.units(sub)
            got = [(u, self.load_unit(store, u, name)) for u in units]
            got = [(u, r) for u, r in got if r is not None]
            from .. import sweep

            part = sweep.assemble(self, sub, [u for u, _ in got], [r for _, r in got], name)
            part.meta["units_stored"] = [len(got), total]
            part.meta["note"] = (f"{len(got)} of {total} units of the {profile} profile are computed so far; "
                                 "the others are not shown")
            return part
        if n:
            live.meta["note"] = f"{n} of {total} units of the {profile}-scale result are computed so far"
        elif store.metas(self.name, profile):
            live.meta["note"] = f"a {profile}-scale result made by older code exists but is stale and is not shown"
        return live


def profile_status(e: Experiment, profile: str = "paper", store: Store | None = None) -> dict:
    """How far ``profile`` is computed for experiment ``e``: units stored for the current code and their total,
    ``state`` (current, partial, stale or missing), ``left_s``, the estimated compute time of the missing units
    that fit this machine, from the stored units' own timings (:func:`sweep.estimate_seconds`: each at the rate of
    the stored units of like cost; nan when none is stored), and ``too_big``, how many
    missing units need more memory (their experiment's ``peak_memory`` model) than ``memory`` describes (this
    machine's device), with their estimated compute time ``too_big_s``; ``stored_s``, the wall time the stored
    units of the current code took when computed (their records' ``wall_s``), and ``threads``, the torch thread
    counts their device lines name."""
    from .. import sweep

    store = store or Store()
    P = e.schema.validate(load_profile(profile, e.section))
    prof = e.profile_for(P)
    units = e.units(e.params(P))
    got = [e.load_unit(store, u, prof) for u in units]
    have = [r is not None for r in got]
    n = sum(have)
    stored_s = sum(float(r.meta.get("wall_s") or 0.0) for r in got if r is not None)
    threads = sorted({int(m.group(1)) for r in got if r is not None
                      for m in [re.search(r"(\d+) torch threads?", str(r.meta.get("device", "")))] if m})
    stale = any(m.get("code") != e.code() for m in store.metas(e.name, prof))
    state = "current" if n == len(units) else "partial" if n else "stale" if stale else "missing"
    left, left_big, too_big, where = 0.0, 0.0, 0, ""
    missing = [u for u, h in zip(units, have) if not h]
    if missing:
        secs, _ = sweep.estimate_seconds(e, store, missing, time_probe=False)
        needs = [e.memory_of(u) for u in missing]
        limit = float("inf")
        if any(x is not None for x in needs):
            limit, where = sweep.InProcess().memory_limit(P.get("device", "auto"))
        big = [x is not None and x > limit for x in needs]
        too_big = sum(big)
        left = sum(x for x, b in zip(secs, big) if not b)
        left_big = sum(x for x, b in zip(secs, big) if b) if any(big) else 0.0
    return {"experiment": e.name, "stored": n, "units": len(units), "state": state, "left_s": float(left),
            "too_big": int(too_big), "too_big_s": float(left_big), "memory": where,
            "stored_s": stored_s, "threads": threads}


def stale_files(e: Experiment, profile: str = "paper", store: Store | None = None) -> list:
    """Files of experiment ``e`` in ``profile`` that can never be shown as current again, for ``prune``: entries
    made by other code (``.json`` and ``.npz``), outcomes of diverged units made by another ``on_diverged``
    handler, and checkpoints of units that are not units of the profile for the current code. Entries of the
    current code are kept even when the profile no longer lists their unit (a rerun with those parameters uses
    them)."""
    from .. import sweep

    store = store or Store()
    units = None
    prof = profile
    try:
        P = e.schema.validate(load_profile(profile, e.section))
        prof = e.profile_for(P)
        units = e.units(e.params(P))
    except (ParamError, OSError):
        pass
    d = store.root / prof / e.name
    out = []
    for m in store.metas(e.name, prof):
        if m.get("code") != e.code() or ("diverged" in m and m.get("outcome_code") != e.outcome_code()):
            out += [p for p in (d / f"{m['key']}.json", d / f"{m['key']}.npz") if p.exists()]
    ck = store.root / prof / ".checkpoints" / e.name
    if units is not None and ck.is_dir():
        keep = {sweep.checkpoint_path(store, prof, e, u).name for u in units}
        out += [p for p in sorted(ck.glob("*.json")) if p.name not in keep]
    return out


def section_status(section: str, profile: str = "paper", store: Store | None = None) -> list[dict]:
    """:func:`profile_status` of every experiment of one notebook (``section``), in registry order."""
    load_chapters()
    return [profile_status(e, profile, store) for e in REGISTRY.values() if e.section == section]


def experiment(section: str, keys: Iterable[str], *, units=None, reduce=None, cost=None, shrink=None,
               diverged=None, name: str | None = None):
    """Decorator: register ``fn`` as the experiment ``<chapter>.<fn name>`` (see the module docstring)."""

    def wrap(fn):
        chapter = fn.__module__.rsplit(".", 1)[-1]
        exp = Experiment(name or f"{chapter}.{fn.__name__}", fn, section, keys, units=units, reduce=reduce,
                         cost=cost, shrink=shrink, diverged=diverged)
        REGISTRY[exp.name] = exp
        return exp

    return wrap


def chapter_names() -> list[str]:
    """Every chapter module of this package (``ch1``, ``ch2``, …), in chapter order."""
    names = [m.name for m in pkgutil.iter_modules(__path__) if m.name.startswith("ch") and not m.ispkg]
    return sorted(names, key=lambda n: (int("".join(c for c in n[2:] if c.isdigit()) or 0), n))


def load_chapters() -> list[str]:
    """Import every chapter module; return their names."""
    for ch in chapter_names():
        importlib.import_module(f"{__name__}.{ch}")
    return chapter_names()


def chapter(name: str):
    return importlib.import_module(f"{__name__}.{name}")


def find(name: str) -> Experiment:
    """The experiment called ``name`` (``ch7.headline``)."""
    if name not in REGISTRY:
        load_chapters()
    try:
        return REGISTRY[name]
    except KeyError:
        raise ParamError(f"unknown experiment {name!r}; known: {sorted(REGISTRY)}") from None


def by_section(section: str):
    """The chapter module whose notebook is ``section`` (e.g. ``ch6_repulsion``)."""
    for ch in load_chapters():
        mod = chapter(ch)
        if getattr(mod, "SECTION", None) == section:
            return mod
    known = sorted(getattr(chapter(c), "SECTION", c) for c in chapter_names())
    raise ParamError(f"no chapter declares notebook {section!r}; notebooks: {known}")


def shown_value(R, P: Mapping[str, Any], key: str, section: str):
    """An analysis parameter that belongs with a shown result ``R`` but is not a key of it (e.g. chapter 5's ``t0``
    for ``curves``, chapter 3's ``lim_tmin`` for ``limit``): the notebook's own value ``P[key]`` when ``R`` is of the
    notebook's profile, else the value in ``R``'s profile, section ``section`` (the paper result shown in a CI build
    is analysed with the paper's choice, fixed in ``params/paper.yaml`` before the result was computed). Falls back
    to ``P[key]`` when that profile cannot be read."""
    prof = R.meta.get("profile")
    if not prof or prof == P.get("profile"):
        return P[key]
    try:
        return load_profile(prof, section).get(key, P[key])
    except (ParamError, OSError, ValueError):
        return P[key]
