#!/usr/bin/env python
"""Double bootstrap of chapter 5's divergence-point rules (docs/ENGINEERING_LOG.md, "Agreement rules of chapters
4 and 5"): sweeps drawn from the paper fit, each fitted as the chapter fits it, each with its own bootstrap
multiplier q at its own fit (``transitions.divergence_z``); prints how often each rule rejects a true match.

    .venv/bin/python scripts/check_divergence_z.py [SWEEPS [DRAWS]]     # 300 300: about 20 min on one core

Rules: the fit alone, |δ̂_c − δ_c| ≤ 2 se (old) or ≤ q se; beside an independent normal value of s.e. 0.23 (GD's
threshold), ≤ 2 √(se² + 0.23²) (old), ≤ q_g √(se² + 0.23²) with q_g bootstrapped for the combined statistic
(rejected: not pivotal), and ≤ √((q se)² + (1.96 · 0.23)²) (``report.combined_tol``, the chapter's rule).
"""
import math
import sys
import time

import numpy as np

from grokspectra import report
from grokspectra import transitions as tr

X = np.array([5.5, 6.0, 6.5, 7.0, 8.0, 9.0, 10.0, 12.0])
TRUTH = tr.DivergenceFit(4.436, 1.262, 177.56, 0.70, 0.36, 0.138)  # chapter 5's paper fit
SG = 0.2276  # GD's s.e. at d = 1000 (chapter 4)


def combined_q(g: tr.DivergenceFit, draws: int, seed: int) -> float:
    """The rejected alternative: the 95 % point of |δ̂_c* − δ_c + z·SG| / √(se*² + SG²) over the bootstrap."""
    rng = np.random.default_rng(seed)
    sig = g.rms_log * math.sqrt(X.size / (X.size - 3))
    mu = np.log(g(X))
    stat = np.full(draws, np.inf)
    for i in range(draws):
        h = tr._divergence_solve(X, mu + sig * rng.standard_normal(X.size), [[g.delta_c, g.exponent, math.log(g.amplitude)]])
        if h is not None and np.isfinite(h.delta_c_se):
            stat[i] = abs(h.delta_c - g.delta_c + SG * rng.standard_normal()) / math.hypot(h.delta_c_se, SG)
    return float(np.quantile(stat, 0.95))


def main(sweeps: int = 300, draws: int = 300) -> None:
    rng = np.random.default_rng(7)
    sig = TRUTH.rms_log * math.sqrt(X.size / (X.size - 3))
    rej = dict.fromkeys(("alone 2se", "alone q", "GD 2se", "GD q_g", "GD combined_tol"), 0)
    t0 = time.time()
    for r in range(sweeps):
        g = tr.fit_divergence(X, TRUTH(X) * np.exp(sig * rng.standard_normal(X.size)))
        e, v = g.delta_c - TRUTH.delta_c, SG * rng.standard_normal()
        if not (np.isfinite(g.delta_c_se) and g.delta_c_se > 0):
            rej = {k: n + 1 for k, n in rej.items()}
            continue
        q = tr.divergence_z(X, g, draws=draws, seed=r)
        rej["alone 2se"] += abs(e) > 2 * g.delta_c_se
        rej["alone q"] += abs(e) > q * g.delta_c_se
        rej["GD 2se"] += abs(e - v) > 2 * math.hypot(g.delta_c_se, SG)
        rej["GD q_g"] += abs(e - v) > combined_q(g, draws, r) * math.hypot(g.delta_c_se, SG)
        rej["GD combined_tol"] += abs(e - v) > report.combined_tol(q * g.delta_c_se, report.Z95 * SG)
        if (r + 1) % 20 == 0 or r + 1 == sweeps:
            print(f"{r + 1} sweeps, {time.time() - t0:.0f} s: "
                  + ", ".join(f"{k} {n / (r + 1):.3f}" for k, n in rej.items()), flush=True)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
