"""Chapter 4 experiments: phase retrieval — does GD succeed exactly above δ_NN?

Finite-d full-batch GD (``multiindex.run_gd``, chapter 1) on y = φ(θ_*ᵀx) from random init,
batched over seeds × δ (one call per d), gives the success rate (|cos(θ_j, θ_*)| above a threshold after T steps,
chapter 4) against δ = n/d; the spectral method (top eigenvector of (1/n) Σ T_δ(y_i) x_i x_iᵀ on its own sample,
Mondelli–Montanari 2017) gives its own finite-d curve; warm (spectral, sample-split) init is compared with random init (chapter 1; chapter 4).
The predicted threshold comes from chapter 3's δ_NN when available, else from the linearised DMFT of eq. app-lin.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import integrate, special

from .. import multiindex as mi
from .. import spectral as sp
from .. import transitions as tr
from ..transitions import extreme_eigvecs, hard_cos, parse_student  # noqa: F401 (used by the notebook)
from ..device import get_dtype
from ..params import Param, ParamError, Schema
from . import experiment

SECTION = "ch4_phase_retrieval"

SCHEMA = Schema(
    Param("profile", str, help="parameter profile (ci, paper or a YAML path)"),
    Param("device", str, choices=("auto", "cpu", "cuda"), help="where to compute"),
    Param("students", list, of=str, help="networks as 'activation:m:eta', e.g. 'quad:1:0.1'"),
    Param("link", str, choices=("pr", "pr_clip", "pr_tanh"), help="target y = z², min(z², clip) or tanh(z²)"),
    Param("clip", float, lo=1.0, hi=100.0, help="label clip c of the pr_clip link"),
    Param("d_list", list, of=int, lo=16, hi=20000, help="input dimensions d"),
    Param("deltas", list, of=float, lo=0.25, hi=64.0, help="sample ratios δ = n/d of the sweep"),
    Param("seeds", int, lo=2, hi=4096, help="independent runs per (d, δ)"),
    Param("T", int, lo=10, hi=100000, help="GD steps"),
    Param("threshold", float, lo=0.05, hi=0.99, help="success: max_j |cos(θ_j, θ_*)| above this after T steps"),
    Param("n_test", int, lo=256, hi=1000000, help="fresh samples for the test risk"),
    Param("spec_deltas", list, of=float, lo=0.05, hi=64.0, help="δ grid of the spectral method's curve"),
    Param("spec_iters", int, lo=10, hi=100000, help="power iterations of the spectral method"),
    Param("init_d", int, lo=16, hi=20000, help="d of the random-vs-warm init comparison"),
    Param("init_deltas", list, of=float, lo=0.25, hi=64.0, help="δ values of the init comparison"),
    Param("init_T", int, lo=10, hi=100000, help="GD steps of the init comparison"),
    Param("seed", int, lo=0, hi=2**31 - 1, help="base random seed"),
    Param("dtype", str, choices=("float32", "float64"), help="GD precision"),
)





def make_link(p: dict) -> mi.Link:
    return mi.link(p["link"], c=p["clip"] if p["link"] == "pr_clip" else None)




def delta_alg(link_name: str, clip: float = math.inf) -> float:
    """Weak-recovery threshold of single-index models with E[z | y] = 0 (Mondelli–Montanari 2017, Troiani et al. / Mondelli–
    Montanari): 1/δ_alg = E_y[(E[z² | y] − 1)²].

    y = z²: E[z²|y] = y, so 1/δ_alg = E(z² − 1)² = 2. y = min(z², c): E[z²|y] = y below c and
    E[z² | z² ≥ c] = 1 + aϕ(a)/Q(a) (a = √c) on the atom y = c. y = tanh(z²) is a bijection of z², as y = z².
    """
    if link_name in ("pr", "pr_tanh") or (link_name == "pr_clip" and math.isinf(clip)):
        return 0.5
    if link_name != "pr_clip":
        raise ValueError(f"delta_alg knows the links 'pr', 'pr_clip', 'pr_tanh', not {link_name!r}")
    a = math.sqrt(clip)
    phi = math.exp(-a * a / 2) / math.sqrt(2 * math.pi)
    tail = 0.5 * special.erfc(a / math.sqrt(2))  # Q(a) = P(z > a)
    inner, _ = integrate.quad(lambda z: (z * z - 1) ** 2 * math.exp(-z * z / 2) / math.sqrt(2 * math.pi), -a, a,
                              epsabs=1e-13)
    atom = 2 * tail * (a * phi / tail) ** 2
    return 1.0 / (inner + atom)


SEED_BLOCK = 16  # seeds per unit at most
UNIT_ELEMENTS = 2 ** 28  # X of one unit (trials × n_max × d floats) at most: 1 GiB in float32
SWEEP_KEYS = ("cos_final", "t_hit", "train_final", "test_final", "cos_tr", "train_tr", "test_tr", "diverged")


def _t_rec(T: int) -> np.ndarray:
    return np.unique(np.round(np.concatenate([[0], np.geomspace(1, T, 60)])).astype(int))


def seeds_per_unit(d: int, n_max: int) -> int:
    """Seeds per unit of the sweep at this d: SEED_BLOCK, fewer when their data would pass UNIT_ELEMENTS (one
    seed per unit at d = 4000, δ ≤ 16)."""
    return int(min(SEED_BLOCK, max(1, UNIT_ELEMENTS // (n_max * d))))


def _sweep_units(p: dict) -> list[dict]:
    """One unit per (d, block of seeds): every student and every δ of a seed train on that seed's one data set
    (nested: δ uses its first δd samples), seeded from the unit's own indices."""
    for spec in p["students"]:
        parse_student(spec)
    units = []
    for di, d in enumerate(p["d_list"]):
        n_max = max(1, round(max(p["deltas"]) * d))
        blk = seeds_per_unit(int(d), n_max)
        for bi, b0 in enumerate(range(0, p["seeds"], blk)):
            units.append({"students": list(p["students"]), "link": p["link"], "clip": p["clip"], "d": int(d),
                          "deltas": [float(x) for x in p["deltas"]], "trials": min(blk, p["seeds"] - b0),
                          "T": p["T"], "threshold": p["threshold"], "n_test": p["n_test"], "dtype": p["dtype"],
                          "seed": p["seed"] + 1000 * di + 7919 * bi})
    return units


def _sweep_reduce(p: dict, units: list[dict], results: list[dict]) -> dict:
    out = {}
    for k in SWEEP_KEYS:
        rows = [np.concatenate([r[k] for u, r in zip(units, results) if u["d"] == d], axis=2) for d in p["d_list"]]
        out[k] = np.stack(rows, axis=1)  # [student, d, δ, seed, ...]
    out["t_rec"] = _t_rec(p["T"])
    out["deltas"] = np.asarray(p["deltas"], dtype=float)
    out["d_list"] = np.asarray(p["d_list"])
    out["delta_alg"] = np.asarray(delta_alg(p["link"], p["clip"]))
    return out


def _sweep_cost(u: dict) -> float:
    """About seconds on two idle CPU threads (the other chapters' models are per thread; the dry run's timed probe
    rescales either): per step and seed, the two skinny products of ``run_gd_shared`` cost a per-row term (reading
    X) and a per-row-and-column term (its flops); measured at d = 2000."""
    d = u["d"]
    ns = [max(1, round(x * d)) for x in u["deltas"]]
    cols = sum(parse_student(s)[1] for s in u["students"])
    return u["trials"] * u["T"] * d * (2e-9 * max(ns) + 6e-11 * cols * sum(ns))


def _sweep_shrink(u: dict) -> dict:
    return {**u, "d": min(u["d"], 200), "T": min(u["T"], 50)}


@experiment(SECTION, keys=["students", "link", "clip", "d_list", "deltas", "seeds", "T", "threshold", "n_test",
                           "seed", "dtype"], units=_sweep_units, reduce=_sweep_reduce, cost=_sweep_cost,
            shrink=_sweep_shrink)
