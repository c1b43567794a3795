"""Chapter reports: the closing 'claim / ours / agreement' table of every chapter, and the intro's summary.

Each chapter builds a list of :class:`Claim` rows, shows them with :func:`table_md` and saves them with
:func:`save_summary` (``build/summary/<notebook>.json``); the intro page collects every chapter's rows. A rerun with
other parameters (``make run``) sets ``$GROKSPECTRA_SUMMARY_DIR`` so that its summary goes next to its own executed
notebook under ``build/runs/`` and never into the book's.
"""

from __future__ import annotations

import dataclasses
import json
import math
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


def median_se(x) -> float:
    """Standard error of the median of the finite entries of ``x`` from their spread: 1.2533 σ̂/√n with
    σ̂ = IQR/1.349 (normal approximation); NaN with fewer than two finite entries."""
    import numpy as np

    x = np.asarray(x, float).ravel()
    x = x[np.isfinite(x)]
    if x.size < 2:
        return float("nan")
    q25, q75 = np.percentile(x, [25, 75])
    return float(1.2533 * (q75 - q25) / 1.349 / np.sqrt(x.size))


def iqr_se(q25: float, q75: float, n: int) -> float:
    """The same standard error of a median from a published IQR over ``n`` runs."""
    return float(1.2533 * (q75 - q25) / 1.349 / math.sqrt(n))


def fractions_agree(k: int, n: int, k_pub: int, n_pub: int, level: float = 0.95) -> bool | None:
    """Whether k/n runs of ours and k_pub/n_pub of a paper's are compatible with one rate: Boschloo's exact test
    (``scipy.stats.boschloo_exact``, two-sided) does not reject equal rates at 1 − ``level``. Exact at these counts,
    where a normal approximation is not: "within two binomial standard errors of ours" rejected 13–20 % of true
    matches between 15 and 15 runs (it ignores the paper's own sampling), this test at most 5 % (2.4–4.3 % for rates
    0.1–0.9). ``None`` without runs on either side."""
    from scipy import stats

    if not (0 <= k <= n and 0 <= k_pub <= n_pub) or not 0 < level < 1:
        raise ValueError(f"need 0 <= k <= n, 0 <= k_pub <= n_pub, 0 < level < 1; got {k}/{n}, {k_pub}/{n_pub}, {level}")
    if n == 0 or n_pub == 0:
        return None
    if k * n_pub == k_pub * n:  # equal fractions: p = 1 (and the test's optimiser is spared a degenerate table)
        return True
    return bool(stats.boschloo_exact([[k, k_pub], [n - k, n_pub - k_pub]]).pvalue > 1 - level)


def epoch_tol(ours, q25: float, q75: float, n: int) -> float:
    """Tolerance for a median epoch: q combined standard errors of the two medians (ours from our runs' spread, the
    published one from its IQR over ``n`` runs), q from :func:`median_z` (≈ 2.2 for 15 and 15 runs), plus one
    epoch, the resolution of the epoch grid; NaN with fewer than two finite runs of ours."""
    import numpy as np

    se = np.hypot(median_se(ours), iqr_se(q25, q75, n))
    k = int(np.isfinite(np.asarray(ours, float)).sum())
    return float(median_z(k, n) * se + 1) if np.isfinite(se) else float("nan")


def median_z(n: int, pub: int | str = "exact", level: float = 0.95, draws: int = 200_000) -> float:
    """The multiplier q of a median-agreement tolerance q·√(ŝe² + ŝe_pub²), calibrated so that two medians of one
    normal law agree with probability ``level``.

    Each ŝe is :func:`median_se` (1.2533 σ̂/√n with σ̂ = IQR/1.349), the standard error of a median that chapters 6
    and 7 quote. σ̂ is itself estimated from few runs (and biased low: the IQR of 5 normal values is 0.73 of the
    population's on average), so "two standard errors" is not a 95 % rule: two medians of 15 runs each lie further
    apart 7 % of the time, a median of 5 runs from the exact value 23 % (:func:`median_false_fail`). Student's t
    makes the same correction for a mean; here it comes by simulation, as no closed form covers the IQR's spread.

    ``pub`` is how the published median's standard error enters: ``"exact"`` (a number without spread, ŝe_pub = 0),
    ``"same"`` (a median over as many runs with our spread, ŝe_pub = ŝe), or an int n_pub (ŝe_pub from the
    published IQR over n_pub runs). The quantile comes from ``draws`` seeded normal samples, so it is the same number
    on every machine (2.19 for 15 and 15 runs, 5.3 for 5 runs with the same spread; 1.96 in the limit)."""
    if not 0 < level < 1:
        raise ValueError(f"need 0 < level < 1, got {level}")
    import numpy as np

    return float(np.quantile(_median_stat(n, pub, draws), level))


