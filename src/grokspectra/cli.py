"""Command line: compute experiments into the store without Jupyter (GPU machines have no Jupyter stack).

    python -m grokspectra list
    python -m grokspectra run ch6 --profile paper          # every experiment of chapter 6
    python -m grokspectra run ch6.fig3 --profile ci --set seeds=3
    python -m grokspectra run all --profile paper
    python -m grokspectra params ci ch6_repulsion           # the YAML papermill gets for a notebook
    python -m grokspectra bench modadd --device cuda
    python -m grokspectra pack results-paper.tar.gz         # archive results/paper (to bring back from a GPU)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import time

import yaml

from . import experiments as ex
from .params import ParamError, load_profile
from .store import Store, default_root


def _value(text: str):
    return yaml.safe_load(text)


def _targets(target: str) -> list[ex.Experiment]:
    ex.load_chapters()
    if target == "all":
        return list(ex.REGISTRY.values())
    if target in ex.REGISTRY:
        return [ex.REGISTRY[target]]
    chosen = [e for n, e in ex.REGISTRY.items() if n.split(".")[0] == target]
    if not chosen:
        raise SystemExit(f"error: unknown experiment or chapter {target!r}; known: {sorted(ex.REGISTRY)}")
    return chosen


def cmd_run(a) -> int:
    os.environ.setdefault("GROKSPECTRA_PROGRESS", "1")
    overrides = {}
    for item in a.set or []:
        if "=" not in item:
            raise SystemExit(f"error: --set expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        overrides[k] = _value(v)
    store = Store(a.store) if a.store else Store()
    for e in _targets(a.target):
        mod = ex.chapter(e.name.split(".")[0])
        try:
            P = load_profile(a.profile, e.section)
            P.update({k: v for k, v in overrides.items()})
            if a.device:
                P["device"] = a.device
            P = mod.SCHEMA.validate(P)
        except ParamError as err:
            raise SystemExit(f"error: {e.name}: {err}")
        t0 = time.perf_counter()
        r = e.run(P, store=store, force=a.force)
        print(f"{e.name:28s} {r.meta['key']}  {r.meta['wall_s']:8.1f} s computed, {time.perf_counter() - t0:8.1f} s now"
              f"  [{r.meta['profile']} on {r.meta['device']}]", flush=True)
    return 0


def cmd_list(a) -> int:
    ex.load_chapters()
    for n, e in sorted(ex.REGISTRY.items()):
        print(f"{n:28s} notebook {e.section:22s} keys {', '.join(e.keys)}")
    return 0


def cmd_params(a) -> int:
    try:
        P = load_profile(a.profile, a.section)
    except ParamError as err:
        raise SystemExit(f"error: {err}")
    sys.stdout.write(yaml.safe_dump(P, sort_keys=True))
    return 0


def cmd_bench(a) -> int:
    ex.load_chapters()
    benches = {}
    for ch in ex.load_chapters():
        benches.update(getattr(ex.chapter(ch), "BENCHMARKS", {}))
    if a.name not in benches:
        raise SystemExit(f"error: unknown benchmark {a.name!r}; known: {sorted(benches)}")
    out = benches[a.name](device=a.device or "auto", quick=a.quick)
    print(json.dumps(out, indent=1))
    return 0


def chapter_of(section: str):
    """The chapter module whose notebook is ``section`` (e.g. ``ch6_repulsion`` → ``experiments.ch6``)."""
    for ch in ex.load_chapters():
        mod = ex.chapter(ch)
        if getattr(mod, "SECTION", None) == section:
            return mod
    raise SystemExit(f"error: no chapter module declares notebook {section!r}")


def cmd_check(a) -> int:
    """Validate a profile's parameters plus papermill-style ``-p name value`` overrides before running."""
    mod = chapter_of(a.section)
    try:
        P = load_profile(a.profile, a.section)
        for name, value in a.p or []:
            P[name] = _value(value)
        mod.SCHEMA.validate(P)
    except ParamError as err:
        raise SystemExit(f"error: notebook {a.section}: {err}")
    return 0


def cmd_pack(a) -> int:
    root = default_root() / a.profile
    with tarfile.open(a.out, "w:gz") as tar:
        tar.add(root, arcname=f"results/{a.profile}")
    print(f"packed {root} into {a.out}")
    return 0


def _threads() -> None:
    """``$GROKSPECTRA_THREADS`` sets torch's CPU thread count (useful on a shared or small machine)."""
    n = os.environ.get("GROKSPECTRA_THREADS")
    if n:
        import torch

        torch.set_num_threads(max(1, int(n)))


def main(argv=None) -> int:
    _threads()
    p = argparse.ArgumentParser(prog="python -m grokspectra", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="compute experiments into the result store")
    r.add_argument("target", help="'all', a chapter (ch6) or an experiment (ch6.fig3)")
    r.add_argument("--profile", default="paper", help="profile name (params/NAME.yaml) or a YAML path")
    r.add_argument("--device", default=None, help="auto, cpu, cuda (default: the profile's)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a parameter")
    r.add_argument("--force", action="store_true", help="recompute even when the store has the result")
    r.add_argument("--store", default=None, help="store root (default results/ or $GROKSPECTRA_STORE)")
    r.set_defaults(fn=cmd_run)
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
    b.set_defaults(fn=cmd_bench)
    c = sub.add_parser("check", help="validate a notebook's parameters (profile + -p overrides)")
    c.add_argument("section")
    c.add_argument("--profile", default="ci")
    c.add_argument("-p", nargs=2, action="append", metavar=("NAME", "VALUE"))
    c.set_defaults(fn=cmd_check)
    k = sub.add_parser("pack", help="archive a profile's results")
    k.add_argument("out")
    k.add_argument("--profile", default="paper")
    k.set_defaults(fn=cmd_pack)
    a = p.parse_args(argv)
    return a.fn(a)
