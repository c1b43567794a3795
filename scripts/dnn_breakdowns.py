#!/usr/bin/env python
"""Cells of ch3.dnn stored as "DMFT breakdown" in one store but not in another (the check before a move of chapter 3
to new code: a breakdown where the old code bisected is a finding to explain, not a result to move).

    .venv/bin/python scripts/dnn_breakdowns.py NEW_DIR OLD_DIR     # e.g. results-ahead/paper results/paper

Prints each such cell and exits with status 1 if there is one; cells missing from either store are not compared.
Then, for information (it never fails the check), how well the two stores' δ_NN(t) agree where both have a root:
z = Δ/√(u₁² + u₂²) per (cell, t), with u the uncertainty chapters 3–5 quote (half-bracket and root_mc_se in
quadrature); their root mean square, and every pair with |z| > 2. Independent draws with honest u give |z| > 2 rarely
(u is conservative: chapter 3 measures how often it covers a known root).
"""
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_results import units  # noqa: E402  (units of an experiment, keyed by their parameters)
from grokspectra.experiments.ch3 import BISECT_STATUS, DNN_FIELDS  # noqa: E402

BREAKDOWN = BISECT_STATUS.index("DMFT breakdown")


def cells(root: Path) -> dict:
    """Each cell (act, m, link, scale) of ch3.dnn in the store: whether it broke down at some t."""
    out = {}
    for key, arrays in units(root, "ch3.dnn").items():
        p = json.loads(key)
        status = arrays["cell"][:, DNN_FIELDS.index("status")]
        out[(p["act"], p["m"], p["link"], p["scale"])] = bool((status == BREAKDOWN).any())
    return out


def roots(root: Path) -> dict:
    """(act, m, link, scale, t) → (δ_NN, u) for every bisected or noise-limited (cell, t) of ch3.dnn in the store."""
    f = {k: DNN_FIELDS.index(k) for k in DNN_FIELDS}
    out = {}
    for key, arrays in units(root, "ch3.dnn").items():
        p = json.loads(key)
        for row, t in zip(arrays["cell"], p.get("dnn_times", range(len(arrays["cell"])))):
            if row[f["status"]] <= 1 and math.isfinite(row[f["delta_nn"]]):
                u = math.hypot(0.5 * (row[f["hi"]] - row[f["lo"]]), row[f["root_mc_se"]])
                out[(p["act"], p["m"], p["link"], p["scale"], t)] = (float(row[f["delta_nn"]]), u)
    return out


def agreement(new: dict, old: dict) -> list[str]:
    """Lines: how far apart the two stores' roots are, in combined uncertainties."""
    zs = {k: (new[k][0] - old[k][0]) / math.hypot(new[k][1], old[k][1]) for k in new if k in old}
    if not zs:
        return ["no (cell, t) with a root in both stores"]
    sd = math.sqrt(sum(z * z for z in zs.values()) / len(zs))
    lines = [f"δ_NN agreement: {len(zs)} (cell, t) with a root in both; rms z = {sd:.2f}; "
             f"|z| > 2: {sum(abs(z) > 2 for z in zs.values())}, |z| > 3: {sum(abs(z) > 3 for z in zs.values())}"]
    for k, z in sorted(zs.items(), key=lambda kv: -abs(kv[1])):
        if abs(z) > 2:
            lines.append("  z = {:+.1f}: act={}, m={}, link={}, scale={}, t={}: {:.2f} ± {:.2f} against {:.2f} ± {:.2f}"
                         .format(z, *k, *new[k], *old[k]))
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        raise SystemExit(__doc__)
    new, old = cells(Path(argv[0])), cells(Path(argv[1]))
    worse = [k for k in new if k in old and new[k] and not old[k]]
    for k in worse:
        print("DMFT breakdown in {} only: act={}, m={}, link={}, scale={}".format(argv[0], *k))
    print(f"{len(worse)} of {sum(k in old for k in new)} common cells break down only in {argv[0]}")
    print("\n".join(agreement(roots(Path(argv[0])), roots(Path(argv[1])))))
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
