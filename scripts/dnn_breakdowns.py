#!/usr/bin/env python
"""Cells of ch3.dnn stored as "DMFT breakdown" in one store but not in another (the check before a move of chapter 3
to new code: a breakdown where the old code bisected is a finding to explain, not a result to move).

    .venv/bin/python scripts/dnn_breakdowns.py NEW_DIR OLD_DIR     # e.g. results-ahead/paper results/paper

Prints each such cell and exits with status 1 if there is one; cells missing from either store are not compared.
"""
import json
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


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        raise SystemExit(__doc__)
    new, old = cells(Path(argv[0])), cells(Path(argv[1]))
    worse = [k for k in new if k in old and new[k] and not old[k]]
    for k in worse:
        print("DMFT breakdown in {} only: act={}, m={}, link={}, scale={}".format(argv[0], *k))
    print(f"{len(worse)} of {sum(k in old for k in new)} common cells break down only in {argv[0]}")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
