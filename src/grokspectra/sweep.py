"""Sweeps: an experiment as a list of small, separately stored units, run by any executor, resumable.

An experiment declares its *units* (JSON-able dicts holding every parameter their computation needs, e.g. one
(student, d, δ, block of seeds)) and a *reduction* that assembles the experiment's arrays from the units' arrays.
:func:`run_units` computes the units the store does not hold yet and writes each one atomically as it finishes, so
a run killed at any moment (``kill -9``) and started again computes only the missing units; since every unit is
seeded from its own parameters, the assembled arrays equal those of an uninterrupted run.

Executors (results identical whichever runs them, at the same torch thread count; the multi-index DMFT amplifies
the roundoff of another thread count to about 1 % of its Monte-Carlo spread, see the README):

* :class:`InProcess` — this process, one unit after another (the default; ``make book`` and CI);
* :class:`DaskExecutor` — ``dask.distributed`` workers: a ``LocalCluster`` of N processes on this machine
  (``--workers N``) or an existing cluster (``--scheduler ADDRESS``). Workers compute units and send the arrays
  back; this process writes the store, so workers need no shared file system.

A unit too long for one sitting can also resume *inside* itself: values it wraps in :func:`memo` (for example the
criterion at each point of a bisection) are kept in a checkpoint file in the profile's store while the unit runs
(``<store>/<profile>/.checkpoints/<experiment>/<key>.json``, removed once the unit is stored; committed with
``results/paper``, it carries a unit across sessions), and a restarted unit takes them from there instead of
recomputing them; deterministic seeding makes the result the same.

Chapters know nothing of executors: they only declare units and a reduction (:mod:`grokspectra.experiments`).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from . import progress
from .device import DivergenceError
from .store import Result, Store, to_numpy


class SweepError(RuntimeError):
    """An executor could not be set up or lost its work (message names the address or the unit)."""


class UnitsDiverged(DivergenceError):
    """Some units of a ``keep_going`` sweep diverged and were skipped; every other unit was computed and stored."""


class UnitsTooLarge(SweepError):
    """Some units need more memory than the device has (their experiment's ``peak_memory`` model) and were not
    started; every other unit was computed and stored."""


class Checkpoint:
    """The values one unit has computed so far (JSON: key → value), the compute time spent in earlier, interrupted
    attempts, and the kind of device they ran on; every :meth:`put` rewrites the file atomically.

    Values computed on another kind of device (a checkpoint carried from a CPU session to a borrowed GPU, or back)
    are not used: the random streams of a CPU and a GPU generator differ, so mixing them would break the unit's
    common random numbers and make it equal to neither device's uninterrupted run. The unit then starts afresh (and
    ``discarded`` counts the values set aside). Files without a device were written on a CPU."""

    def __init__(self, path: str | Path, device: str = "cpu"):
        self.path, self.device = Path(path), str(device)
        self.t0 = time.perf_counter()
        self.discarded = 0
        try:
            data = json.loads(self.path.read_text())
            self.entries, self.spent = dict(data["entries"]), float(data["spent_s"])
            if str(data.get("device", "cpu")) != self.device:
                self.discarded, self.entries, self.spent = len(self.entries), {}, 0.0
        except (OSError, ValueError, KeyError, TypeError):  # none yet, or unreadable: start afresh
            self.entries, self.spent = {}, 0.0

    def elapsed(self) -> float:
        """Seconds of compute of this unit in all attempts so far."""
        return self.spent + time.perf_counter() - self.t0

    def put(self, key: str, value) -> None:
        self.entries[key] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"entries": self.entries, "spent_s": self.elapsed(), "device": self.device}, f)
        os.replace(tmp, self.path)


_CKPT: Checkpoint | None = None  # the checkpoint of the unit being computed in this process, if any


def memo(key: str, fn):
    """``fn()``, or its value kept in the running unit's checkpoint (JSON-able values; the same ``key`` must always
    mean the same computation within a unit). Outside a checkpointed unit it simply returns ``fn()``."""
    if _CKPT is None:
        return fn()
    if key not in _CKPT.entries:
        _CKPT.put(key, fn())
    return _CKPT.entries[key]


def unit_elapsed(t0: float) -> float:
    """Seconds the running unit has computed: since ``t0`` (a ``time.perf_counter()``), or, in a checkpointed
    unit, in all its attempts."""
    return _CKPT.elapsed() if _CKPT is not None else time.perf_counter() - t0


def checkpoint_path(store: Store, profile: str, exp, unit: dict) -> Path:
    from .store import make_key

    return store.root / profile / ".checkpoints" / exp.name / f"{make_key(exp.name, unit, exp.code())}.json"


def _compute(name: str, code: str, unit: dict, device: str, threads: int | None, ckpt: str | None = None):
    """Compute one unit of experiment ``name`` (runs in a worker process). Checks that the worker's code has the
    same version as the client's, so a cluster with another checkout never mixes results. With ``ckpt`` (a path),
    values the unit wraps in :func:`memo` are kept there, and the wall time returned includes earlier attempts.

    Subnormal floats are flushed to zero (``torch.set_flush_denormal``): late in a grokking run many Adam second
    moments g² fall below 1.2·10⁻³⁸, and on x86 CPUs arithmetic on subnormals is tens of times slower (a ch. 7
    grid unit slowed from 1 s to over 6 s per epoch). The values flushed are far below any tolerance of the book."""
    global _CKPT
    import torch

    from . import experiments
    from .device import device_name, get_device

    if threads:
        torch.set_num_threads(int(threads))
    torch.set_flush_denormal(True)  # see the docstring: subnormals make late CPU training steps crawl
    exp = experiments.find(name)
    if exp.code() != code:
        raise SweepError(f"worker code version {exp.code()} of {name} differs from the client's {code}: "
                         "install the same checkout on every worker")
    dev = get_device(device)
    t0 = time.perf_counter()
    _CKPT = Checkpoint(ckpt, dev.type) if ckpt else None
    if _CKPT is not None and _CKPT.discarded:
        log(f"{name}: the checkpoint {ckpt} holds {_CKPT.discarded} value(s) computed on another kind of device "
            f"than {dev.type}; the unit starts afresh (random streams differ between devices)")
    try:
        arrays = {k: to_numpy(v) for k, v in exp.fn(dict(unit), dev).items()}
        wall = _CKPT.elapsed() if _CKPT is not None else time.perf_counter() - t0
    finally:
        _CKPT = None
    return arrays, wall, device_name(dev)


class InProcess:
    """Compute units here, one after another."""

    name = "in-process"

    def map(self, exp, units: Sequence[dict], device: str, ckpts: Sequence[str | None] | None = None,
            keep_going: bool = False) -> Iterator[tuple[int, dict | DivergenceError, float, str]]:
        """(unit index, arrays, wall time, device) per unit; with ``keep_going`` a unit that diverges yields its
        :class:`DivergenceError` in place of the arrays and the others go on."""
        for i, u in enumerate(units):
            try:
                arrays, wall, dev = _compute(exp.name, exp.code(), u, device, None, ckpts[i] if ckpts else None)
            except DivergenceError as err:
                if not keep_going:
                    raise
                arrays, wall, dev = err, 0.0, ""
            yield i, arrays, wall, dev

    def memory_limit(self, device: str) -> tuple[float, str]:
        """Bytes one unit may use here, and where that figure comes from (:func:`~grokspectra.device.device_memory`)."""
        from .device import device_memory, get_device

        return device_memory(get_device(device))

    def close(self) -> None:
        pass


class DaskExecutor:
    """Compute units on ``dask.distributed`` workers; results come back as numpy arrays."""

    def __init__(self, client, threads_per_worker: int = 1, owns_cluster: bool = False):
        self.client, self.threads, self.owns = client, threads_per_worker, owns_cluster
        self.name = f"dask {client.scheduler.address}"

    def map(self, exp, units: Sequence[dict], device: str, ckpts: Sequence[str | None] | None = None,
            keep_going: bool = False) -> Iterator[tuple[int, dict | DivergenceError, float, str]]:
        """As :meth:`InProcess.map`, in the order the units finish."""
        from distributed import KilledWorker, as_completed

        futs = {self.client.submit(_compute, exp.name, exp.code(), u, device, self.threads,
                                   ckpts[i] if ckpts else None, pure=False,
                                   key=f"{exp.name}-{i}-{time.time_ns()}"): i for i, u in enumerate(units)}
        for fut in as_completed(futs):
            try:
                arrays, wall, dev = fut.result()  # a lost worker's unit is rescheduled by dask; errors re-raise here
            except DivergenceError as err:
                if not keep_going:
                    raise
                arrays, wall, dev = err, 0.0, ""
            except KilledWorker as err:  # every worker that tried the unit died: most often it ran out of memory
                limit = _worker_memory_limit(self.client)
                raise SweepError(f"{exp.name}: unit {futs[fut]} ({describe(units[futs[fut]], 60)}) killed every "
                                 f"worker that ran it ({err}). A worker is stopped when it exceeds its memory limit"
                                 f"{limit}: run this experiment with fewer workers (--workers 1, or without "
                                 "--workers); the units stored so far are kept") from None
            yield futs[fut], arrays, wall, dev

    def memory_limit(self, device: str) -> tuple[float, str]:
        """Bytes one unit may use on a worker: the smallest worker memory limit (Dask stops a worker above 95 % of
        it), or, for GPU units or workers without a limit, the device's memory as seen from here."""
        try:
            lims = [w.get("memory_limit") for w in self.client.scheduler_info()["workers"].values()]
        except Exception:  # noqa: BLE001 - no limit known: fall back to this machine's device
            lims = []
        lims = [float(x) for x in lims if x]
        if lims and not str(device).startswith("cuda"):
            return 0.95 * min(lims), f"a Dask worker's {0.95 * min(lims) / 2 ** 30:.1f} GiB (95 % of its limit)"
        return InProcess().memory_limit(device)

    def close(self) -> None:
        cluster = getattr(self.client, "cluster", None) if self.owns else None
        self.client.close()
        if cluster is not None:
            cluster.close()


