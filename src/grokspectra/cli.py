"""Command line: compute experiments into the store without Jupyter (GPU machines have no Jupyter stack).

    python -m grokspectra list
    python -m grokspectra run ch6 --profile paper          # every experiment of chapter 6
    python -m grokspectra run ch6.fig3 --profile ci --set seeds=3
    python -m grokspectra run all --profile paper
    python -m grokspectra run ch7 --profile paper --workers 2        # a local Dask cluster of 2 processes
    python -m grokspectra run ch7 --profile paper --scheduler tcp://host:8786
    python -m grokspectra run all --profile paper --dry-run          # units and estimated cost
    python -m grokspectra status --profile paper                     # units stored / total, time left
    python -m grokspectra prune --profile paper --dry-run            # stale entries and checkpoints
    python -m grokspectra params ci ch6_repulsion           # the YAML papermill gets for a notebook
    python -m grokspectra bench modadd --device cuda
    python -m grokspectra pack results-paper.tar.gz         # archive results/paper (to bring back from a GPU)
    python -m grokspectra check ch1_dmft -p eta 1e-3 -y "ds: [250, 500]"   # validate as papermill will read them

Bad input (an unknown or out-of-range parameter, a malformed profile, an unavailable device, a bad
$GROKSPECTRA_THREADS) and diverged computations end with one line `error: ...` on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import yaml

from . import experiments as ex
from . import sweep
from .device import DeviceUnavailable, DivergenceError, SettingError, choose_threads, get_device
from .params import ParamError, load_profile, parse_value, parse_yaml
from .store import Store, StoreError, default_root

#: exit status of every input or divergence error (argparse uses the same for a malformed command line)
EXIT_INPUT = 2


def _value(text: str):
    """A ``--set`` value: papermill's rules for ``-p`` (:func:`grokspectra.params.parse_value`)."""
    return parse_value(text)


def _targets(target: str) -> list[ex.Experiment]:
    ex.load_chapters()
    if target == "all":
        return [ex.REGISTRY[n] for n in sorted(ex.REGISTRY, key=_order)]
    if target in ex.REGISTRY:
        return [ex.REGISTRY[target]]
    chosen = [ex.REGISTRY[n] for n in sorted(ex.REGISTRY, key=_order) if n.split(".")[0] == target]
    if not chosen:
        raise SystemExit(f"error: unknown experiment or chapter {target!r}; known: {sorted(ex.REGISTRY)}")
    return chosen


def _order(name: str):
    ch = ex.chapter_names()
    head = name.split(".")[0]
    return (ch.index(head) if head in ch else len(ch), name)


def _overrides(a) -> dict:
    """``--set KEY=VALUE`` and ``-p KEY VALUE`` overrides, parsed like papermill's ``-p``."""
    pairs = []
    for item in a.set or []:
        if "=" not in item:
            raise SystemExit(f"error: --set expects key=value, got {item!r}")
        pairs.append(item.split("=", 1))
    pairs += [list(x) for x in (a.p or [])]
    out = {k: _value(v) for k, v in pairs}
    for text in a.y or []:  # papermill's -y: a YAML mapping (the way to give a list)
        out.update(parse_yaml(text, f"-y {text!r}"))
    for k in out:
        if k in ("profile", "device"):
            raise SystemExit(f"error: {k!r} cannot be overridden with --set/-p/-y; use --{k}")
    return out


def _resolve(e: ex.Experiment, a, overrides: dict) -> dict:
    """The validated parameters of experiment ``e`` for the command line's profile, overrides and device."""
    try:
        P = load_profile(a.profile, e.section)
        P.update({k: v for k, v in overrides.items() if k in e.schema})
        if a.device:
            P["device"] = a.device
        return e.schema.validate(P)
    except ParamError as err:
        raise SystemExit(f"error: {e.name}: {err}")


def _check_overrides(targets, overrides: dict) -> None:
    known = set().union(*(set(e.schema.params) for e in targets)) if targets else set()
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise SystemExit(f"error: unknown parameter(s) {unknown} for {[e.name for e in targets]}")