def sweep(u: dict, device: torch.device) -> dict:
    """Success of GD from random init at one d, for every student and δ, on one block of seeds (chapter 4 protocol).

    GD is eq. ch4-gd on y = min(z², c) (or z², tanh z²) from θ_j ~ N(0, I/d); success is
    max_j |cos(θ_j, θ_*)| ≥ threshold (eq. ch4-success). Each seed draws one data set of n_max = δ_max·d samples;
    the run at δ uses its first δd samples, and each student starts from the same θ⁰ at every δ
    (``multiindex.run_gd_shared``: common random numbers across δ and students, so the success curves of one seed
    are nearly monotone in δ and the seeds are the independent units of the analysis). The assembled experiment
    holds, [student, d, δ, seed]: ``cos_final``, ``t_hit`` (first step with max_j|cos| ≥ threshold, linearly
    interpolated; nan when never), ``train_final``, ``test_final``, ``diverged`` (the run's loss or weights became
    non-finite or exceeded 1e30; it counts as a failure); traces at the steps ``t_rec``: ``cos_tr``, ``train_tr``,
    ``test_tr`` [student, d, δ, seed, len(t_rec)]; ``deltas``, ``d_list``, ``delta_alg`` (eq. ch4-dalg).
    """
    studs = [parse_student(s) for s in u["students"]]
    lk = mi.link(u["link"], c=u["clip"] if u["link"] == "pr_clip" else None)
    d, T = u["d"], u["T"]
    ns = [max(1, round(x * d)) for x in u["deltas"]]
    prob = mi.sample_problem(d, max(ns), 1, lk, trials=u["trials"], device=device, dtype=get_dtype(u["dtype"]),
                             generator=u["seed"])
    t_rec = _t_rec(T)
    outs = mi.run_gd_shared(prob, ns, studs, T, n_test=u["n_test"], test_at=t_rec, diverged="mark",
                            generator=u["seed"] + 1)
    steps = np.arange(T + 1, dtype=float)
    res = {k: [] for k in SWEEP_KEYS}
    for g in outs:
        cos = hard_cos(g["M"], g["Q"]).cpu().numpy()  # [G, R, T+1]
        train, test = g["train"].cpu().numpy(), g["test"].cpu().numpy()  # test at t_rec
        res["cos_final"].append(cos[..., -1])
        res["t_hit"].append(tr.first_crossing(steps, cos, u["threshold"], direction="up"))
        res["train_final"].append(train[..., -1])
        res["test_final"].append(test[..., -1])
        res["cos_tr"].append(cos[..., t_rec])
        res["train_tr"].append(train[..., t_rec])
        res["test_tr"].append(test)
        res["diverged"].append((g["diverged_at"] >= 0).cpu().numpy())
    return {k: np.stack(v) for k, v in res.items()}  # [student, δ, seed, ...]


def lal_trimmed(y, floor: float = -10.0):
    """Luo–Alghamdi–Lu preprocessing T*(y) = 1 − 1/y (Mondelli–Montanari 2017), trimmed below at ``floor`` so that the spectral
    matrix stays finite for y → 0 (it only moves the bottom of the spectrum; the top outlier is what we use)."""
    return torch.clamp(sp.luo_alghamdi_lu_T(y), min=floor)


def spectral_dense(Theta_star, link_, n_spec: int, preprocess, *, generator) -> torch.Tensor:
    """Top eigenvector [trials, d] of (1/n) Σ_i T(y_i) x_i x_iᵀ on n_spec fresh samples (Mondelli–Montanari 2017), by a dense
    eigensolver (:func:`extreme_eigvecs`, float64): the exact spectral estimator that
    ``multiindex.spectral_direction`` approximates by power iteration (same sampling order, so the same generator
    state gives the same data; the tests compare the two)."""
    lk = mi.link(link_)
    trials, d, k = Theta_star.shape
    X = torch.randn(trials, n_spec, d, device=Theta_star.device, dtype=Theta_star.dtype, generator=generator)
    eps = torch.randn(trials, n_spec, device=X.device, dtype=X.dtype, generator=generator) if lk.noise else None
    Tn = preprocess(lk(X @ Theta_star, eps)).double()
    X = X.double()
    C = X.transpose(1, 2) @ (Tn[..., None] * X) / n_spec
    if not bool(torch.isfinite(C).all()):
        raise ValueError(f"spectral matrix is not finite at n = {n_spec}, d = {d} (a pole of the preprocessing?)")
    return extreme_eigvecs(C, "top")[1][..., 0].to(Theta_star.dtype)


def _spectral_curve_cost(p: dict) -> float:
    """About seconds on one CPU thread: per (d, δ), seeds × (n·d² for the spectral matrix + d³ for its top
    eigenvector)."""
    return sum(p["seeds"] * (1e-10 * dl * d ** 3 + 2e-8 * dl * d * d + 1e-10 * d ** 3)
               for d in p["d_list"] for dl in p["spec_deltas"])


def _spectral_curve_shrink(p: dict) -> dict:
    """The largest d, its two largest δ and four seeds."""
    return {**p, "d_list": p["d_list"][-1:], "spec_deltas": p["spec_deltas"][-2:], "seeds": 4}


@experiment(SECTION, keys=["link", "clip", "d_list", "spec_deltas", "seeds", "seed", "dtype"],
            cost=_spectral_curve_cost, shrink=_spectral_curve_shrink)
def spectral_curve(p: dict, device: torch.device) -> dict:
    """The spectral method's own finite-d curve (Mondelli–Montanari 2017).

    Parameters
    ----------
    p : dict
        ``link``, ``clip``, ``d_list``, ``spec_deltas``, ``seeds``, ``seed``, ``dtype``.
    device : torch.device

    Returns
    -------
    dict of ndarray
        ``cos`` [d, δ, seed]: |cos(v, θ_*)| of the top eigenvector v of (1/n) Σ_i T(y_i) x_i x_iᵀ with the trimmed
        Luo–Alghamdi–Lu preprocessing (:func:`lal_trimmed`), computed densely (:func:`spectral_dense`) on
        n = δd fresh samples; ``deltas``.
    """
    dt = get_dtype(p["dtype"])
    lk = make_link(p)
    cos = []
    for di, d in enumerate(p["d_list"]):
        seed = p["seed"] + 5_000_000 + 1000 * di
        gen = mi.make_generator(seed, device)
        row = []
        for dl in p["spec_deltas"]:
            n = max(1, round(dl * d))
            Ts = mi.random_orthonormal(p["seeds"], d, 1, device=device, dtype=dt, generator=gen)
            v = spectral_dense(Ts, lk, n, lal_trimmed, generator=gen)
            row.append((v[..., None, :] @ Ts).reshape(-1).abs())
        cos.append(torch.stack(row))
    return {"cos": torch.stack(cos).cpu().numpy(), "deltas": np.asarray(p["spec_deltas"], float)}


def _init_compare_cost(p: dict) -> float:
    """About seconds on one CPU thread: per δ, the power iteration (iters·seeds·n·d) and two GD runs (random and
    warm init, seeds·n·d·T, plus seeds·n_test·T for the test risk)."""
    m = parse_student(p["students"][0])[1]
    d, S, T = p["init_d"], p["seeds"], p["init_T"]
    gd = sum(2.2e-9 * S * dl * d * d * T * (1 + m) / 2 + 3.5e-8 * S * p["n_test"] * T for dl in p["init_deltas"])
    return 2 * gd + sum(4e-9 * p["spec_iters"] * S * dl * d * d for dl in p["init_deltas"])


def _init_compare_shrink(p: dict) -> dict:
    """The first δ, 100 GD steps and 50 power iterations."""
    return {**p, "init_deltas": p["init_deltas"][:1], "init_T": min(p["init_T"], 100),
            "spec_iters": min(p["spec_iters"], 50)}


@experiment(SECTION, keys=["students", "link", "clip", "init_d", "init_deltas", "seeds", "init_T", "n_test",
                           "spec_iters", "seed", "dtype"], cost=_init_compare_cost, shrink=_init_compare_shrink)
