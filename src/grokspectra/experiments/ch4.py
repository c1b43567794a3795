"""Chapter 4 experiments: phase retrieval — does GD succeed exactly above δ_NN?

Finite-d full-batch GD (``multiindex.run_gd``, brief ``mw_theory.md`` §2.4) on y = φ(θ_*ᵀx) from random init,
batched over seeds × δ (one call per d), gives the success rate (|cos(θ_j, θ_*)| above a threshold after T steps,
brief §8) against δ = n/d; the spectral method (top eigenvector of (1/n) Σ T_δ(y_i) x_i x_iᵀ on its own sample,
brief §7) gives its own finite-d curve; warm (spectral, sample-split) init is compared with random init (§2.6, §10).
The predicted threshold comes from chapter 3's δ_NN when available, else from the linearised DMFT of brief §12.4.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import integrate, special

from .. import dmft
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
    Param("dnn_deltas", list, of=float, lo=0.25, hi=64.0, help="δ grid of the linearised-DMFT δ_NN"),
    Param("dnn_N", int, lo=1000, hi=10000000, help="DMFT paths (antithetic pairs) of the linearised DMFT"),
    Param("dnn_T", int, lo=8, hi=1000, help="DMFT steps of the linearised DMFT"),
    Param("dnn_rmin", float, lo=0.0, hi=1.0, help="growth rate per step above which the hard overlap is unstable"),
    Param("seed", int, lo=0, hi=2**31 - 1, help="base random seed"),
    Param("dtype", str, choices=("float32", "float64"), help="GD precision"),
)

MODULES = ["grokspectra.multiindex", "grokspectra.spectral", "grokspectra.transitions"]
DMFT_MODULES = ["grokspectra.multiindex", "grokspectra.dmft", "grokspectra.transitions"]




def make_link(p: dict) -> mi.Link:
    return mi.link(p["link"], c=p["clip"] if p["link"] == "pr_clip" else None)




def delta_alg(link_name: str, clip: float = math.inf) -> float:
    """Weak-recovery threshold of single-index models with E[z | y] = 0 (brief §7, Troiani et al. / Mondelli–
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


def _gd_sweep_one(act, m, eta, d, deltas, p, lk, dev, dt, gen_seed):
    """One d: GD from random init for every δ (grouped) × seed (batched)."""
    ns = [max(1, round(x * d)) for x in deltas]
    prob = mi.sample_problem(d, ns, 1, lk, trials=p["seeds"], device=dev, dtype=dt, generator=gen_seed)
    out = mi.run_gd(prob, m, eta, p["T"], act=act, n_test=p["n_test"], generator=gen_seed + 1)
    cos = hard_cos(out["M"], out["Q"])  # [G, R, T+1]
    return cos.cpu().numpy(), out["train"].cpu().numpy(), out["test"].cpu().numpy()


@experiment(SECTION, keys=["students", "link", "clip", "d_list", "deltas", "seeds", "T", "threshold", "n_test",
                           "seed", "dtype"], modules=MODULES)
def sweep(p: dict, device: torch.device) -> dict:
    """Success of GD from random init against δ, for every student and d (brief §8 protocol).

    GD is eq. ch4-gd (brief §2.4) on y = min(z², c) (or z², tanh z²) from θ_j ~ N(0, I/d); success is
    max_j |cos(θ_j, θ_*)| ≥ threshold (brief §2.5, §8). One batched ``run_gd`` call per (student, d).

    Parameters
    ----------
    p : dict
        ``students``, ``link``, ``clip``, ``d_list``, ``deltas``, ``seeds``, ``T``, ``threshold``, ``n_test``,
        ``seed``, ``dtype`` (see :data:`SCHEMA`).
    device : torch.device

    Returns
    -------
    dict of ndarray
        [student, d, δ, seed]: ``cos_final``, ``t_hit`` (first step with max_j|cos| ≥ threshold, linearly
        interpolated; nan when never), ``train_final``, ``test_final``; traces at the steps ``t_rec``:
        ``cos_tr``, ``train_tr``, ``test_tr`` [student, d, δ, seed, len(t_rec)]; ``deltas``, ``d_list``,
        ``delta_alg`` (eq. ch4-dalg).
    """
    dt = get_dtype(p["dtype"])
    lk = make_link(p)
    T = p["T"]
    t_rec = np.unique(np.round(np.concatenate([[0], np.geomspace(1, T, 60)])).astype(int))
    res = {k: [] for k in ("cos_final", "t_hit", "train_final", "test_final", "cos_tr", "train_tr", "test_tr")}
    steps = np.arange(T + 1, dtype=float)
    for si, spec in enumerate(p["students"]):
        act, m, eta = parse_student(spec)
        per_d = {k: [] for k in res}
        for di, d in enumerate(p["d_list"]):
            cos, train, test = _gd_sweep_one(act, m, eta, d, p["deltas"], p, lk, device, dt,
                                                    p["seed"] + 100000 * si + 1000 * di)
            per_d["cos_final"].append(cos[..., -1])
            per_d["t_hit"].append(tr.first_crossing(steps, cos, p["threshold"], direction="up"))
            per_d["train_final"].append(train[..., -1])
            per_d["test_final"].append(test[..., -1])
            per_d["cos_tr"].append(cos[..., t_rec])
            per_d["train_tr"].append(train[..., t_rec])
            per_d["test_tr"].append(test[..., t_rec])
        for k in res:
            res[k].append(np.stack(per_d[k]))
    out = {k: np.stack(v) for k, v in res.items()}
    out["t_rec"] = t_rec
    out["deltas"] = np.asarray(p["deltas"], dtype=float)
    out["d_list"] = np.asarray(p["d_list"])
    out["delta_alg"] = np.asarray(delta_alg(p["link"], p["clip"]))
    return out




def lal_trimmed(y, floor: float = -10.0):
    """Luo–Alghamdi–Lu preprocessing T*(y) = 1 − 1/y (brief §7), trimmed below at ``floor`` so that the spectral
    matrix stays finite for y → 0 (it only moves the bottom of the spectrum; the top outlier is what we use)."""
    return torch.clamp(sp.luo_alghamdi_lu_T(y), min=floor)


def spectral_dense(Theta_star, link_, n_spec: int, preprocess, *, generator) -> torch.Tensor:
    """Top eigenvector [trials, d] of (1/n) Σ_i T(y_i) x_i x_iᵀ on n_spec fresh samples (brief §7), by a dense
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


@experiment(SECTION, keys=["link", "clip", "d_list", "spec_deltas", "seeds", "seed", "dtype"],
            modules=MODULES)
def spectral_curve(p: dict, device: torch.device) -> dict:
    """The spectral method's own finite-d curve (brief §7).

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


@experiment(SECTION, keys=["students", "link", "clip", "init_d", "init_deltas", "seeds", "init_T", "n_test",
                           "spec_iters", "seed", "dtype"], modules=MODULES)
def init_compare(p: dict, device: torch.device) -> dict:
    """Random vs warm (spectral, sample-split) initialisation of the first student at d = ``init_d``.

    Warm init (brief §2.6): θ_j = ±v/√2 + w_j/√2 for m > 1 (θ = v for m = 1), v the spectral direction computed
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
        o = mi.run_gd(prob, m, eta, p["init_T"], act=act, n_test=p["n_test"], Theta0=Theta0, generator=seed + 2)
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


def analyse_sweep(res, threshold: float, spec=None) -> dict:
    """Success counts [student, d, δ] of GD (and [d, δ] of the spectral method when ``spec`` is given) and their
    logistic fits per (student, d): ``loc``/``loc_se``/``width``/``width_se`` [student, d]; ``loc_spec`` [d]."""
    k_gd = (res["cos_final"] >= threshold).sum(-1)
    n = res["cos_final"].shape[-1]
    x = res["deltas"]
    S, D = k_gd.shape[:2]
    out = {"k_gd": k_gd, "n": n}
    for name in ("loc", "loc_se", "width", "width_se"):
        out[name] = np.full((S, D), np.nan)
    for s in range(S):
        for d in range(D):
            f = fit_or_nan(x, k_gd[s, d], np.full(len(x), n))
            out["loc"][s, d], out["loc_se"][s, d] = f.loc, f.loc_se
            out["width"][s, d], out["width_se"][s, d] = f.width, f.width_se
    if spec is not None:
        k_sp = (spec["cos"] >= threshold).sum(-1)
        ns = spec["cos"].shape[-1]
        fits = [fit_or_nan(spec["deltas"], k_sp[d], np.full(len(spec["deltas"]), ns)) for d in range(k_sp.shape[0])]
        out.update(k_spec=k_sp, n_spec=ns, loc_spec=np.array([f.loc for f in fits]),
                   loc_spec_se=np.array([f.loc_se for f in fits]), width_spec=np.array([f.width for f in fits]))
    return out

def linearised_crossing(deltas, rates, rmin: float) -> float:
    """δ where the late-time growth rate r(δ) of the hard overlap first exceeds ``rmin`` (linear interpolation
    between grid points; brief §12.4). nan when it never does, −inf when it already does at the first δ."""
    deltas, rates = np.asarray(deltas, float), np.asarray(rates, float)
    above = rates > rmin
    if not above.any():
        return float("nan")
    i = int(np.argmax(above))
    if i == 0:
        return float("-inf")
    x0, x1, r0, r1 = deltas[i - 1], deltas[i], rates[i - 1], rates[i]
    return float(x0 + (rmin - r0) / (r1 - r0) * (x1 - x0))


@experiment(SECTION, keys=["students", "link", "clip", "dnn_deltas", "dnn_N", "dnn_T", "dnn_rmin", "seed"],
            modules=DMFT_MODULES)
def dnn_linearised(p: dict, device: torch.device) -> dict:
    """δ_NN from the linearised DMFT in the hard direction (brief §12.4, R7).

    Runs ``dmft.run_dmft`` (brief §3.3; antithetic paths, float64) from a tiny hard overlap M_0 = 10⁻³ and
    measures the per-step growth rate r of |M_t| over the second half of the run (``transitions.growth_rate``);
    r > ``dnn_rmin`` means the hard direction is unstable at the end of phase 1, i.e. δ > δ_NN.

    Parameters
    ----------
    p : dict
        ``students``, ``link``, ``clip``, ``dnn_deltas``, ``dnn_N``, ``dnn_T``, ``dnn_rmin``, ``seed``.
    device : torch.device

    Returns
    -------
    dict of ndarray
        ``rate`` [student, δ]; ``M``, ``train``, ``test`` [student, δ, T+1]; ``delta_lin`` [student], the
        interpolated crossing (:func:`linearised_crossing`); ``deltas``.
    """
    T, N = p["dnn_T"], p["dnn_N"] - p["dnn_N"] % 2
    lk = make_link(p)
    t = np.arange(T + 1, dtype=float)
    rate, Ms, trs, tes, cross = [], [], [], [], []
    for si, spec in enumerate(p["students"]):
        act, m, eta = parse_student(spec)
        M0 = np.full((1, m), 1e-3)
        r_s, M_s, tr_s, te_s = [], [], [], []
        for gi, dl in enumerate(p["dnn_deltas"]):
            o = dmft.run_dmft(act, lk, dl, eta, T, N, m, M0=M0, antithetic=True, device=device,
                              dtype=torch.float64, generator=p["seed"] + 31 * gi + 1000 * si)
            Mh = o["M"][:, 0, :].abs().amax(-1).cpu().numpy()
            r_s.append(float(tr.growth_rate(t, Mh, T / 2, T)))
            M_s.append(Mh)
            tr_s.append(o["train"].cpu().numpy())
            te_s.append(o["test"].cpu().numpy())
        rate.append(r_s)
        Ms.append(M_s)
        trs.append(tr_s)
        tes.append(te_s)
        cross.append(linearised_crossing(p["dnn_deltas"], r_s, p["dnn_rmin"]))
    return {"rate": np.asarray(rate), "M": np.asarray(Ms), "train": np.asarray(trs), "test": np.asarray(tes),
            "delta_lin": np.asarray(cross), "deltas": np.asarray(p["dnn_deltas"], float)}


def bench_gd(device="auto", quick: bool = False) -> dict:
    """Throughput of the batched GD sweep (the chapter's hot loop): seeds × δ groups of Quad m = 1 GD at one d."""
    import time

    from ..device import get_device, synchronize

    dev = get_device(device)
    d, seeds, T = (200, 4, 50) if quick else (1000, 8, 200)
    deltas = [4.0, 6.0, 8.0]
    lk = mi.link("pr_clip", c=6.0)
    prob = mi.sample_problem(d, [round(x * d) for x in deltas], 1, lk, trials=seeds, device=dev, generator=0)
    mi.run_gd(prob, 1, 0.1, 5, act="quad", n_test=1024, generator=1)  # warm-up
    synchronize(dev)
    t0 = time.perf_counter()
    mi.run_gd(prob, 1, 0.1, T, act="quad", n_test=1024, generator=1)
    synchronize(dev)
    wall = time.perf_counter() - t0
    rows = sum(prob.n) * seeds
    return {"device": str(dev), "d": d, "seeds": seeds, "deltas": deltas, "steps": T, "wall_s": wall,
            "steps_per_s": T / wall, "GB_per_s_X_reads": 2 * rows * d * 4 * T / wall / 1e9}


BENCHMARKS = {"phase_retrieval_gd": bench_gd}