def _worker_memory_limit(client) -> str:
    """' (N GiB here)', the smallest memory limit of the cluster's workers, or '' when it is not known."""
    try:
        lims = [w.get("memory_limit") for w in client.scheduler_info()["workers"].values()]
        lims = [x for x in lims if x]
        return f" ({min(lims) / 2 ** 30:.1f} GiB here)" if lims else ""
    except Exception:  # noqa: BLE001 - only a hint in an error message
        return ""


def make_executor(workers: int | None = None, scheduler: str | None = None, timeout_s: float = 30.0):
    """The in-process executor, a LocalCluster of ``workers`` processes (one torch thread each), or a client of
    the Dask cluster at ``scheduler``. A scheduler that does not answer within ``timeout_s`` raises
    :class:`SweepError` naming the address."""
    if workers is None and scheduler is None:
        return InProcess()
    if workers is not None and scheduler is not None:
        raise SweepError("give either --workers N (a local cluster) or --scheduler ADDRESS, not both")
    try:
        from distributed import Client, LocalCluster
    except ImportError as err:  # pragma: no cover - dask is a pinned dependency
        raise SweepError(f"dask.distributed is not installed ({err}); run `make venv`") from None
    if scheduler is not None:
        try:
            client = Client(scheduler, timeout=f"{int(timeout_s)}s")
        except (OSError, TimeoutError) as err:
            raise SweepError(f"no Dask scheduler answered at {scheduler!r} within {timeout_s:.0f} s ({err})") from None
        return DaskExecutor(client, threads_per_worker=1)
    if workers < 1:
        raise SweepError(f"--workers must be >= 1, got {workers}")
    import logging

    for name in ("distributed", "distributed.nanny", "distributed.scheduler", "distributed.worker"):
        logging.getLogger(name).setLevel(logging.ERROR)
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "GROKSPECTRA_THREADS": "1"}
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                           env=env)
    return DaskExecutor(Client(cluster), threads_per_worker=1, owns_cluster=True)