def init_compare(p: dict, device: torch.device) -> dict:
    """Random vs warm (spectral, sample-split) initialisation of the first student at d = ``init_d``.

    Warm init (chapter 1): θ_j = ±v/√2 + w_j/√2 for m > 1 (θ = v for m = 1), v the spectral direction computed
    on an independent sample of the same size n (so the training data stay independent of Θ^0), w_j ~ N(0, I/d),
    with the Mondelli–Montanari preprocessing T_δ(y) = (y₊ − 1)/(y₊ + √δ − 1) (bounded for δ ≥ 1, which keeps the
    power iteration's shift small), by ``multiindex.spectral_direction``.
    Arrays [init (0 random, 1 warm), δ, seed, T+1]: ``cos``, ``test``, ``train``; ``cos_spec0`` [δ, seed].
    """
    dt = get_dtype(p["dtype"])
    lk = make_link(p)
    act, m, eta = parse_student(p["students"][0])
    d = p["init_d"]
    ns = [max(1, round(x * d)) for x in p["init_deltas"]]
    seed = p["seed"] + 7_000_000
    prob = mi.sample_problem(d, ns, 1, lk, trials=p["seeds"], device=device, dtype=dt, generator=seed)
    gen = mi.make_generator(seed + 1, device)
    theta0, c0 = [], []
    for n, Ts in zip(ns, prob.Theta_star):
        dl = n / d
        v = mi.spectral_direction(Ts, lk, n, lambda y, dl=dl: sp.mondelli_montanari_T(y, dl),
                                  iters=p["spec_iters"], generator=gen)
        c0.append((v[..., None, :] @ Ts).reshape(-1).abs())
        if m == 1:
            th = v[..., None]
        else:
            signs = torch.tensor([(-1.0) ** j for j in range(m)], device=device, dtype=dt)
            w = torch.randn(v.shape[0], d, m, device=device, dtype=dt, generator=gen) / math.sqrt(d)
            th = (v[..., None] * signs + w) / math.sqrt(2.0)
        theta0.append(th)
    outs = []
    for Theta0 in (None, theta0):
        o = mi.run_gd(prob, m, eta, p["init_T"], act=act, n_test=p["n_test"], Theta0=Theta0, diverged="mark",
                      generator=seed + 2)
        outs.append(o)
    return {
        "cos": torch.stack([hard_cos(o["M"], o["Q"]) for o in outs]).cpu().numpy(),
        "test": torch.stack([o["test"] for o in outs]).cpu().numpy(),
        "train": torch.stack([o["train"] for o in outs]).cpu().numpy(),
        "cos_spec0": torch.stack(c0).cpu().numpy(),
        "deltas": np.asarray(p["init_deltas"], dtype=float),
    }


def fit_or_nan(x, k, n) -> tr.SuccessFit:
    """:func:`transitions.fit_success_curve`, or a fit full of nan when the data do not bracket a transition
    (all runs failed or all succeeded on the grid) — reported as such in the text, never silently."""
    try:
        return tr.fit_success_curve(x, k, n)
    except (ValueError, tr.FitError):
        nan = float("nan")
        return tr.SuccessFit(nan, nan, nan, nan, nan, 0)


BOOT = 400  # seed-bootstrap resamples for the standard errors of the success-curve fits


def bootstrap_fit_se(x, success, *, reps: int = BOOT, seed: int = 0) -> tuple[float, float, int]:
    """Standard errors of the logistic fit's location and width by resampling *seeds* (the columns of
    ``success`` [δ, seed], with replacement) and refitting (Efron 1979). The runs of one seed at different δ share
    their data (nested samples), so the points of a success curve are not independent binomials and the inverse
    Fisher information of :func:`transitions.fit_success_curve` does not apply; the seed is the independent unit.
    Returns (loc_se, width_se, fits that succeeded); nan when fewer than half of them did."""
    success = np.asarray(success, dtype=bool)
    n = success.shape[1]
    rng = np.random.default_rng(seed)
    locs, widths = [], []
    for _ in range(reps):
        k = success[:, rng.integers(0, n, n)].sum(1)
        f = fit_or_nan(x, k, np.full(len(x), n))
        if np.isfinite(f.loc) and np.isfinite(f.width):
            locs.append(f.loc)
            widths.append(f.width)
    if len(locs) < reps / 2:
        return float("nan"), float("nan"), len(locs)
    return float(np.std(locs, ddof=1)), float(np.std(widths, ddof=1)), len(locs)


def analyse_sweep(res, threshold: float, spec=None) -> dict:
    """Success counts [student, d, δ] of GD (and [d, δ] of the spectral method when ``spec`` is given) and their
    logistic fits per (student, d): ``loc``/``width`` [student, d] with standard errors ``loc_se``/``width_se``
    from a bootstrap over seeds (:func:`bootstrap_fit_se`: the δ points of one seed share data), and the
    Fisher-information ones, ``loc_se_fisher``, which would hold for independent points; ``loc_spec`` [d]."""
    succ = res["cos_final"] >= threshold  # [student, d, δ, seed]
    k_gd = succ.sum(-1)
    n = res["cos_final"].shape[-1]
    x = res["deltas"]
    S, D = k_gd.shape[:2]
    out = {"k_gd": k_gd, "n": n}
    for name in ("loc", "loc_se", "width", "width_se", "loc_se_fisher"):
        out[name] = np.full((S, D), np.nan)
    for s in range(S):
        for d in range(D):
            f = fit_or_nan(x, k_gd[s, d], np.full(len(x), n))
            out["loc"][s, d], out["loc_se_fisher"][s, d], out["width"][s, d] = f.loc, f.loc_se, f.width
            if np.isfinite(f.loc):
                out["loc_se"][s, d], out["width_se"][s, d], _ = bootstrap_fit_se(x, succ[s, d], seed=1000 * s + d)
    if spec is not None:
        # the spectral curve's own d grid (its result may come from another profile than the sweep's): rows are
        # matched to the sweep's d, nan where the spectral result has no such d
        dd = [int(v) for v in res["d_list"]]
        spec_d = [int(v) for v in getattr(spec, "meta", {}).get("params", {}).get("d_list", dd)]
        k_all = (spec["cos"] >= threshold).sum(-1)
        ns = spec["cos"].shape[-1]
        k_sp = np.full((D, k_all.shape[1]), np.nan)
        loc_sp, loc_sp_se, width_sp = (np.full(D, np.nan) for _ in range(3))
        for i, d in enumerate(dd):
            if d in spec_d:
                k_sp[i] = k_all[spec_d.index(d)]
                f = fit_or_nan(spec["deltas"], k_sp[i], np.full(len(spec["deltas"]), ns))
                loc_sp[i], loc_sp_se[i], width_sp[i] = f.loc, f.loc_se, f.width
        out.update(k_spec=k_sp, n_spec=ns, loc_spec=loc_sp, loc_spec_se=loc_sp_se, width_spec=width_sp)
    return out