def median_false_fail(q: float, n: int, pub: int | str = "exact", draws: int = 200_000) -> float:
    """How often two medians of one normal law lie further apart than q combined standard errors (the setting of
    :func:`median_z`): the fraction of true matches a rule "agree within q s.e." rejects."""
    import numpy as np

    return float(np.mean(_median_stat(n, pub, draws) > q))


_MEDIAN_STAT: dict = {}


def _median_stat(n, pub, draws):
    """|m̂ − m̂_pub| / √(ŝe² + ŝe_pub²) over ``draws`` seeded normal samples (see :func:`median_z`), cached."""
    import numpy as np

    if n < 2 or not (pub in ("exact", "same") or (isinstance(pub, int) and pub >= 2)):
        raise ValueError(f"need n >= 2 and pub 'exact', 'same' or an int >= 2; got {n}, {pub!r}")
    key = (int(n), pub, int(draws))
    if key not in _MEDIAN_STAT:
        rng = np.random.default_rng(20261207)

        def med_se(k):
            x = rng.standard_normal((draws, k))
            q25, q75 = np.percentile(x, [25, 75], axis=1)
            return np.median(x, axis=1), 1.2533 * (q75 - q25) / 1.349 / np.sqrt(k)

        m, se = med_se(n)
        if pub == "exact":
            stat = np.abs(m) / se
        elif pub == "same":
            stat = np.abs(m - med_se(n)[0]) / (math.sqrt(2) * se)
        else:
            m2, se2 = med_se(pub)
            stat = np.abs(m - m2) / np.hypot(se, se2)
        _MEDIAN_STAT[key] = stat
    return _MEDIAN_STAT[key]


def slope_z(n: int, level: float = 0.95) -> float:
    """The multiplier of a least-squares slope's standard error over ``n`` points: Student's t with n − 2 degrees of
    freedom at the two-sided ``level`` (2.07 for 25 points)."""
    from scipy import stats

    if n < 3 or not 0 < level < 1:
        raise ValueError(f"need n >= 3 and 0 < level < 1, got {n}, {level}")
    return float(stats.t.ppf(0.5 * (1 + level), n - 2))


Z95 = 1.959963984540054  # two-sided 95 % point of the standard normal law


def range_tol(stat: float, syst: float = 0.0, z: float = Z95) -> float:
    """Tolerance ``syst + z · stat`` for the gap between two values whose difference has the statistical standard
    error ``stat`` and a systematic uncertainty ``syst`` given as a *range* (half the spread of alternative fits,
    half a bisection bracket): the truth of the systematic part lies anywhere within ± ``syst``, not on a normal law.

    Calibration: if the two values estimate one quantity up to a bias b with |b| ≤ ``syst``, the gap is
    N(b, stat²) and P(|gap| > syst + z·stat) ≤ P(|N(0, 1)| > z) = 5 % at z = :data:`Z95`, whatever b is in the
    range (the bound is reached at b = 0 only when syst = 0). Adding ``syst`` in quadrature and doubling, as
    chapters 4–5 did before, treats half a spread of two fits as a standard deviation: it doubles the systematic
    part when that dominates and claims no stated level."""
    return combined_tol(float(z) * float(stat), syst=syst)