def run_units(exp, units: Sequence[dict], *, profile: str, store: Store, device: str = "auto",
              executor=None, force: bool = False, show: bool = True, keep_going: bool = False,
              max_memory: float | None = None) -> list[Result]:
    """Load or compute every unit of ``exp``; return their results in order.

    Stored units (current code, intact files) are loaded; the others are computed by ``executor`` and each is
    written to the store as soon as it arrives, so an interruption loses at most the units in flight.

    With ``keep_going`` (the CLI's sweeps), a unit whose computation diverges
    (:class:`~grokspectra.device.DivergenceError`) is skipped: every other unit is computed (in parallel on a
    cluster, as without it) and stored, and then :class:`UnitsDiverged` names the skipped ones. Without it the
    first divergence stops the sweep. A diverged unit whose experiment has a ``diverged`` handler that gives its
    outcome (:meth:`~grokspectra.experiments.Experiment.outcome`) is stored with that outcome instead, marked with
    the error.

    A unit whose estimated peak memory (the experiment's ``peak_memory`` model) exceeds ``max_memory`` bytes
    (default: what the executor's device has in all, :meth:`InProcess.memory_limit`) is not started, so that it
    neither gets killed by the operating system hours in nor pushes the machine into swap: every other unit is
    computed and stored, and then :class:`UnitsTooLarge` names the units left out and what each needs.
    """
    executor = executor or InProcess()
    code = exp.code()
    store.check_writable(profile, exp.name)
    store.clean_partial(profile, exp.name)
    results: list[Result | None] = [None] * len(units)
    todo = []
    for i, u in enumerate(units):
        hit = None if force else exp.load_unit(store, u, profile)
        if hit is None:
            todo.append(i)
        else:
            results[i] = hit
    too_big, needs = [], {i: exp.memory_of(units[i]) for i in todo}
    if any(x is not None for x in needs.values()):
        limit, where = (float(max_memory), f"--max-memory {max_memory / 2 ** 30:g} GiB") if max_memory \
            else executor.memory_limit(device)
        too_big = [(i, x) for i, x in needs.items() if x is not None and x > limit]
        if too_big:
            todo = [i for i in todo if i not in dict(too_big)]
            log(f"{exp.name}: {len(too_big)} unit(s) need more memory than {where} and are not started "
                f"(the others are computed first): " + ", ".join(str(i) for i, _ in too_big))
    if todo:
        bar = progress.bar(total=len(units), initial=len(units) - len(todo), desc=f"{exp.name} units",
                           unit="unit", disable=not show)
        failed = []
        try:
            ckpts = [str(checkpoint_path(store, profile, exp, units[i])) for i in todo]
            handled = exp.outcome_code() is not None
            for j, arrays, wall, dev in executor.map(exp, [units[i] for i in todo], device, ckpts,
                                                     keep_going=keep_going or handled):
                i = todo[j]
                extra = {"unit": i, "units": len(units), "cost": float(exp.cost_of(units[i]))}
                if isinstance(arrays, DivergenceError):
                    out = exp.outcome(units[i], arrays)
                    if out is None and not keep_going:
                        raise arrays
                    if out is None:  # keep_going: skip it, compute the others
                        failed.append((i, arrays))
                        log(f"{exp.name}: unit {i} ({describe(units[i], 60)}) diverged, skipped: {arrays}")
                        continue
                    log(f"{exp.name}: unit {i} ({describe(units[i], 60)}) diverged; its outcome is stored: {arrays}")
                    arrays, extra = out["arrays"], {**extra, **out["extra"]}
                    dev = dev or _device_name(device)
                results[i] = store.save(exp.name, units[i], code, profile, arrays, device=dev, wall_s=wall,
                                        extra=extra)
                Path(ckpts[j]).unlink(missing_ok=True)
                bar.update(1)
        finally:
            bar.close()
        if failed:
            raise UnitsDiverged(f"{len(failed)} of {len(units)} units diverged and were not stored (the others "
                                "are): " + "; ".join(f"unit {i} ({describe(units[i], 60)}): {e}" for i, e in failed)
                                + (f"; and {too_big_text(exp, units, too_big, where)}" if too_big else ""))
    if too_big:
        raise UnitsTooLarge(too_big_text(exp, units, too_big, where))
    return results