def budget_check(res, threshold: float, grow: float = 2.0, floor: float = 3.0) -> dict:
    """Is GD's success at the step budget T limited by time or by δ? Per [student, d, δ] of the sweep:

    * ``t_med`` — median crossing step of the runs that succeed (nan when none does);
    * ``late`` — successes that cross in the second half of the budget (step > T/2);
    * ``failed`` — runs below the threshold at T, and ``growing`` — failed runs still on their way up: their
      overlap max_j|cos(θ_j, θ_*)| grew by more than ``grow``× between the recorded step nearest T/2 and T and
      exceeds ``floor``/√d (the random level). An exponential escape (rate 1 + η|λ_out| per step, chapter 5)
      multiplies the overlap many times over T/2 steps, so a failed run that is escaping is caught here.

    Few ``late`` and no ``growing`` runs mean the budget does not truncate the transition: failed runs are stuck,
    not slow. ``half`` is the recorded step used for T/2."""
    t_rec = np.asarray(res["t_rec"])
    T = int(t_rec[-1])
    ih = int(np.argmin(np.abs(t_rec - T / 2)))
    cos, t_hit = np.asarray(res["cos_tr"]), np.asarray(res["t_hit"])
    d = np.asarray(res["d_list"], float)[None, :, None, None]
    ok = np.isfinite(t_hit) & (np.asarray(res["cos_final"]) >= threshold)
    failed = ~ok
    growing = failed & (cos[..., -1] > grow * cos[..., ih]) & (cos[..., -1] > floor / np.sqrt(d))
    t_med = np.full(t_hit.shape[:3], np.nan)
    for idx in np.ndindex(*t_hit.shape[:3]):
        if ok[idx].any():
            t_med[idx] = float(np.median(t_hit[idx][ok[idx]]))
    return {"t_med": t_med, "late": (ok & (t_hit > T / 2)).sum(-1), "failed": failed.sum(-1),
            "growing": growing.sum(-1), "successes": ok.sum(-1), "T": T, "half": int(t_rec[ih])}


def budget_sentence(B: dict, dd, deltas, students: list[str], loc) -> str:
    """What :func:`budget_check` says at each student's largest d, at the grid δ nearest its δ_c(d) (``loc``
    [student, d]), and over the whole sweep, with the detection limit of the "still growing" test: an exponential
    escape at rate η|λ_out| per step doubles the overlap over the second half of the budget only when
    η|λ_out| ≥ 2 ln 2 / T."""
    parts = []
    for s, spec in enumerate(students):
        lab = student_label(spec).split(" student")[0]
        i = len(dd) - 1
        if not np.isfinite(loc[s, i]):
            continue
        j = int(np.argmin(np.abs(np.asarray(deltas) - loc[s, i])))
        parts.append(f"for the {lab} student at d = {int(dd[i])} and δ = {deltas[j]:g} (nearest δ_c(d) = "
                     f"{loc[s, i]:.2f}), {int(B['successes'][s, i, j])} runs succeed, "
                     f"{int(B['late'][s, i, j])} of them after step {B['T'] // 2}, and "
                     f"{int(B['growing'][s, i, j])} of the {int(B['failed'][s, i, j])} failed runs are still growing")
    tot_f, tot_g = int(B["failed"].sum()), int(B["growing"].sum())
    tot_s, tot_l = int(B["successes"].sum()), int(B["late"].sum())
    verdict = ("Failed runs are stuck, not slow: a longer budget would convert few of them, so the step budget "
               "does not set δ_c(d) at these d." if tot_g <= 0.05 * max(tot_f, 1) else
               "A sizeable share of the failed runs is still escaping at T: δ_c(d) is set partly by the step budget "
               "and is an upper estimate of the infinite-time threshold at these d.")
    _, _, eta0 = parse_student(students[0])
    rate = 2 * math.log(2) / B["T"]
    limit = (f"The test sees an escape whose rate η|λ_out| is at least 2 ln 2 / T = {rate:.4f} per step (|λ_out| ≥ "
             f"{rate / eta0:.3f} for η = {eta0:g}); slower escapes, from an outlier closer to the bulk, would pass "
             "for stuck.")
    return ("At T = " + f"{B['T']}: " + "; ".join(parts) + ". Over the whole sweep, " + f"{tot_g} of {tot_f} failed "
            f"runs grew their overlap more than twofold between step {B['half']} and T, and {tot_l} of {tot_s} "
            f"successes crossed after step {B['T'] // 2}. " + verdict + " " + limit)


def crossing_log_fits(res, student: int = 0, reps: int = BOOT, seed: int = 0) -> list[dict]:
    """The median crossing step against d, fitted by t = a + b·log d (the escape time of eq. ch5-tgrok,
    log(τ/m₀)/log(1 + η|λ_out|) with m₀ ∝ d^{-1/2}, whose intercept may be negative), at every δ where every seed
    of every d succeeds (so the median is not censored by the budget). Standard errors of the medians from a
    bootstrap over seeds; weighted least squares (``transitions.fit_line_wls``); χ² with (number of d − 2)
    degrees of freedom and its p-value."""
    t_hit = np.asarray(res["t_hit"])[student]  # [d, δ, seed]
    dd = np.asarray(res["d_list"], float)
    rng = np.random.default_rng(seed)
    out = []
    for j, dl in enumerate(np.asarray(res["deltas"])):
        h = t_hit[:, j]
        if not np.isfinite(h).all() or len(dd) < 3:
            continue
        R = h.shape[-1]
        med = np.median(h, -1)
        boot = np.median(h[:, rng.integers(0, R, (reps, R))], -1)  # [d, reps]
        se = boot.std(-1, ddof=1)
        if not (se > 0).all():
            continue
        out.append({"delta": float(dl), "med": med, "se": se, **tr.fit_line_wls(np.log(dd), med, se)})
    return out


def crossing_log_sentence(fits: list[dict], dd) -> str:
    """What :func:`crossing_log_fits` says, one clause per δ."""
    if not fits:
        return ""
    parts = "; ".join(f"δ = {f['delta']:g}: {f['med'][0]:.0f} → {f['med'][-1]:.0f} steps, slope b = {f['b']:.1f} ± "
                      f"{f['b_se']:.1f} per unit of log d, χ² = {f['chi2']:.1f} ({f['dof']} dof, p = {f['p']:.2f})"
                      for f in fits)
    worst = min(f["p"] for f in fits)
    verdict = ("The growth is consistent with a logarithmic law at every one of these δ (no p ≤ 0.01)."
               if worst > 0.01 else "A logarithmic law is rejected (p ≤ 0.01) at some δ.")
    return (f"Where every run succeeds, the median crossing step from d = {int(dd[0])} to {int(dd[-1])}, fitted by "
            f"t = a + b log d (bootstrap errors of the medians): {parts}. {verdict}")


def linearised_crossing(deltas, rates, rmin: float) -> float:
    """δ where the late-time growth rate r(δ) of the hard overlap first exceeds ``rmin`` (linear interpolation
    between grid points; eq. app-lin). nan when it never does, −inf when it already does at the first δ."""
    deltas, rates = np.asarray(deltas, float), np.asarray(rates, float)
    above = rates > rmin
    if not above.any():
        return float("nan")
    i = int(np.argmax(above))
    if i == 0:
        return float("-inf")
    x0, x1, r0, r1 = deltas[i - 1], deltas[i], rates[i - 1], rates[i]
    return float(x0 + (rmin - r0) / (r1 - r0) * (x1 - x0))


def student_label(spec: str) -> str:
    """'quad:1:0.1' → 'quadratic student, m = 1, η = 0.1' (figure titles and prose)."""
    act, m, eta = parse_student(spec)
    names = {"quad": "quadratic", "gelu": "GeLU", "relu": "ReLU", "tanh": "tanh"}
    return f"{names.get(act, act)} student, m = {m}, η = {eta:g}"