def combined_tol(*halfwidths: float, syst: float = 0.0) -> float:
    """Tolerance ``syst + √(Σ h²)`` for the gap between independent estimates, each h the half-width of one
    estimate's 95 % interval (1.96 s.e. for a normal one, a calibrated multiple of its s.e. otherwise, as
    ``transitions.divergence_z`` gives) and ``syst`` a systematic range (:func:`range_tol`). For normal errors
    this is 1.96 times the combined s.e., exactly; for a heavy-tailed one it keeps its own calibration."""
    return float(syst) + math.sqrt(sum(float(h) ** 2 for h in halfwidths))

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


def claims_block(table: str) -> str:
    """A claims table (:func:`table_md`, :func:`table_md_compact`) as a MyST ``table`` block of class ``claims``, so
    that the book's stylesheet can give it a readable width on phones (it then scrolls sideways in its box)."""
    return "```{table}\n:class: claims\n\n" + table + "\n```"


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


def scale_group(scale: str) -> str:
    """The scale a row was judged at without its detail: ``"paper: 15 seeds"`` → ``"paper"``, ``"CI: 2 seeds"`` →
    ``"CI"``; an empty scale → ``"not recorded"``."""
    return str(scale).split(":", 1)[0].strip() or "not recorded"


def _claim(row: dict) -> Claim:
    names = {f.name for f in dataclasses.fields(Claim)}
    return Claim(**{k: v for k, v in row.items() if k in names})


def summary_md(summaries: list[dict]) -> str:
    """The intro's reproduction summary: a narrow table with one row per chapter and scale group
    (:func:`scale_group`) counting the claims that agree (✓), disagree (✗) and are not comparable (–), then a list
    of the claims that disagree (claim, source, claimed, ours, scale). ``summaries`` as from :func:`load_summaries`."""
    if not summaries:
        return "No chapter has been executed yet."
    lines = ["| chapter | scale | ✓ | ✗ | – |", "|---|---|---|---|---|"]
    disagree = []
    for s in summaries:
        rows = [_claim(r) for r in s.get("rows", [])]
        title = _cell(s.get("title") or s.get("notebook", "?"))
        groups: dict[str, list[Claim]] = {}
        for r in rows:
            groups.setdefault(scale_group(r.scale), []).append(r)
        if not groups:
            lines.append(f"| {title} | – | 0 | 0 | 0 |")
        for g, rs in groups.items():
            counts = [sum(r.agree is v for r in rs) for v in (True, False, None)]
            lines.append(f"| {title} | {_cell(g)} | " + " | ".join(map(str, counts)) + " |")
        disagree += [(title, r) for r in rows if r.agree is False]
    out = "\n".join(lines)
    if not disagree:
        return out + "\n\nNo claim disagrees."
    items = [f"* {t}: {r.claim} ({r.source}): claimed {r.claimed}, ours {r.ours}, judged at {r.scale or 'an unrecorded scale'}"
             + (f". {r.note}" if r.note else "") for t, r in disagree]
    return out + "\n\n**Claims that disagree:**\n\n" + "\n".join(items)


def fmt(x: float, digits: int = 3) -> str:
    """A number for a table: fixed digits, or scientific for very small/large magnitudes; '–' for NaN/None."""
    if x is None or x != x:
        return "–"
    ax = abs(x)
    if ax != 0 and (ax < 1e-3 or ax >= 1e5):
        return f"{x:.{max(digits - 1, 1)}e}"
    return f"{x:.{digits}g}"


def fmt_pm(x: float, se: float) -> str:
    """``x ± se`` for a table, both rounded at the second significant digit of ``se`` (0.570 ± 0.0045 reads
    ``0.5700 ± 0.0045``; 1.211 ± 0.0128 reads ``1.211 ± 0.013``); :func:`fmt` for each where ``se`` is not a positive
    finite number or the magnitudes call for scientific notation."""
    if x is None or se is None or not (se > 0 and math.isfinite(se) and math.isfinite(x)) \
            or se < 1e-4 or max(abs(x), se) >= 1e5:
        return f"{fmt(x)} ± {fmt(se, 2)}"
    d = max(0, 1 - math.floor(math.log10(se)))
    if round(se, d) >= 10.0 ** (2 - d):  # 0.0996 rounds to 0.10: one digit fewer
        d = max(0, d - 1)
    return f"{x:.{d}f} ± {se:.{d}f}"