def too_big_text(exp, units: Sequence[dict], too_big: Sequence[tuple[int, float]], where: str) -> str:
    """What :class:`UnitsTooLarge` says: which units were not started, what each needs, and what to do."""
    needs = "; ".join(f"unit {i} ({describe(units[i], 60)}) needs {fmt_bytes(n)}" for i, n in too_big)
    return (f"{len(too_big)} of {len(units)} units were not started, since each needs more memory than {where} "
            f"(estimated peak: {needs}); every other unit is stored. Compute them on a machine with more memory "
            "(a large GPU: --device cuda), or give --max-memory GIB if the estimate is too cautious for this one")


def fmt_bytes(b: float) -> str:
    """Bytes in decimal units: '820 MB', '82 GB'."""
    for unit, f in (("GB", 1e9), ("MB", 1e6)):
        if b >= f:
            return f"{b / f:.3g} {unit}" if b / f < 100 else f"{b / f:.0f} {unit}"
    return f"{b / 1e3:.0f} kB"  # type: ignore[return-value]


def _device_name(device: str) -> str:
    from .device import device_name, get_device

    return device_name(get_device(device))


def assemble(exp, params: Mapping, units: Sequence[dict], results: Sequence[Result], profile: str) -> Result:
    """The experiment's result: its reduction of the units' arrays, with provenance merged from the units."""
    arrays = exp.reduce_units(dict(params), list(units), [dict(r.arrays) for r in results])
    metas = [r.meta for r in results]

    def merged(key: str) -> str:
        """One value, two joined by '+', or the first and last (by date) and how many."""
        by_date = sorted(metas, key=lambda m: str(m.get("date", "")))
        vals = list(dict.fromkeys(str(m.get(key, "?")) for m in by_date))
        if len(vals) <= 2:
            return " + ".join(vals)
        return f"{vals[0]} … {vals[-1]} ({len(vals)} {key}s)"

    from .store import canonical, make_key

    meta = {"experiment": exp.name, "profile": profile, "params": canonical(dict(params)), "code": exp.code(),
            "key": make_key(exp.name, params, exp.code()), "units": len(units), "device": merged("device"),
            "commit": merged("commit"), "torch": merged("torch"),
            "date": max(str(m.get("date", "")) for m in metas) if metas else "",
            "wall_s": float(sum(float(m.get("wall_s", 0.0)) for m in metas))}
    return Result({k: to_numpy(v) for k, v in arrays.items()}, meta)