def thresholds(Dn, DL, p: dict) -> dict:
    """The predicted thresholds of chapter 3 for this chapter's first student and target: δ_NN(t) at the latest t
    computed (Hessian criterion, eq. ch3-dnn) with its uncertainty √(half-bracket² + MC spread²) and whether the
    bulk edge was still < 0 there (†), and δ_lin(T) at the longest horizon (nan when undecided). For the agreement
    rules (:func:`claims`) the two parts also come apart: ``*_brk``, the largest distance from the root to an end
    of its bisection bracket (a range: the root is the bracket's geometric mean), and ``*_mc``, its Monte-Carlo s.e. ``text`` is a
    sentence for the chapter. Everything is nan when chapter 3's grid does not contain this setting."""
    act, m, eta = parse_student(p["students"][0])
    q, ql = Dn.meta["params"], DL.meta["params"]
    nan = float("nan")
    out = {"delta_nn": nan, "delta_nn_unc": nan, "delta_nn_brk": nan, "delta_nn_mc": nan, "t": 0, "dagger": False,
           "delta_lin": nan, "delta_lin_unc": nan, "delta_lin_brk": nan, "delta_lin_mc": nan, "lin_T": 0, "lin_lo": nan, "lin_hi": nan, "lin_why": "", "by_t": [], "text": ""}
    same = (act in q["dnn_acts"] and m in q["dnn_ms"] and p["link"] in q["dnn_links"] and 1.0 in q["dnn_scales"]
            and abs(q[f"eta_{act}"] * m - eta) < 1e-12 and (p["link"] != "pr_clip" or p["clip"] == 6.0))
    if same:
        idx = (q["dnn_acts"].index(act), q["dnn_ms"].index(m), q["dnn_links"].index(p["link"]),
               q["dnn_scales"].index(1.0), len(q["dnn_times"]) - 1)
        v, lo, hi, se = (float(Dn[k][idx]) for k in ("delta_nn", "lo", "hi", "root_mc_se"))
        e, ese = float(Dn["edge"][idx]), float(Dn["edge_se"][idx])
        out["by_t"] = [(int(t), float(Dn["delta_nn"][idx[:4] + (it,)]),
                        math.hypot(0.5 * float(Dn["hi"][idx[:4] + (it,)] - Dn["lo"][idx[:4] + (it,)]),
                                   float(Dn["root_mc_se"][idx[:4] + (it,)])))
                       for it, t in enumerate(q["dnn_times"])]
        out.update(delta_nn=v, delta_nn_unc=math.hypot(0.5 * (hi - lo), se), delta_nn_brk=max(hi - v, v - lo),
                   delta_nn_mc=se, t=int(q["dnn_times"][-1]),
                   dagger=bool(e + 2 * ese < 0), dnn_status=float(Dn["status"][idx]))
    lin_ok = act == "quad" and m == 1 and p["link"] == "pr_clip" and p["clip"] == 6.0 and abs(eta - ql["eta_quad"]) < 1e-12
    if lin_ok:
        i = len(DL["horizons"]) - 1
        out.update(lin_T=int(DL["horizons"][i]), lin_lo=float(DL["lo"][i]), lin_hi=float(DL["hi"][i]),
                   lin_why=("no sign change of its criterion in the bracket" if int(DL["status"][i]) == 3
                            else "Monte-Carlo-limited"))
        if int(DL["status"][i]) <= 1 and np.isfinite(DL["root_mc_se"][i]):
            out.update(delta_lin=float(DL["root"][i]),
                       delta_lin_unc=math.hypot(0.5 * (DL["hi"][i] - DL["lo"][i]), float(DL["root_mc_se"][i])),
                       delta_lin_brk=float(max(DL["hi"][i] - DL["root"][i], DL["root"][i] - DL["lo"][i])),
                       delta_lin_mc=float(DL["root_mc_se"][i]))
    if np.isfinite(out["delta_nn"]):
        txt = (f"For this student chapter 3 gives δ_NN(t = {out['t']}) = {out['delta_nn']:.2f} ± "
               f"{out['delta_nn_unc']:.2f} (half its bracket and its Monte-Carlo spread combined)"
               + (", with the bulk edge still below zero there: phase 1 has not ended, and δ_NN(t) was still rising "
                  "with t" if out["dagger"] else "") + ". ")
    elif same and np.isfinite(out.get("dnn_status", nan)):
        why = ("no sign change of the criterion in its bracket", "the DMFT broke down in its bracket",
               "an end of its bracket undecided")[{3: 0, 4: 1}.get(int(out["dnn_status"]), 2)]
        txt = (f"For this student chapter 3's bisection at t = {int(q['dnn_times'][-1])} found no δ_NN ({why}), so "
               "none is drawn. ")
    elif same:
        txt = "Chapter 3 has not computed this student and target yet, so no δ_NN is drawn. "
    else:
        txt = "Chapter 3's grid does not contain this student and target, so no δ_NN is drawn. "
    if lin_ok:
        txt += (f"The linearised DMFT gives δ_lin(T = {out['lin_T']}) = {out['delta_lin']:.2f} ± "
                f"{out['delta_lin_unc']:.2f}." if np.isfinite(out["delta_lin"]) else
                f"The linearised DMFT's threshold at T = {out['lin_T']} is undecided between {out['lin_lo']:g} and "
                f"{out['lin_hi']:g} at the path numbers of this build ({out['lin_why']}; chapter 3).")
    out["text"] = txt
    return out


FSS_LAWS = {"inv_log": "1/\\log d", "inv_sqrt": "d^{-1/2}"}  # LaTeX labels
FSS_PLAIN = {"inv_log": "1/log d", "inv_sqrt": "d^(-1/2)"}


def finite_size_laws(d, loc, se) -> dict:
    """δ_c(d) fitted with each finite-size law of :data:`FSS_LAWS` (``transitions.fit_finite_size``, weighted by
    the logistic fits' standard errors): per law the limit δ_c(∞), its statistical s.e., the residuals and χ²; and
    the systematic uncertainty of δ_c(∞) = half the spread of the limits across laws. Needs ≥ 2 finite points;
    returns {} otherwise."""
    d, loc, se = (np.asarray(v, dtype=float) for v in (d, loc, se))
    ok = np.isfinite(loc) & np.isfinite(se) & (se > 0)
    if ok.sum() < 2:
        return {}
    fits = {}
    for form in FSS_LAWS:
        f = tr.fit_finite_size(d[ok], loc[ok], se[ok], form=form)
        res = loc[ok] - f(d[ok])
        fits[form] = {"fit": f, "limit": f.limit, "limit_se": f.limit_se, "resid": res,
                      "chi2": float(np.sum((res / se[ok]) ** 2)), "dof": int(ok.sum() - 2)}
    lims = [v["limit"] for v in fits.values()]
    return {"fits": fits, "d": d[ok], "loc": loc[ok], "se": se[ok], "syst": 0.5 * (max(lims) - min(lims)),
            "mid": 0.5 * (max(lims) + min(lims)), "stat": max(v["limit_se"] for v in fits.values())}


def gap_sentence(thr: dict, fss: dict, A: dict, dd, si: int = 0) -> str:
    """Where GD's transition sits relative to δ_NN(t) of chapter 3, in words: δ_c at the largest d and δ_c(∞)
    against δ_NN at every t computed, each gap in units of the combined uncertainty, and whether δ_NN(t) moves
    towards or away from GD's threshold as t grows; for the student ``si`` of ``A``. "" when either side is
    missing."""
    pts = [(t, v, u) for t, v, u in thr.get("by_t", []) if np.isfinite(v)]
    loc, se = float(A["loc"][si, -1]), float(A["loc_se"][si, -1])
    if not pts or not np.isfinite(loc):
        return ""
    t1, v1, u1 = pts[-1]
    parts = [f"GD's transition at d = {int(dd[-1])}, δ_c = {loc:.2f}"
             + (f" ± {se:.2f}" if np.isfinite(se) else "")
             + f", lies {abs(v1 - loc):.2f} {'below' if loc < v1 else 'above'} δ_NN(t = {t1}) = {v1:.2f} ± {u1:.2f}"]
    if fss:
        z = abs(fss["mid"] - v1) / math.hypot(fss["stat"], fss["syst"], u1)
        parts.append(f"its extrapolation δ_c(∞) = {fss['mid']:.2f} is {z:.1f} combined uncertainties "
                     f"{'below' if fss['mid'] < v1 else 'above'} it")
    txt = "; ".join(parts) + "."
    if len(pts) >= 2:
        t0, v0, _ = pts[0]
        away = abs(v1 - loc) > abs(v0 - loc)
        txt += (f" From t = {t0} to t = {t1} δ_NN(t) moves from {v0:.2f} to {v1:.2f}, "
                + ("away from" if away else "towards") + " GD's threshold"
                + (": reading the criterion later, closer to the end of the first phase, widens the gap."
                   if away else "."))
    return txt