def cmd_run(a) -> int:
    os.environ.setdefault("GROKSPECTRA_PROGRESS", "1")
    overrides = _overrides(a)
    store = Store(a.store) if a.store else Store()
    targets = _targets(a.target)
    _check_overrides(targets, overrides)
    for e in targets:  # every code version now, from the source this process imported: hashed later, an edit of a
        e.code()       # source file in between (a long sweep) would be read at the old line numbers
    plans = [(e, _resolve(e, a, overrides)) for e in targets]
    if a.dry_run:
        return _dry_run(plans, store, a)
    try:
        executor = sweep.make_executor(a.workers, a.scheduler)
    except sweep.SweepError as err:
        raise SystemExit(f"error: {err}")
    diverged = []  # experiments with units that diverged or do not fit: the sweep goes on with every other one
    max_memory = _max_memory(a)
    try:
        for e, P in plans:
            t0 = time.perf_counter()
            try:
                r = e.run(P, store=store, force=a.force, executor=executor, keep_going=True, max_memory=max_memory)
            except (sweep.UnitsDiverged, sweep.UnitsTooLarge) as err:
                diverged.append(str(err))
                print(f"{e.name:22s} incomplete: {err}", file=sys.stderr, flush=True)
                continue
            print(f"{e.name:22s} {r.meta.get('units', 1):4d} unit(s)  {r.meta['wall_s']:9.1f} s computed, "
                  f"{time.perf_counter() - t0:8.1f} s now  [{r.meta['profile']} on {r.meta['device']}]", flush=True)
    except (DivergenceError, StoreError, sweep.SweepError) as err:
        raise SystemExit(f"error: {err}")
    finally:
        executor.close()
    if diverged:
        raise SystemExit("error: " + "\n".join(diverged))
    return 0


def _max_memory(a) -> float | None:
    """``--max-memory GIB`` in bytes (None: the device's own memory)."""
    if a.max_memory is None:
        return None
    if not a.max_memory > 0:
        raise SystemExit(f"error: --max-memory must be a positive number of GiB, got {a.max_memory}")
    return a.max_memory * 2 ** 30


def _memory_note(e: ex.Experiment, u: dict, limit: float) -> str:
    """A unit's estimated peak memory for the dry-run listing, marked ``!`` when it exceeds ``limit``."""
    need = e.memory_of(u)
    if need is None:
        return ""
    return f"{sweep.fmt_bytes(need)}{'!' if need > limit else ''}"


def _dry_run(plans, store: Store, a) -> int:
    """List every unit, whether it is stored, its estimated time (from stored units or a timed probe) and, where
    its experiment has a memory model, its estimated peak memory (``!``: more than the device has; such a unit
    would not be started)."""
    total_left, unknown = 0.0, 0
    max_memory = _max_memory(a)
    for e, P in plans:
        profile = e.profile_for(P)
        units = e.units(e.params(P))
        have = [e.load_unit(store, u, profile) is not None for u in units]
        missing = [i for i, h in enumerate(have) if not h]
        est, how = sweep.estimate_seconds(e, store, [units[i] for i in missing], device=P.get("device", "auto"),
                                          time_probe=not a.no_probe) if missing else ([], "nothing left")
        secs = dict(zip(missing, est))
        left = sum(est)
        total_left += left if left == left else 0.0
        unknown += left != left
        print(f"{e.name} [{profile}]: {sum(have)}/{len(units)} units stored; estimated time left "
              f"{sweep.fmt_seconds(left)} ({how})")
        limit, where = (max_memory, "--max-memory") if max_memory else \
            sweep.InProcess().memory_limit(P.get("device", "auto"))
        if a.workers and not max_memory and limit == limit:  # a local cluster splits the memory among its workers
            limit = 0.95 * limit / a.workers
            where = f"a Dask worker's {limit / 2 ** 30:.1f} GiB (95 % of 1/{a.workers} of {where})"
        mem = [_memory_note(e, u, limit) for u in units]
        if any(mem):
            print(f"  (peak memory estimated per unit; '!': more than {where}, so it would not be started)")
        for i, (u, h) in enumerate(zip(units, have)):
            est = "stored" if h else sweep.fmt_seconds(secs[i])
            print(f"  {i:4d}  {est:>8s}  {mem[i]:>7s}  {sweep.describe(u)}")
    print(f"estimated time left in all: {sweep.fmt_seconds(total_left)} on this machine's device(s)"
          + (f", plus {unknown} experiment(s) with no estimate" if unknown else ""))
    return 0