def estimate_rate(exp, store: Store, device: str = "auto", time_probe: bool = True) -> tuple[float, str]:
    """Seconds per unit of cost for ``exp``: from its stored units (any profile, current code) when there are
    some — their total seconds over their total cost, so that the large units, whose time is what is estimated,
    weigh most and a small profile's many short units (overhead-bound) barely count — else from timing the
    shrunken cheapest unit of its ``ci`` profile (``time_probe``). Returns ``(rate, how)``; ``rate`` is NaN when
    neither is possible."""
    if exp._cost is None and len(exp.units(exp.params(_ci(exp)))) <= 1:
        # one unit whose size changes with the profile and no cost model: a timing would not scale
        rates = [float(m["wall_s"]) for m in store.metas(exp.name) if m.get("code") == exp.code()
                 and m.get("profile") == "paper"]
        return (float(rates[0]), "stored") if rates else (float("nan"), "no cost model for this experiment")
    walls, costs = _stored_timings(exp, store)
    if walls:
        return float(sum(walls) / sum(costs)), f"from {len(walls)} stored unit(s)"
    if not time_probe:
        return float("nan"), "no stored unit to time"
    probe = exp.probe_unit()
    if probe is None:
        return float("nan"), "no probe unit"
    arrays, wall, _ = _compute(exp.name, exp.code(), probe, device, None)
    return wall / max(exp.cost_of(probe), 1e-12), f"timed a probe unit ({wall:.1f} s)"