def outlier_window(rt: dict, deltas) -> dict:
    """t*(δ): the DMFT step after which the first phase has no informative negative outlier at sample ratio δ, i.e.
    δ < δ_NN(t) for t > t*, inverted from chapter 3's grid of δ_NN(t) (``ch3.limit_roots``; δ_NN(t) increases with
    t) by log-linear interpolation of t in δ_NN(t). ``lo``/``hi``: the same with δ_NN(t) ± its uncertainty
    (jackknife s.e. and interpolation error). Arrays [δ]: ``t``, ``lo``, ``hi`` (nan off the grid) and ``where``:
    "in grid", "before" (δ below δ_NN at the first step: no outlier at any computed step) or "after" (the outlier
    outlives the last computed step)."""
    t, r = np.asarray(rt["times"], float), np.asarray(rt["root"], float)
    u = np.hypot(np.asarray(rt["root_se"], float), np.asarray(rt["interp"], float))
    if not (np.all(np.isfinite(r)) and np.all(np.diff(r) > 0)):
        raise ValueError(f"δ_NN(t) must be finite and increase with t to be inverted; got {np.round(r, 3).tolist()}")
    lt = np.log(t)

    def inv(rr, dl):
        rr = np.maximum.accumulate(rr)  # keep the shifted curve monotone
        return float(np.exp(np.interp(dl, rr, lt))) if rr[0] <= dl < rr[-1] else float("nan")

    d = np.asarray(deltas, float)
    where = np.array(["before" if x < r[0] else "after" if x >= r[-1] else "in grid" for x in d])
    return {"t": np.array([inv(r, x) for x in d]), "lo": np.array([inv(r + u, x) for x in d]),
            "hi": np.array([inv(r - u, x) for x in d]), "where": where, "deltas": d, "t_first": float(t[0]),
            "t_last": float(t[-1])}


def escape_vs_window(res, si: int, tw: dict, threshold: float) -> dict:
    """GD's crossings (step of |cos| ≥ ``threshold``, successful runs) against t*(δ) (:func:`outlier_window` on the
    sweep's δ), for student ``si``. Arrays [d, δ]: ``succ`` (successful runs), ``late`` (of them, those that cross
    after the upper end of t*'s band, when the DMFT's informative outlier is gone; nan where t* is off the grid),
    ``t_med`` (median crossing step of the successful runs) and ``within`` (those that cross by the grid's last
    step)."""
    t_hit = np.asarray(res["t_hit"], float)[si]
    ok = np.isfinite(t_hit) & (np.asarray(res["cos_final"], float)[si] >= threshold)
    # a band whose upper end is off the grid (nan: the outlier may outlive the last computed step) counts no
    # crossing as late: no crossing is known to come after the outlier has gone
    hi = np.nan_to_num(np.asarray(tw["hi"], float), nan=np.inf)[None, :, None]
    late = np.where(np.isfinite(tw["t"])[None, :], (ok & (t_hit > hi)).sum(-1), np.nan)
    with np.errstate(all="ignore"):  # nan where a (d, δ) has no success
        t_med = np.nanmedian(np.where(ok, t_hit, np.nan), axis=-1)
    return {"succ": ok.sum(-1), "late": late, "t_med": t_med,
            "within": (ok & (t_hit <= tw["t_last"])).sum(-1)}


def _band(tw: dict, j: int) -> str:
    """t*'s band at δ index j as text; an end off the grid reads "before the first step" / "beyond the last"."""
    lo = f"{tw['lo'][j]:.0f}" if np.isfinite(tw["lo"][j]) else f"< {tw['t_first']:g}"
    hi = f"{tw['hi'][j]:.0f}" if np.isfinite(tw["hi"][j]) else f"> {tw['t_last']:g}, beyond the grid"
    return f"[{lo}, {hi}]"


def escape_window_sentence(E: dict, tw: dict, d_list) -> str:
    """At the largest d: per δ whose t* lies on the grid and that has successes, how many successful runs cross
    after t*; how many of the runs at δ whose outlier outlives the grid cross within its steps; and the runs that
    succeed at δ with no outlier at any computed step."""
    i = len(d_list) - 1
    parts, tot, late = [], 0, 0
    for j, dl in enumerate(tw["deltas"]):
        n = int(E["succ"][i, j])
        if tw["where"][j] == "in grid" and n:
            k = int(E["late"][i, j])
            tot, late = tot + n, late + k
            parts.append(f"at δ = {dl:g}, t* = {tw['t'][j]:.0f} {_band(tw, j)} and {k} of {n} "
                         f"successful runs cross after it (median crossing step {E['t_med'][i, j]:.0f})")
    if not parts:
        return ""
    s = (f"At d = {int(d_list[i])}, " + "; ".join(parts) + f": {late} of {tot} crossings in all come after the "
         "DMFT's informative outlier has gone. " + (
             "So at these δ most escapes end after the outlier of the first phase is gone: it does not carry them "
             "to the end, and GD succeeds at δ below δ_NN(t) for the steps at which it escapes." if 2 * late > tot
             else "Most escapes end while the outlier is there, as the paper's picture has it."))
    grid = [j for j, w in enumerate(tw["where"]) if w == "in grid"]
    if len(d_list) > 1 and grid:
        per_d = [(int(d_list[k]), int(np.nansum(E["late"][k, grid])), int(np.sum(E["succ"][k, grid])))
                 for k in range(len(d_list))]
        s += (" The same count at each d: " + ", ".join(f"{a} of {b} at d = {d_}" for d_, a, b in per_d) + ".")
    after = [j for j, w in enumerate(tw["where"]) if w == "after" and E["succ"][i, j]]
    if after:
        n = int(sum(E["succ"][i, j] for j in after))
        k = int(sum(E["within"][i, j] for j in after))
        s += (f" At δ ≥ {tw['deltas'][after[0]]:g} the outlier outlives the last computed step (t = "
              f"{tw['t_last']:.0f}), and {k} of the {n} successful runs there cross before that step.")
    before = [(dl, int(E["succ"][i, j])) for j, dl in enumerate(tw["deltas"]) if tw["where"][j] == "before"
              and E["succ"][i, j]]
    if before:
        s += (" Runs succeed even where the criterion finds no outlier at any computed step (t ≥ "
              f"{tw['t_first']:.0f}): " + ", ".join(f"{n} at δ = {dl:g}" for dl, n in before) + ".")
    return s


def limit_applies(lim: dict | None, student: str, p: dict) -> bool:
    """Is chapter 3's δ_NN(∞) (``ch3.limit_summary``) computed for this student, link and step size?"""
    if not lim:
        return False
    act, m, eta = parse_student(student)
    return (act == lim["act"] and m == lim["m"] and p["link"] == lim["link"] and abs(eta - lim["eta"]) < 1e-12
            and (p["link"] != "pr_clip" or p["clip"] == lim["clip"]))


def limit_gap(lim: dict, fss: dict) -> tuple[float, float]:
    """(combined uncertainty, |δ_NN(∞) − δ_c(∞)| in its units): the jackknife s.e. and window spread of chapter
    3's limit and the statistical and systematic errors of GD's extrapolated δ_c(∞), in quadrature."""
    u = math.sqrt(lim["inf_se"] ** 2 + lim["inf_syst"] ** 2 + fss["stat"] ** 2 + fss["syst"] ** 2)
    return u, abs(lim["inf"] - fss["mid"]) / u


def limit_gap_sentence(lim: dict, fss: dict) -> str:
    """Chapter 3's δ_NN(∞) against GD's extrapolated δ_c(∞), in combined uncertainties (:func:`limit_gap`), and
    whether the limit is established. "" without both."""
    if not lim or not fss or not (np.isfinite(lim["inf"]) and np.isfinite(fss["mid"])):
        return ""
    _, z = limit_gap(lim, fss)
    s = (f"The limit of chapter 3, δ_NN(∞) = {lim['inf']:.2f} ± {lim['inf_se']:.2f} ± {lim['inf_syst']:.2f} "
         f"(δ_NN(t) for t ≤ {lim['t_max']}), "
         f"lies {z:.1f} combined uncertainties {'above' if lim['inf'] > fss['mid'] else 'below'} GD's "
         f"δ_c(∞) = {fss['mid']:.2f}")
    return s + ("." if lim["ok"] else ", but chapter 3 does not establish that this limit is where the first phase "
                "ends (the bulk edge is not shown to reach zero, or the limit itself is not resolved), so this is not "
                "a test of the paper's claim.")