def cmd_status(a) -> int:
    """Per experiment: units stored / total, whether the assembled result is current, partial, stale or missing,
    and the estimated CPU time left (from the stored units' own timings)."""
    store = Store(a.store) if a.store else Store()
    ex.load_chapters()
    rows, chapters = [], {}
    total_left, total_big, unknown = 0.0, 0.0, 0
    for name in sorted(ex.REGISTRY, key=_order):
        e = ex.REGISTRY[name]
        try:
            e.schema.validate(load_profile(a.profile, e.section))
        except ParamError as err:
            rows.append((name, "-", "no parameters", "-", str(err)[:60]))
            continue
        st = ex.profile_status(e, a.profile, store)
        left = st["left_s"]
        total_big += st["too_big_s"]
        total_left += left if left == left else 0.0
        unknown += left != left
        big = st.get("too_big", 0)
        ch = chapters.setdefault(name.split(".")[0], [0.0, set()])
        ch[0] += st["stored_s"]
        ch[1].update(st["threads"])
        took = sweep.fmt_seconds(st["stored_s"]) if st["stored"] else "-"
        rows.append((name, f"{st['stored']}/{st['units']}", st["state"], took,
                     (sweep.fmt_seconds(left) if st["stored"] < st["units"] else "0")
                     + (f" here, + {sweep.fmt_seconds(st['too_big_s'])} in {big} unit(s) that need more memory than "
                        f"{st['memory']}" if big else "")))
    print(f"profile {a.profile} in {store.root}")
    print(f"{'experiment':22s} {'units':>9s}  {'result':8s}  {'took':>8s}  est. time left")
    for r in rows:
        print(f"{r[0]:22s} {r[1]:>9s}  {r[2]:8s}  {r[3]:>8s}  {r[4]}")
    print("took: the wall time the stored units of the current code took when computed (their records' wall_s);"
          " per chapter:")
    for ch, (secs, threads) in chapters.items():
        on = f" on {'/'.join(map(str, sorted(threads)))} torch thread(s)" if threads else ""
        print(f"  {ch:6s} {sweep.fmt_seconds(secs):>8s}{on}")
    print(f"  {'all':6s} {sweep.fmt_seconds(sum(c[0] for c in chapters.values())):>8s}")
    print(f"estimated time left in all: {sweep.fmt_seconds(total_left)}"
          + (f" on this machine, + {sweep.fmt_seconds(total_big)} in units that need more memory than it has"
             if total_big else "")
          + (f", plus {unknown} experiment(s) with no stored unit to time ('?'; see run --dry-run)" if unknown else ""))
    return 0


def cmd_prune(a) -> int:
    """Remove (or with --dry-run list) the files of every experiment's stale entries and stale checkpoints in a
    profile (:func:`~grokspectra.experiments.stale_files`): they are never shown as current, and committed they
    only make ``results/paper`` larger."""
    store = Store(a.store) if a.store else Store()
    ex.load_chapters()
    files = []
    for name in sorted(ex.REGISTRY, key=_order):
        files += ex.stale_files(ex.REGISTRY[name], a.profile, store)
    size = sum(p.stat().st_size for p in files)
    for p in files:
        print(f"{'would remove' if a.dry_run else 'removed'} {p}")
        if not a.dry_run:
            p.unlink()
    print(f"{len(files)} stale file(s), {size / 1e6:.1f} MB{' (nothing removed: --dry-run)' if a.dry_run else ''}")
    return 0


def cmd_list(a) -> int:
    ex.load_chapters()
    for n in sorted(ex.REGISTRY, key=_order):
        e = ex.REGISTRY[n]
        print(f"{n:22s} notebook {e.section:20s} keys {', '.join(e.keys)}")
    return 0


def cmd_params(a) -> int:
    P = load_profile(a.profile, a.section)
    sys.stdout.write(yaml.safe_dump(P, sort_keys=True))
    return 0