def scale_md(rows: list[dict], profile: str = "paper") -> str:
    """A note for the top of a chapter: how far each of its experiments is computed at ``profile`` scale (rows of
    ``experiments.section_status``), the compute time still missing and the command that computes it, or, when
    every experiment is complete, what computing its units took (their records' wall times). Results
    whose ``profile`` is complete are shown at that scale; the others at the notebook's own profile, or as the
    computed part of the ``profile`` grid where the figure's provenance line says so."""
    from .sweep import fmt_seconds

    done = [r for r in rows if r["state"] == "current"]
    if len(done) == len(rows):
        took = sum(r.get("stored_s", 0.0) for r in rows)
        threads = sorted({t for r in rows for t in r.get("threads", ())})
        on = f" on {' or '.join(map(str, threads))} CPU thread{'s' if threads != [1] else ''}" if threads else ""
        cost = (f" Its {plural(sum(r['units'] for r in rows), 'unit')} took {fmt_seconds(took)} of computing{on} "
                "when they were run (a figure's provenance line names the device and date)." if took > 0 else "")
        return f"Every result on this page is computed at the `{profile}` scale.{cost}"
    lines = [f"| experiment | `{profile}` units computed | compute left (at the stored units' rate) |", "|---|---|---|"]

    def left(r):  # what this machine can compute, and what needs a machine with more memory
        if r["state"] == "current":
            return "–"
        big = r.get("too_big", 0)
        if not big:
            return fmt_seconds(r["left_s"])
        here = f"{fmt_seconds(r['left_s'])} here; " if r["left_s"] else ""
        return (here + f"{fmt_seconds(r.get('too_big_s', float('nan')))} in {plural(big, 'unit')} that need more "
                f"memory than {r.get('memory') or 'this machine'}")

    for r in rows:
        lines.append(f"| `{r['experiment']}` | {r['stored']} of {r['units']}"
                     + (" (complete)" if r["state"] == "current" else "") + " | " + left(r) + " |")
    missing = [r["experiment"] for r in rows if r["state"] != "current"]
    return (f"{len(done)} of {len(rows)} experiments of this page are complete at the `{profile}` scale and shown at "
            f"it; the others are shown at this build's profile, or as the part of the `{profile}` grid computed so "
            "far where a figure's provenance line says so. Units are resumable: "
            + ", ".join(f"`python -m grokspectra run {m} --profile {profile}`" for m in missing)
            + " continues each where it stopped ('?': no unit stored yet to time).\n\n" + "\n".join(lines))


def glue_md(name: str, text: str) -> None:
    """Glue a markdown snippet (use in the text as ``{glue:md}`name` ``), e.g. a result's provenance line."""
    from IPython.display import Markdown
    from myst_nb import glue

    glue(name, Markdown(text), display=False)


def plural(n: int, word: str, words: str | None = None) -> str:
    """``"1 seed"``, ``"2 seeds"``: a count with its noun in the right number (``words``: an irregular plural)."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


def table_md_compact(rows: list[Claim]) -> str:
    """The claims as a four-column markdown table that fits a phone's width: the source goes under the claim and
    the scale a row was judged at under its agreement (same content as :func:`table_md`)."""
    out = ["| claim (source) | claimed | ours | agreement (judged at) |", "|---|---|---|---|"]
    for r in rows:
        claim = f"{r.claim} ({r.source})" if r.source else r.claim
        shown = r.scale and f"at {r.scale}" not in r.note  # an un-scored row already names its scale
        agree = r.mark() + (f" {r.note}" if r.note else "") + (f" ({r.scale})" if shown else "")
        out.append("| " + " | ".join(_cell(c) for c in (claim, r.claimed, r.ours, agree)) + " |")
    return "\n".join(out)


def sci_tex(x: float) -> str:
    """A small number as TeX: 2e-4 → '2\\times10^{-4}', 1e-5 → '10^{-5}', 0 → '0' (no dollars)."""
    if x == 0:
        return "0"
    m, e = f"{x:.0e}".split("e")
    return f"{int(m)}\\times10^{{{int(e)}}}" if int(m) != 1 else f"10^{{{int(e)}}}"