def threshold_table(thr: dict, fss: dict, A: dict, dd, dalg: float, si: int = 0, lim: dict | None = None) -> str:
    """The chapter's comparison of δ_NN(t), δ_NN(∞) (when ``lim`` is given: ``ch3.limit_summary`` for this
    student), δ_lin(T), δ_c(∞) under each finite-size law (and combined), δ_c at the largest d and δ_alg, each with
    its uncertainty, as a markdown table; for the student ``si`` of ``A``."""
    f = lambda v: "–" if not np.isfinite(v) else f"{v:.2f}"  # noqa: E731
    rows = ["| threshold | how it is computed | value | uncertainty |", "|---|---|---|---|"]
    rows.append(f"| δ_NN($t$ = {thr['t']}){'†' if thr['dagger'] else ''} | Hessian criterion on the DMFT law (ch. 3) | "
                f"{f(thr['delta_nn'])} | ± {f(thr['delta_nn_unc'])} (bracket and Monte Carlo) |")
    if lim:
        rows.append(f"| δ_NN(∞){'' if lim['ok'] else ' (not established)'} | limit of δ_NN($t$), "
                    f"$t$ ≤ {lim['t_max']} (ch. 3, eq. ch3-limit) | {f(lim['inf'])} | ± {f(lim['inf_se'])} "
                    f"(jackknife) ± {f(lim['inf_syst'])} (fit window) |")
    if np.isfinite(thr["delta_lin"]):
        rows.append(f"| δ_lin($T$ = {thr['lin_T']}) | linearised DMFT (ch. 3) | {f(thr['delta_lin'])} | "
                    f"± {f(thr['delta_lin_unc'])} |")
    elif thr["lin_T"]:
        rows.append(f"| δ_lin($T$ = {thr['lin_T']}) | linearised DMFT (ch. 3) | undecided | "
                    f"within [{thr['lin_lo']:g}, {thr['lin_hi']:g}] ({thr['lin_why']}) |")
    if fss:
        for form, lab in FSS_LAWS.items():
            g = fss["fits"][form]
            rows.append(f"| δ_c(∞), ${lab}$ law | extrapolated GD success curve | {f(g['limit'])} | "
                        f"± {f(g['limit_se'])} (stat.; χ² = {g['chi2']:.1f} for {g['dof']} dof) |")
        rows.append(f"| δ_c(∞) | both laws | {f(fss['mid'])} | ± {f(fss['stat'])} (stat.) ± {f(fss['syst'])} (syst.) |")
    rows.append(f"| δ_c($d$ = {int(dd[-1])}) | logistic fit at the largest $d$ | {f(float(A['loc'][si, -1]))} | "
                f"± {f(float(A['loc_se'][si, -1]))} |")
    rows.append(f"| δ_alg | eq. ch4-dalg | {dalg:.3f} | exact |")
    return "\n".join(rows)


def tol_rule(tol: float) -> str:
    """The agreement rule of this chapter's threshold rows, in words, with the tolerance it gives."""
    return f"systematic range + 1.96 × statistical s.e. = {tol:.2f}"


def claims(thr, fss, A, dd, dalg, res, med_warm, med_rand, frac_warm, frac_rand, med_succ, med_fail, both,
           profile: str, *, thr_profile: str | None = None, spec_profile: str | None = None,
           init_scale: str | None = None, lim: dict | None = None) -> list:
    """The chapter's claims table (``report.Claim`` rows, each with the scale it was judged at): ``profile`` is the
    sweep's, ``thr_profile`` chapter 3's thresholds', ``spec_profile`` the spectral curve's and ``init_scale`` the
    init comparison's (each defaults to the sweep's); ``lim`` (``ch3.limit_summary`` for this student) adds the
    comparison of δ_c(∞) with the limit δ_NN(∞)."""
    from .. import report

    thr_profile = thr_profile or profile

    rows = []
    n = int(A["n"])
    dmax = int(dd[-1])
    scale = f"{profile}: d ≤ {dmax}, {n} seeds"
    big = dmax >= 4000 and n >= 16
    dn, dn_u = thr["delta_nn"], thr["delta_nn_unc"]
    dn_brk, dn_mc = (v if np.isfinite(v) else 0.0 for v in (thr["delta_nn_brk"], thr["delta_nn_mc"]))
    # 1. GD success jumps at δ_NN (a d → ∞ claim)
    if fss:
        tol = report.range_tol(math.hypot(fss["stat"], dn_mc), fss["syst"] + dn_brk)
        agree = report.within(fss["mid"], dn, tol)
        note = f"(|Δ| ≤ {tol_rule(tol)})"
        if thr["dagger"] and agree is not None:
            agree, note = None, "δ_NN(t) is read before the end of phase 1 (†): not a test; " + note
        ours = (f"δ_c(∞) = {fss['mid']:.2f} ± {fss['stat']:.2f} (stat.) ± {fss['syst']:.2f} (syst.: "
                + ", ".join(f"{lab}: {fss['fits'][k]['limit']:.2f}" for k, lab in FSS_PLAIN.items()) + ")")
    else:
        agree, note, ours = None, "no finite-size fit", "–"
    rows.append(report.at_scale(report.Claim(
        "GD's success rate jumps at δ_NN", "[MW26], numerical validation (phase retrieval)",
        f"δ_NN(t = {thr['t']}) = {report.fmt(dn)} ± {report.fmt(dn_u)}", ours, agree, note),
        scale, comparable=big, needs="d = 4000, ≥ 16 seeds"))
    # 1b. … at the limit t → ∞ of δ_NN(t) (chapter 3), where phase 1 ends if the bulk edge reaches zero there
    if lim and fss:
        tol = report.range_tol(math.hypot(lim["inf_se"], fss["stat"]), lim["inf_syst"] + fss["syst"])
        gap = abs(lim["inf"] - fss["mid"])
        agree = report.within(fss["mid"], lim["inf"], tol) if lim["ok"] else None
        note = (f"(|Δ| ≤ {tol_rule(tol)})" if lim["ok"] else
                f"|Δ| = {gap:.2f} against a tolerance of {tol:.2f}, but chapter 3 does not establish δ_NN(∞) as the "
                "end of phase 1: not a test")
        rows.append(report.at_scale(report.Claim(
            "GD's success rate jumps at δ_NN = lim δ_NN(t)", "[MW26], numerical validation; our eq. ch3-limit",
            f"δ_NN(∞) = {lim['inf']:.2f} ± {lim['inf_se']:.2f} ± {lim['inf_syst']:.2f} (t ≤ {lim['t_max']})",
            f"δ_c(∞) = {fss['mid']:.2f} ± {fss['stat']:.2f} (stat.) ± {fss['syst']:.2f} (syst.)", agree, note),
            scale, comparable=big, needs="d = 4000, ≥ 16 seeds"))
    # 2. the linearised DMFT agrees with the Hessian criterion
    if np.isfinite(thr["delta_lin"]):
        tol = report.range_tol(math.hypot(thr["delta_lin_mc"], dn_mc), thr["delta_lin_brk"] + dn_brk)
        rows.append(report.at_scale(report.Claim(
            "δ_lin (linearised DMFT) = δ_NN (Hessian criterion)", "eqs. app-lin and app-dnn",
            "equal", f"{thr['delta_lin']:.2f} vs {report.fmt(dn)}", report.within(thr["delta_lin"], dn, tol),
            f"(|Δ| ≤ {tol_rule(tol)}; horizons T = {thr['lin_T']}, t = {thr['t']})"), thr_profile))
    elif thr["lin_T"]:
        rows.append(report.at_scale(report.Claim(
            "δ_lin (linearised DMFT) = δ_NN (Hessian criterion)", "eqs. app-lin and app-dnn", "equal",
            f"δ_lin undecided in [{thr['lin_lo']:g}, {thr['lin_hi']:g}]", None, f"{thr['lin_why']}: not a test"),
            thr_profile))
    # 3. δ_NN > δ_alg
    rows.append(report.at_scale(report.Claim(
        "δ_NN > δ_alg (GD needs more data than the best spectral method)", "[MW26], abstract", "δ_NN > δ_alg",
        f"{report.fmt(dn)} vs {report.fmt(dalg)}",
        bool(dn - report.range_tol(dn_mc, dn_brk) > dalg) if report.finite(dn, dn_u) else None,
        "(δ_NN − its bracket − 1.96 × its Monte-Carlo s.e. > δ_alg)"), thr_profile))
    # 4. the spectral method succeeds at smaller δ than GD
    ok = np.isfinite(A["loc_spec"]) & np.isfinite(A["loc"][0])
    sp_below = bool(np.all(A["loc_spec"][ok] < A["loc"][0][ok])) if ok.any() else None
    rows.append(report.at_scale(report.Claim(
        "the spectral method succeeds at smaller δ than GD", "[MM17], [LAL19] with [MW26]",
        "δ_c(spectral) < δ_c(GD) at every d",
        ", ".join(f"d = {int(d)}: {report.fmt(a)} < {report.fmt(b)}"
                  for d, a, b, o in zip(dd, A["loc_spec"], A["loc"][0], ok) if o) or "no d with both fits", sp_below),
        scale if (spec_profile or profile) == profile else f"{scale} (GD); {spec_profile} (spectral)"))
    # 5. test risk follows the overlap
    rows.append(report.at_scale(report.Claim(
        "successful runs generalise, failed ones do not", "[MW26] (feature learning = learning span Θ_*)",
        "test risk low / high", f"medians {report.fmt(med_succ)} / {report.fmt(med_fail)} at d = {dmax}",
        bool(med_succ * 10 < med_fail) if both else None, "(a factor ≥ 10 between the medians)"), scale))
    # 6. warm init removes the plateau
    rows.append(report.at_scale(report.Claim(
        "warm (spectral) init removes the plateau", "[MW26], talk abstract (initialisation dependence)",
        "warm runs cross at once", f"median step {report.fmt(med_warm)} (warm) vs {report.fmt(med_rand)} "
        f"(random, {frac_rand:.0%} reach it)",
        bool(frac_warm >= frac_rand and (not np.isfinite(med_rand) or med_warm < med_rand / 3))
        if np.isfinite(med_warm) else None, "(warm ≥ random success and ≥ 3× faster)"), init_scale or scale))
    return rows