def cmd_bench(a) -> int:
    benches = {}
    for ch in ex.load_chapters():
        benches.update(getattr(ex.chapter(ch), "BENCHMARKS", {}))
    if a.name not in benches:
        raise SystemExit(f"error: unknown benchmark {a.name!r}; known: {sorted(benches)}")
    kw = {"against": a.against} if a.against else {}
    if kw and "against" not in inspect.signature(benches[a.name]).parameters:
        raise SystemExit(f"error: benchmark {a.name!r} takes no --against")
    sizes = [n for n, p_ in inspect.signature(benches[a.name]).parameters.items()
             if n not in ("device", "quick", "against") and p_.kind == p_.KEYWORD_ONLY]
    for item in a.size or []:
        key, eq, val = item.partition("=")
        if key not in sizes or not eq:
            raise SystemExit(f"error: benchmark {a.name!r} takes --size KEY=N with KEY in {sizes or 'none'}; "
                             f"got {item!r}")
        if not (val.isdigit() and int(val) >= 1):
            raise SystemExit(f"error: --size {key}: expected a positive integer, got {val!r}")
        kw[key] = int(val)
    try:
        out = benches[a.name](device=a.device or "auto", quick=a.quick, **kw)
    except (ValueError, FileNotFoundError) as err:  # a missing --against, an unknown device: one clear line
        raise SystemExit(f"error: bench {a.name}: {err}")
    print(json.dumps(out, indent=1))
    return 0


def chapter_of(section: str):
    """The chapter module whose notebook is ``section`` (e.g. ``ch6_repulsion`` → ``experiments.ch6``)."""
    try:
        return ex.by_section(section)
    except ParamError as err:
        raise SystemExit(f"error: {err}")


def resolved_params(section: str, profile: str, yamls=(), ps=(), raws=()) -> dict:
    """A notebook's parameters exactly as papermill will inject them: the profile's section (papermill's ``-f``),
    then every ``-y`` YAML mapping, then every ``-p NAME VALUE`` (:func:`~grokspectra.params.parse_value`), then
    every ``-r NAME VALUE`` (raw text), in papermill's order; validated by the notebook's schema, and the device
    checked to exist on this machine. Raises :class:`ParamError` naming the parameter."""
    mod = chapter_of(section)
    try:
        P = load_profile(profile, section)
        for text in yamls:
            P.update(parse_yaml(text, f"-y {text!r}"))
        for name, value in ps:
            P[name] = parse_value(value)
        for name, value in raws:
            P[name] = value
        P = mod.SCHEMA.validate(P)
        if "device" in P:
            try:
                get_device(P["device"])
            except DeviceUnavailable as err:
                raise ParamError(f"parameter 'device' = {P['device']!r}: {err}") from None
    except ParamError as err:
        raise ParamError(f"notebook {section}: {err}") from None
    return P


