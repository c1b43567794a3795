#!/usr/bin/env python
"""Two builds' closing tables, row by row: what each says and whether a verdict changed (exit status 1 if one did).

Used when results are recomputed (a chapter moving to another engine): build the chapter's notebook before and after,
then compare their summaries (``build/summary/<notebook>.json``, written by ``report.save_summary``).

    .venv/bin/python scripts/compare_claims.py BEFORE_DIR AFTER_DIR [NOTEBOOK ...]
"""
import json
import sys
from pathlib import Path


def rows(path: Path) -> dict:
    d = json.loads(path.read_text())
    return {(r["claim"], r["source"]): r for r in d["rows"]}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    a, b = Path(argv[0]), Path(argv[1])
    names = argv[2:] or sorted(p.stem for p in a.glob("*.json") if (b / p.name).exists())
    changed = 0
    for nb in names:
        ra, rb = rows(a / f"{nb}.json"), rows(b / f"{nb}.json")
        print(f"## {nb}: {len(ra)} rows before, {len(rb)} after")
        for key in list(ra) + [k for k in rb if k not in ra]:
            x, y = ra.get(key), rb.get(key)
            verdict = lambda r: "—" if r is None else {True: "✓", False: "✗", None: "n/c"}.get(r.get("agree"), str(r.get("agree")))
            flag = "" if (x and y and x.get("agree") == y.get("agree")) else "   <-- verdict changed"
            changed += bool(flag)
            print(f"- {key[0]} [{key[1]}]{flag}\n    before {verdict(x)} {x and x['ours']!s} ({x and x.get('note')})"
                  f"\n    after  {verdict(y)} {y and y['ours']!s} ({y and y.get('note')})")
    print(f"{changed} verdict(s) changed")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