def gd_shared_floor(X: torch.Tensor, ns: list[int], cols: int, reps: int = 3) -> dict:
    """The floor of one step of ``multiindex.run_gd_shared`` on one seed's data X [n_max, d], timed here with plain
    products of the engine's sizes, in the engine's order: for each row segment [lo, hi) of the nested sizes, with
    c active columns, the forward product W [c, d]·X[lo:hi]ᵀ, then for each segment the backward product
    Fᵀ [c, hi−lo]·X[lo:hi] (best of ``reps`` whole sequences, the faster of torch's and NumPy's BLAS): a step
    does at least these products. Together they read X twice; on the 2-core AVX-512 host of December 2026 they
    took about twice as long as two plain reads of X (≈ 100 GFLOP/s: bound by both the flops and the traffic).
    Also, for comparison: each segment's product repeated alone (``cache_hot_s``: its rows of X stay in cache
    between repetitions, which a step, reading all of X, cannot have) and two reads of X (``two_reads_s``, timed
    as sums). Seconds per step."""
    import time

    import numpy as np

    g = torch.Generator().manual_seed(0)
    n_max, d = X.shape
    desc = sorted(ns, reverse=True) + [0]
    per = cols // len(ns)
    segs = [(desc[a], desc[a - 1], a * per) for a in range(len(ns), 0, -1) if desc[a - 1] > desc[a]]
    W = torch.randn(cols, d, generator=g, dtype=X.dtype)
    F = torch.randn(cols, n_max, generator=g, dtype=X.dtype)
    U = torch.empty(cols, n_max, dtype=X.dtype)
    Gr = torch.empty(cols, d, dtype=X.dtype)

    def best(fn) -> float:
        fn()
        out = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            out = min(out, time.perf_counter() - t0)
        return out

    def torch_step():
        for lo, hi, c in segs:
            torch.mm(W[:c], X[lo:hi].T, out=U[:c, lo:hi])
        for lo, hi, c in segs:
            torch.mm(F[:c, lo:hi], X[lo:hi], out=Gr[:c])

    Xn, Wn, Fn = X.numpy(), W.numpy(), F.numpy()

    def numpy_step():
        for lo, hi, c in segs:
            np.matmul(Wn[:c], Xn[lo:hi].T)
        for lo, hi, c in segs:
            np.matmul(Fn[:c, lo:hi], Xn[lo:hi])

    hot = 0.0
    for lo, hi, c in segs:
        xs, w, f = X[lo:hi], W[:c], F[:c, lo:hi]
        hot += min(best(lambda: w @ xs.T), best(lambda: np.matmul(w.numpy(), xs.numpy().T)))
        hot += min(best(lambda: f @ xs), best(lambda: np.matmul(f.numpy(), xs.numpy())))
    read = best(lambda: X.sum())
    return {"products_s": min(best(torch_step), best(numpy_step)), "cache_hot_s": hot, "two_reads_s": 2 * read}


def bench_gd(device="auto", quick: bool = False) -> dict:
    """The chapter's hot loop: one seed of the paper sweep (both paper students, the paper's nine δ, nested data)
    by ``multiindex.run_gd_shared``, against (i) the floor of its products measured in the same run
    (:func:`gd_shared_floor`) and (ii) the engine it replaced, one ``multiindex.run_gd`` per (student, δ) on its
    own data, timed side by side. Quick: d = 500 and 10 steps; full: d = 2000 and 20 steps."""
    import time

    from ..device import get_device, synchronize

    dev = get_device(device)
    d, T = (500, 10) if quick else (2000, 20)
    deltas = [3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0, 16.0]
    students = ["quad:1:0.1", "gelu:2:2.0"]
    studs = [parse_student(s) for s in students]
    ns = [round(x * d) for x in deltas]
    lk = mi.link("pr_clip", c=6.0)
    prob = mi.sample_problem(d, max(ns), 1, lk, trials=1, device=dev, generator=0)

    def timed(fn) -> float:
        fn(2)  # warm-up
        synchronize(dev)
        t0 = time.perf_counter()
        fn(T)
        synchronize(dev)
        return (time.perf_counter() - t0) / T

    shared = timed(lambda t: mi.run_gd_shared(prob, ns, studs, t, n_test=1024, test_at=[t], diverged="mark",
                                              generator=1))
    sub = mi.sample_problem(d, ns, 1, lk, trials=1, device=dev, generator=0)
    separate = timed(lambda t: [mi.run_gd(sub, m, eta, t, act=act, n_test=1024, diverged="mark", generator=1)
                                for act, m, eta in studs])
    out = {"device": str(dev), "d": d, "deltas": deltas, "students": students, "steps": T,
           "shared_s_per_step": shared, "separate_s_per_step": separate, "speedup": separate / shared}
    if dev.type == "cpu":
        fl = gd_shared_floor(prob.X[0][0], ns, len(ns) * sum(m for _, m, _ in studs))
        out.update(floor_s_per_step=fl["products_s"], two_reads_s=fl["two_reads_s"], cache_hot_s=fl["cache_hot_s"],
                   vs_floor=shared / fl["products_s"], ratio_to_floor=shared / fl["products_s"])
    return out


BENCHMARKS = {"phase_retrieval_gd": bench_gd}