def params_id(P: dict) -> str:
    """A short hash of resolved parameters: names a rerun's outputs (``build/runs/<notebook>-<id>/``)."""
    text = json.dumps(P, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def cmd_check(a) -> int:
    """Validate a profile's parameters plus papermill-style overrides before running; ``--id`` prints the short
    hash of the resolved parameters (``make run`` names its outputs by it)."""
    P = resolved_params(a.section, a.profile, a.y or [], a.p or [], a.r or [])
    if a.write_params:
        Path(a.write_params).write_text(yaml.safe_dump(P, sort_keys=True))
    if a.id:
        print(params_id(P))
    return 0


def cmd_pack(a) -> int:
    """Archive ``<store>/<profile>`` atomically (a temporary file renamed on success); leftover temporary files of
    interrupted writes (``*.tmp``) are never packed."""
    store = default_root()
    have = sorted(p.name for p in store.iterdir() if p.is_dir()) if store.is_dir() else []
    if Path(a.profile).name != a.profile or a.profile.startswith(".") or a.profile not in have:
        raise ParamError(f"pack: no results for profile {a.profile!r} in {store}; profiles with results: {have}")
    root = store / a.profile
    out = Path(a.out)
    if not out.parent.is_dir():
        raise ParamError(f"pack: the folder of {str(out)!r} does not exist")

    def keep(info: tarfile.TarInfo):
        return None if info.name.endswith(".tmp") else info

    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(root, arcname=f"results/{a.profile}", filter=keep)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print(f"packed {root} into {out}")
    return 0


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def main(argv=None) -> int:
    """Run a command; input errors and diverged computations become one line ``error: ...`` on stderr and exit
    status 2 (nothing is written: each is raised before or instead of a store write)."""
    try:
        return _main(argv)
    except (ParamError, SettingError, DeviceUnavailable, DivergenceError, StoreError, sweep.SweepError) as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return EXIT_INPUT
    except SystemExit as err:
        if isinstance(err.code, str):  # raise SystemExit("error: ...") inside a command
            msg = _one_line(err.code)
            print(msg if msg.startswith("error:") else f"error: {msg}", file=sys.stderr)
            return EXIT_INPUT
        raise


def _main(argv=None) -> int:
    choose_threads()
    p = argparse.ArgumentParser(prog="python -m grokspectra", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="compute experiments into the result store")
    r.add_argument("target", help="'all', a chapter (ch6) or an experiment (ch6.fig3)")
    r.add_argument("--profile", default="paper", help="profile name (params/NAME.yaml) or a YAML path")
    r.add_argument("--device", default=None, help="auto, cpu, cuda (default: the profile's)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a parameter")
    r.add_argument("--force", action="store_true", help="recompute even when the store has the result")
    r.add_argument("-p", nargs=2, action="append", metavar=("NAME", "VALUE"), help="override, as papermill's -p")
    r.add_argument("-y", action="append", metavar="YAML", help="overrides as a YAML mapping (papermill's -y), e.g. lists")
    r.add_argument("--store", default=None, help="store root (default results/ or $GROKSPECTRA_STORE)")
    r.add_argument("--workers", type=int, default=None, metavar="N",
                   help="compute units on a local Dask cluster of N worker processes (one torch thread each)")
    r.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="compute units on an existing Dask cluster (e.g. tcp://host:8786)")
    r.add_argument("--dry-run", action="store_true", help="list the units and estimate their cost; compute nothing")
    r.add_argument("--no-probe", action="store_true", help="with --dry-run: do not time a probe unit")
    r.add_argument("--max-memory", type=float, default=None, metavar="GIB",
                   help="memory one unit may need (default: the device's total); a unit whose estimated peak "
                        "exceeds it is not started")
    r.set_defaults(fn=cmd_run)
    st = sub.add_parser("status", help="units stored / total and time left, per experiment of a profile")
    st.add_argument("--profile", default="paper")
    st.add_argument("--store", default=None)
    st.set_defaults(fn=cmd_status)
    pr = sub.add_parser("prune", help="remove a profile's stale entries and checkpoints (never shown as current)")
    pr.add_argument("--profile", default="paper")
    pr.add_argument("--store", default=None)
    pr.add_argument("--dry-run", action="store_true", help="list the files, remove nothing")
    pr.set_defaults(fn=cmd_prune)
    l_ = sub.add_parser("list", help="list experiments")
    l_.set_defaults(fn=cmd_list)
    q = sub.add_parser("params", help="print a notebook's parameters from a profile")
    q.add_argument("profile")
    q.add_argument("section")
    q.set_defaults(fn=cmd_params)
    b = sub.add_parser("bench", help="run a benchmark")
    b.add_argument("name")
    b.add_argument("--device", default=None)
    b.add_argument("--quick", action="store_true", help="a small size, for a smoke test")
    b.add_argument("--against", default=None, metavar="PATH",
                   help="another implementation's script to time side by side (bench xu: Xu's tian_eigengap.py)")
    b.add_argument("--size", action="append", metavar="KEY=N",
                   help="override one of the benchmark's sizes (bench dmft: T, N, m); repeatable")
    b.set_defaults(fn=cmd_bench)
    c = sub.add_parser("check", help="validate a notebook's parameters (profile + -p overrides)")
    c.add_argument("section")
    c.add_argument("--profile", default="ci")
    c.add_argument("-p", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="a parameter, read as papermill reads -p (True/False/None, int, float, else text)")
    c.add_argument("-y", action="append", metavar="YAML", help="parameters as a YAML mapping (papermill's -y)")
    c.add_argument("-r", nargs=2, action="append", metavar=("NAME", "VALUE"), help="a raw text parameter")
    c.add_argument("--id", action="store_true", help="print the short hash of the resolved parameters")
    c.add_argument("--write-params", metavar="FILE", help="write the resolved parameters as YAML (papermill's -f)")
    c.set_defaults(fn=cmd_check)
    k = sub.add_parser("pack", help="archive a profile's results")
    k.add_argument("out")
    k.add_argument("--profile", default="paper")
    k.set_defaults(fn=cmd_pack)
    a = p.parse_args(argv)
    return a.fn(a)
