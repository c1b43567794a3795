"""Chapter reports: the closing 'claim / ours / agreement' table of every chapter, and the intro's summary.

Each chapter builds a list of :class:`Claim` rows, shows them with :func:`table_md` and saves them with
:func:`save_summary` (``build/summary/<notebook>.json``); the intro page collects every chapter's rows. A rerun with
other parameters (``make run``) sets ``$GROKSPECTRA_SUMMARY_DIR`` so that its summary goes next to its own executed
notebook under ``build/runs/`` and never into the book's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUMMARY_DIR = REPO / "build" / "summary"
_NONFINITE = re.compile(r"(?i)(?<![a-z])(nan|[+-]?inf(inity)?)(?![a-z])")


def summary_dir() -> Path:
    """Where :func:`save_summary` writes: ``$GROKSPECTRA_SUMMARY_DIR`` when set (``make run``), else the book's
    ``build/summary``."""
    env = os.environ.get("GROKSPECTRA_SUMMARY_DIR", "").strip()
    return Path(env) if env else SUMMARY_DIR


@dataclasses.dataclass
class Claim:
    """One row: what is claimed (and by whom), the claimed value, our measurement, agreement, and why."""

    claim: str
    source: str
    claimed: str
    ours: str
    agree: bool | None  # None: not comparable (e.g. the paper gives no number, or not at this scale)
    note: str = ""
    scale: str = ""  # the scale the row was judged at, e.g. "paper: 15 seeds" or "CI: 2 seeds"

    def __post_init__(self):
        # a row whose measurement is not a finite number is never scored as agreeing (nor as disagreeing)
        if self.agree is not None and _NONFINITE.search(str(self.ours)):
            self.agree = None
            self.note = "not comparable: our value is not finite" + (f"; {self.note}" if self.note else "")

    def mark(self) -> str:
        return {True: "✓", False: "✗", None: "–"}[self.agree]


def finite(*xs) -> bool:
    """True when every value is a finite number (NaN, ±inf and None are not)."""
    import math

    try:
        return all(x is not None and math.isfinite(float(x)) for x in xs)
    except (TypeError, ValueError):
        return False


def within(ours, claimed, tol) -> bool | None:
    """``|ours − claimed| ≤ tol`` as the agreement of a claim row; ``None`` (not comparable, never ✓) when any of
    them is not a finite number."""
    if not finite(ours, claimed, tol):
        return None
    return abs(float(ours) - float(claimed)) <= float(tol)


def at_scale(row: Claim, scale: str, comparable: bool = True, needs: str = "") -> Claim:
    """Record the scale ``row`` was judged at. When the result shown is not of the scale the claim is about
    (``comparable`` False), the row is not scored: agreement becomes ``None`` and the note says
    "not comparable at <scale>" (plus what it ``needs``)."""
    row.scale = scale
    if not comparable:
        row.agree = None
        why = f"not comparable at {scale}" + (f" (needs {needs})" if needs else "")
        row.note = why + (f"; {row.note}" if row.note else "")
    return row


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table_md(rows: list[Claim]) -> str:
    """A markdown table of claims (pipes inside cells are escaped)."""
    out = ["| claim | source | claimed | ours | judged at | agreement |", "|---|---|---|---|---|---|"]
    for r in rows:
        note = f" {r.note}" if r.note else ""
        cells = [r.claim, r.source, r.claimed, r.ours, r.scale or "–", r.mark() + note]
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(out)


def save_summary(notebook: str, title: str, rows: list[Claim], provenance: str = "") -> Path:
    """Write a chapter's claims to ``<summary_dir()>/<notebook>.json`` atomically (``build/summary``, read by the
    intro page; a ``make run`` rerun writes next to its own notebook instead, see :func:`summary_dir`)."""
    out_dir = summary_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{notebook}.json"
    data = {"notebook": notebook, "title": title, "provenance": provenance,
            "rows": [dataclasses.asdict(r) for r in rows]}
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{notebook}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def load_summaries() -> list[dict]:
    """Every saved chapter summary of the book (``build/summary``), in notebook order; an unreadable file is
    reported on stderr with its path and skipped."""
    if not SUMMARY_DIR.is_dir():
        return []
    out = []
    for p in sorted(SUMMARY_DIR.glob("*.json")):
        try:
            data = json.loads(p.read_text())
            if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
                raise ValueError("not a chapter summary")
        except (OSError, ValueError) as err:
            print(f"warning: skipping the damaged summary {p}: {err}", file=sys.stderr)
            continue
        out.append(data)
    return out


def fmt(x: float, digits: int = 3) -> str:
    """A number for a table: fixed digits, or scientific for very small/large magnitudes; '–' for NaN/None."""
    if x is None or x != x:
        return "–"
    ax = abs(x)
    if ax != 0 and (ax < 1e-3 or ax >= 1e5):
        return f"{x:.{max(digits - 1, 1)}e}"
    return f"{x:.{digits}g}"


def glue_md(name: str, text: str) -> None:
    """Glue a markdown snippet (use in the text as ``{glue:md}`name` ``), e.g. a result's provenance line."""
    from IPython.display import Markdown
    from myst_nb import glue

    glue(name, Markdown(text), display=False)
