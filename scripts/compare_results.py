#!/usr/bin/env python
"""Two stores' units of the same experiments, array by array: how far a recompute with new code moved each result.

    .venv/bin/python scripts/compare_results.py NEW_DIR OLD_DIR [EXPERIMENT ...]   # e.g. results-ahead/paper results/paper

Units are matched by their parameters (the code versions differ, so their keys do). For each experiment and array:
the largest difference relative to the old array's largest entry, over the matched units, and whether NaNs moved
(a value finite in one store and NaN or infinite in the other: a breakdown, a cell not reached). Informational: a change of the
engine's rounding shows as 10⁻¹⁶–10⁻¹⁰, a change of the law the paths realise as Monte-Carlo-sized differences.
"""
import json
import sys
from pathlib import Path

import numpy as np


def units(root: Path, exp: str) -> dict:
    out = {}
    for f in sorted((root / exp).glob("*.json")):
        key = json.dumps(json.loads(f.read_text())["params"], sort_keys=True)
        with np.load(f.with_suffix(".npz")) as z:
            out[key] = {n: z[n] for n in z.files}
    return out


def compare(new: Path, old: Path, exp: str) -> list[str]:
    a, b = units(new, exp), units(old, exp)
    common = [k for k in a if k in b]
    lines = [f"{exp}: {len(common)} units in both ({len(a)} new, {len(b)} old)"]
    worst: dict = {}
    for k in common:
        for n, x in a[k].items():
            y = b[k].get(n)
            if y is None or y.shape != x.shape or x.dtype.kind != "f":
                continue
            nan_moved = int((np.isfinite(x) != np.isfinite(y)).sum())
            both = np.isfinite(x) & np.isfinite(y)
            scale = np.max(np.abs(y[both])) if both.any() else 0.0
            rel = float(np.max(np.abs(x[both] - y[both])) / scale) if both.any() and scale > 0 else 0.0
            r0, m0 = worst.get(n, (0.0, 0))
            worst[n] = (max(r0, rel), m0 + nan_moved)
    for n, (rel, moved) in sorted(worst.items()):
        lines.append(f"  {n:<16} largest relative change {rel:.1e}" + (f"; {moved} values finite in one store only"
                                                                          if moved else ""))
    return lines


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    new, old = Path(argv[0]), Path(argv[1])
    exps = argv[2:] or sorted(p.name for p in new.iterdir() if p.is_dir() and not p.name.startswith("."))
    for e in exps:
        print("\n".join(compare(new, old, e)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