# A stored unit is "like" a unit to estimate when their costs lie within this factor of each other.
LIKE = 2.0


def estimate_seconds(exp, store: Store, units: Sequence[Mapping], device: str = "auto",
                     time_probe: bool = True) -> tuple[list[float], str]:
    """Estimated seconds of each of ``units``: its cost times the rate (total seconds over total cost) of the stored
    units *like it*, those whose cost lies within a factor :data:`LIKE` of its own, or, where none is, times
    :func:`estimate_rate` over all of them. A cost model can be off by a factor that depends on the kind of unit and
    on the host (chapter 3's widest DMFT cells run their BLAS products at half the bandwidth of the narrower ones on
    some CPUs, so the rate of all its cells put them at 28 min where the two computed ones took 73 and 23); units
    of like cost are the nearest measurement of that factor. Returns ``(seconds, how)``."""
    rate, how = estimate_rate(exp, store, device=device, time_probe=time_probe)
    walls, costs = _stored_timings(exp, store)
    out, near = [], 0
    for u in units:
        c = exp.cost_of(u)
        like = [(w, k) for w, k in zip(walls, costs) if exp._cost is not None and k / LIKE <= c <= k * LIKE]
        if like:
            near += 1
            out.append(c * sum(w for w, _ in like) / sum(k for _, k in like))
        else:
            out.append(c * rate)
    if near:
        how += f"; {near} of {len(out)} at the rate of the stored units of like cost (within {LIKE:g}×)"
    return out, how


def _stored_timings(exp, store: Store) -> tuple[list[float], list[float]]:
    """The wall seconds and costs (under today's model) of the stored units of ``exp`` made by the current code,
    any profile; a diverged unit's outcome, which took no compute worth timing, is left out."""
    walls, costs = [], []
    for m in store.metas(exp.name):
        cost = _stored_cost(exp, m)
        if m.get("code") == exp.code() and cost > 0 and m.get("wall_s") == m.get("wall_s") \
                and "diverged" not in m:
            walls.append(float(m["wall_s"]))
            costs.append(cost)
    return walls, costs


def _stored_cost(exp, meta: Mapping) -> float:
    """A stored unit's cost under the current cost model, from its parameters (the cost recorded with it may come
    from an older model, or from none); the recorded cost when its parameters do not fit the model."""
    try:
        return exp.cost_of(meta["params"])
    except (KeyError, TypeError, ValueError):
        return float(meta.get("cost") or 0.0)


def blocks(seeds: Sequence[int], size: int) -> list[list[int]]:
    """``seeds`` cut into consecutive blocks of at most ``size`` (the seed blocks of a sweep's units)."""
    seeds = [int(s) for s in seeds]
    return [seeds[i:i + size] for i in range(0, len(seeds), size)]


def concat_runs(results: Sequence[Mapping[str, np.ndarray]], shared: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """Per-run arrays of several units joined along their first (run) axis, in unit order; the names in
    ``shared`` (the same in every unit, e.g. the epochs of the Gram diagnostics) are taken from the first."""
    out = {}
    for k in results[0]:
        out[k] = np.asarray(results[0][k]) if k in shared else np.concatenate([np.asarray(r[k]) for r in results], 0)
    return out


def _ci(exp) -> dict:
    from .params import load_profile

    return load_profile("ci", exp.section)


def describe(unit: Mapping, width: int = 90) -> str:
    """A one-line summary of a unit's parameters (lists shortened)."""
    def short(v: Any) -> str:
        if isinstance(v, list) and len(v) > 4:
            return f"[{short(v[0])}…{short(v[-1])}]({len(v)})"
        return str(v)

    text = ", ".join(f"{k}={short(v)}" for k, v in unit.items())
    return text if len(text) <= width else text[:width - 1] + "…"


def fmt_seconds(s: float) -> str:
    if s != s:
        return "?"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)

