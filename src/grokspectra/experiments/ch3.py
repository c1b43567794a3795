"""Chapter 3: hard-direction outliers of the GD Hessian and the threshold δ_NN (book appendix, eqs. app-weights,
app-bulk, app-outlier, app-overlap, app-dnn, app-lin; the mechanism of Montanari & Wang, arXiv:2602.01434).

Experiments:

* ``outliers``: for a Quad and a GeLU student, across δ on both sides of the transition and over several seeds, the
  lowest eigenpair of the exact GD Hessian against the outlier equation Φ_t(z) = E[ζζᵀ ⊗ G_t(I + S_t G_t/δ)⁻¹] − zI
  on each run's own empirical weights D_i, on the DMFT law with antithetic paths (hard overlap exactly 0, the d → ∞
  law), on the DMFT law seeded with the finite-d hard overlap d^{-1/2}, and on the plain-sampling DMFT law.
* ``settle``: does the first phase settle (order parameters converge, bulk edge ≥ 0)? Quad toy, ridge λ grid.
* ``dnn``: δ_NN(t) by noise-controlled bisection in δ (``transitions.noisy_bisect``; DMFT per δ, antithetic) on the
  grid activation × width × link × init scale, at each step of ``dnn_times``.
* ``alg``: δ_alg = 1/2 of phase retrieval from the spectral method, in theory (m = 1, G = T(y)) and at finite d.
* ``linear`` and ``dlin``: the linearised DMFT (eq. app-lin): trajectories, and its threshold δ_lin(T).
* ``limit``: the Hessian criterion and the bulk edge of the Quad toy on a δ grid at many steps t (one DMFT run per
  δ and path set serves every t): δ_NN(t) and the edge at it as functions of t, for their t → ∞ limit.

Benchmark ``eig``: lowest eigenpairs of H at d = 4000, m = 4 (matrix-free Lanczos).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from .. import dmft, hessian as hs, multiindex as mi, spectral as sp
from .. import sweep, transitions as tr
from ..device import device_name, get_device, synchronize
from ..params import Param, ParamError, Schema
from . import costs, experiment

SECTION = "ch3_outlier"
SCHEMA = Schema(
    Param("profile", str, help="parameter profile"),
    Param("device", str, choices=("auto", "cpu", "cuda"), help="auto, cpu or cuda"),
    Param("quad_t", int, lo=1, hi=500, help="GD step of the Quad outlier comparison"),
    Param("gelu_t", int, lo=1, hi=500, help="GD step of the GeLU outlier comparison"),
    Param("out_d", int, lo=50, hi=20000, help="input dimension of the outlier comparison"),
    Param("out_N", int, lo=1000, hi=10**7, help="DMFT paths of the outlier comparison"),
    Param("out_seeds", int, lo=1, hi=256, help="independent GD runs per δ of the outlier comparison"),
    Param("quad_deltas", list, of=float, lo=0.5, hi=100.0, help="δ grid, Quad m=1, y=min(z²,6), η=0.1"),
    Param("gelu_deltas", list, of=float, lo=0.5, hi=100.0, help="δ grid, GeLU m=2, y=tanh z², η=2"),
    Param("dnn_acts", list, of=str, help="activations of the δ_NN table"),
    Param("dnn_ms", list, of=int, lo=1, hi=16, help="widths of the δ_NN table"),
    Param("dnn_links", list, of=str, help="links of the δ_NN table: pr_clip, pr_tanh, pr"),
    Param("dnn_scales", list, of=float, lo=0.01, hi=10.0, help="init scales: Q_0 = scale · I"),
    Param("dnn_times", list, of=int, lo=1, hi=1000, help="steps t at which δ_NN is evaluated"),
    Param("dnn_N", int, lo=1000, hi=10**7, help="DMFT paths per δ of the bisection"),
    Param("dnn_rtol", float, lo=1e-3, hi=0.5, help="relative width of the final δ bracket"),
    Param("dnn_Nmax", int, lo=1000, hi=10**7, help="most DMFT paths per replicate (doubling while undecided)"),
    Param("dnn_reps", int, lo=2, hi=64, help="independent path sets per δ of the bisection"),
    Param("dnn_run_gib", float, lo=0.5, hi=10**5, help="most memory (GiB) of one DMFT run of the δ_NN grid: a "
          "width whose run at dnn_Nmax paths needs more doubles its paths only while they fit"),
    Param("dnn_lo", float, lo=0.5, hi=100.0, help="lower end of the δ_NN bracket"),
    Param("dnn_hi", float, lo=0.5, hi=100.0, help="upper end of the δ_NN bracket"),
    Param("eta_quad", float, lo=1e-3, hi=10.0, help="per-neuron step η/m for Quad"),
    Param("eta_gelu", float, lo=1e-3, hi=10.0, help="per-neuron step η/m for GeLU"),
    Param("alg_deltas", list, of=float, lo=0.1, hi=50.0, help="δ grid of the spectral method"),
    Param("alg_d", int, lo=50, hi=20000, help="dimension of the spectral method at finite d"),
    Param("alg_trials", int, lo=1, hi=100, help="trials per δ of the spectral method"),
    Param("lin_deltas", list, of=float, lo=0.5, hi=100.0, help="δ of the linearised-DMFT check"),
    Param("lin_T", int, lo=1, hi=500, help="steps of the linearised-DMFT check"),
    Param("lin_N", int, lo=1000, hi=10**7, help="DMFT paths of the linearised-DMFT check"),
    Param("settle_delta", float, lo=0.5, hi=100.0, help="δ of the first-phase convergence check"),
    Param("settle_lams", list, of=float, lo=0.0, hi=10.0, help="ridge λ values of the convergence check"),
    Param("settle_T", int, lo=10, hi=1000, help="DMFT steps of the convergence check"),
    Param("settle_N", int, lo=1000, hi=10**7, help="DMFT paths per replicate of the convergence check"),
    Param("settle_lag", int, lo=1, hi=500, help="Δ of the criterion |x_T − x_{T−Δ}| < tol"),
    Param("settle_tol", float, lo=1e-6, hi=1.0, help="tolerance of the convergence criterion"),
    Param("dlin_horizons", list, of=int, lo=8, hi=1000, help="horizons T of the growth-rate threshold δ_lin(T)"),
    Param("dlin_N0", int, lo=1000, hi=10**7, help="DMFT paths per replicate at the start of each δ"),
    Param("dlin_Nmax", int, lo=1000, hi=10**7, help="most DMFT paths per replicate (doubling while undecided)"),
    Param("dlin_reps", int, lo=2, hi=64, help="independent path sets per δ"),
    Param("dlin_rtol", float, lo=1e-3, hi=0.5, help="relative width of the δ_lin bracket"),
    Param("dlin_lo", float, lo=0.5, hi=100.0, help="lower end of the δ_lin bracket"),
    Param("dlin_hi", float, lo=0.5, hi=100.0, help="upper end of the δ_lin bracket"),
    Param("lim_deltas", list, of=float, lo=0.5, hi=100.0, help="δ grid of the t → ∞ limit of δ_NN(t)"),
    Param("lim_times", list, of=int, lo=1, hi=1000, help="steps t of δ_NN(t) on that grid"),
    Param("lim_N", int, lo=1000, hi=10**7, help="DMFT paths per replicate of the δ_NN(t) grid"),
    Param("lim_reps", int, lo=3, hi=64, help="independent path sets per δ of the δ_NN(t) grid"),
    Param("lim_tmin", int, lo=1, hi=1000, help="earliest step t of the fits of δ_NN(t) and of the edge at it"),
    Param("seed", int, lo=0, hi=10**6, help="random seed"),
)
STUDENTS = {"quad": dict(act="quad", m=1, eta=0.1, link="pr_clip"), "gelu": dict(act="gelu", m=2, eta=2.0, link="pr_tanh")}


def _even(n: int) -> int:
    return max(2, n - n % 2)


# --- cost model of `run --dry-run`: about seconds on one CPU thread (measured); the timed probe rescales it ----------
def _bisect_points(lo: float, hi: float, rtol: float) -> int:
    """δ points of one ``noisy_bisect``: the two ends and the halvings of log(hi/lo) down to log(1 + rtol)."""
    halvings = math.log2(max(math.log(hi / lo), 1e-9) / math.log1p(rtol)) if hi > lo else 0.0
    return 2 + min(20, max(0, math.ceil(halvings)))


def _bisect_paths(n0: int, n_max: int) -> float:
    """Typical paths per replicate at a δ point of a bisection doubling them from n0 up to n_max: √(n0·n_max)."""
    return math.sqrt(n0 * max(n0, n_max))


def _law(r, t, act, lk):
    law = r["law"][t]
    G = mi.per_sample_D(law["u"], law["y"], act).double().cpu()
    return G, law["z"][:, list(lk.hard)].double().cpu()


def _outlier_row(G, zeta, delta):
    o = sp.outlier(G, zeta, delta)
    return [o["root"] if o["exists"] else np.nan, o["overlap"] if o["exists"] else np.nan, o["edge"], o["phi_edge"]]


OUT_BLOCK = 4  # GD seeds per unit of the outlier comparison (at d = 2000 and δ = 48, 4 float64 problems: 6 GB)


def _outliers_units(p: dict) -> list[dict]:
    """Per student and δ: one unit of DMFT laws, and the ``out_seeds`` GD runs in blocks of ``OUT_BLOCK`` seeds
    (each block its own data and initialisation seeds), the cheapest student first."""
    units = []
    for si, name in enumerate(STUDENTS):
        for gi, dl in enumerate(p[f"{name}_deltas"]):
            base = {"student": name, "delta": float(dl), "t": p[f"{name}_t"], "out_d": p["out_d"], "seed": p["seed"]}
            units.append({**base, "kind": "dmft", "out_N": p["out_N"], "dmft_seed": p["seed"] + 10 + gi})
            for b, s0 in enumerate(range(0, p["out_seeds"], OUT_BLOCK)):
                k = 1000 * si + 50 * gi + b
                units.append({**base, "kind": "gd", "seeds": [s0, min(s0 + OUT_BLOCK, p["out_seeds"])],
                              "data_seed": p["seed"] + 1 + 2 * k, "init_seed": p["seed"] + 2 + 2 * k})
    return units


def _outliers_reduce(p: dict, units: list[dict], results: list[dict]) -> dict:
    """Per student: the blocks of each δ joined along the seed axis (in seed order), the DMFT rows, and the median
    |M_t| of GD over all seeds (the last column of ``{name}_M``)."""
    out = {}
    for name in STUDENTS:
        deltas = p[f"{name}_deltas"]
        rows = {k: [] for k in ("gd", "emp", "cos", "fail", "anti", "seeded", "plain", "M")}
        for dl in deltas:
            mine = [(u, r) for u, r in zip(units, results) if u["student"] == name and u["delta"] == float(dl)]
            gd = sorted([(u["seeds"][0], r) for u, r in mine if u["kind"] == "gd"], key=lambda x: x[0])
            dm = [r for u, r in mine if u["kind"] == "dmft"][0]
            for k in ("gd", "emp", "cos"):
                rows[k].append(np.concatenate([np.asarray(r[k]) for _, r in gd], 0))
            rows["fail"].append(np.concatenate([np.asarray(r["fail"]) if "fail" in r else
                                                np.zeros(len(np.asarray(r["cos"]))) for _, r in gd]))
            for k in ("anti", "seeded", "plain"):
                rows[k].append(np.asarray(dm[k]))
            m_gd = np.concatenate([np.asarray(r["M_gd"]) for _, r in gd])
            rows["M"].append(np.append(np.asarray(dm["M"]), np.median(m_gd)))
        out[f"{name}_deltas"] = np.array(deltas)
        out[f"{name}_t"] = np.array(p[f"{name}_t"])
        out.update({f"{name}_{k}": np.array(v) for k, v in rows.items()})
    return out


def _outliers_cost(u: dict) -> float:
    """A GD block: GD (seeds·n·d·t) and per seed a dense eigendecomposition ((md)³, n·(md)²) and its outlier
    equation; a DMFT unit: three DMFT runs (N·m²·t²) and their outlier equations."""
    d, m, t = u["out_d"], STUDENTS[u["student"]]["m"], u["t"]
    n = round(u["delta"] * d)
    if u["kind"] == "dmft":
        return 3 * (costs.dmft_s(u["out_N"], t, m) + costs.law_s(u["out_N"], m))
    R = u["seeds"][1] - u["seeds"][0]
    return costs.gd_s(n, d, m, t, R) + R * (costs.eigh_s(n, d, m) + costs.law_s(n, m))


def _outliers_shrink(u: dict) -> dict:
    """The unit at d = 100 with one seed, or with a small DMFT law."""
    return {**u, "out_d": 100, **({"out_N": 2000} if u["kind"] == "dmft" else {"seeds": [0, 1]})}


@experiment(SECTION, keys=["quad_t", "gelu_t", "out_d", "out_N", "out_seeds", "quad_deltas", "gelu_deltas", "seed"],
            units=_outliers_units, reduce=_outliers_reduce, cost=_outliers_cost, shrink=_outliers_shrink)
def outliers(u, device):
    """Lowest eigenpair of the GD Hessian vs the outlier equation (eq. app-outlier, app-overlap), for ``out_seeds``
    independent GD runs per δ, each against the outlier equation on **its own** empirical law of the weights D_i;
    and, once per δ, on the antithetic DMFT law (hard overlap exactly 0, the d → ∞ law), the DMFT law seeded with the
    finite-d hard overlap d^{-1/2}, and the plain-sampling DMFT law.

    One unit is one (student, δ) and either a block of GD seeds (``gd`` [seed, 4]: λ_1, its squared overlap with
    θ_*, λ_2, its overlap; ``emp`` [seed, 4]: predicted root, overlap, edge, Φ at the edge; ``cos`` [seed]:
    |cos(θ^t, θ_*)|, the escape indicator; ``M_gd`` [seed]: |M_t|) or the DMFT laws (``anti``/``seeded``/``plain``
    [4] and ``M`` [3]: |M_t| of each). The assembled experiment holds, per student, ``{name}_gd``/``_emp`` [δ, seed,
    4], ``{name}_cos`` [δ, seed], ``{name}_anti``/``_seeded``/``_plain`` [δ, 4] and ``{name}_M`` [δ, 4] (|M_t|:
    antithetic, seeded, plain DMFT, median GD)."""
    st = STUDENTS[u["student"]]
    act, m, eta, lk = st["act"], st["m"], st["eta"], mi.link(st["link"])
    d, dl, t = u["out_d"], u["delta"], u["t"]
    if u["kind"] == "dmft":
        N, out, mt = _even(u["out_N"]), {}, []
        with dmft.reuse_memory():  # the three runs share one χ array
            for tag, kw in (("anti", dict(antithetic=True)),
                            ("seeded", dict(antithetic=True, M0=[[d ** -0.5] * m])),
                            ("plain", dict(antithetic=False))):
                r = dmft.run_dmft(act, lk, dl, eta, t, N, m, keep=[t], device=device, generator=u["dmft_seed"], **kw)
                out[tag] = np.array(_outlier_row(*_law(r, t, act, lk), dl))
                mt.append(float(r["M"][t].abs().max()))
        out["M"] = np.array(mt)
        return out
    R = u["seeds"][1] - u["seeds"][0]
    prob = mi.sample_problem(d, [int(round(dl * d))], 1, lk, trials=R, device=device, dtype=torch.float64,
                             generator=u["data_seed"])
    g = mi.run_gd(prob, m, eta, t, act=act, keep=[t], generator=u["init_seed"])
    gd_r, emp_r, cos_r = [], [], []
    for rep in range(R):
        X, y, Ts = prob.X[0][rep], prob.y[0][rep], prob.Theta_star[0][rep]
        Th = g["theta"][t][0][rep]
        w, V = torch.linalg.eigh(hs.hessian_dense(Th, X, y, act))
        ov = hs.overlap_with(V[:, :2].T, Ts).cpu().numpy()
        gd_r.append([float(w[0]), float(ov[0]), float(w[1]), float(ov[1])])
        De = hs.hessian_weights(Th, X, y, act).double().cpu()
        emp_r.append(_outlier_row(De, (X @ Ts).double().cpu(), dl))
        cos_r.append(float(tr.hard_cos(g["M"][0, rep, t][None], g["Q"][0, rep, t][None])[0]))
    return {"gd": np.array(gd_r), "emp": np.array(emp_r), "cos": np.array(cos_r),
            "M_gd": g["M"][0, :, t, 0, :].abs().amax(-1).cpu().numpy()}


@outliers.peak_memory
def _outliers_memory(u: dict) -> float:
    """A DMFT unit: one run of ``out_N`` paths to step t at a time; a GD unit: its block of problems with their
    Hessians (at d = 2000 and δ = 48, GeLU m = 2, four problems: 15 GB, beyond a Dask worker's share of 24 GiB)."""
    m = STUDENTS[u["student"]]["m"]
    if u["kind"] == "dmft":
        return costs.dmft_bytes(_even(u["out_N"]), u["t"], m)
    return costs.gd_hessian_bytes(int(round(u["delta"] * u["out_d"])), u["out_d"], m, u["seeds"][1] - u["seeds"][0])


def _dnn_cell(act, m, link, scale, times, p, eta, device, seed):
    """δ_NN(t) for one cell at each t of ``times`` by ``transitions.noisy_bisect`` on the Hessian criterion
    c(δ) = −λ_min Φ_t(z₀) (eq. app-outlier; c > 0 ⇔ a negative informative outlier), with ``dnn_reps`` independent
    path sets per δ (common to all δ: the paths depend on (N, rep) only) and the paths doubled from ``dnn_N`` up to
    ``dnn_Nmax`` while the sign is undecided. One DMFT run per (δ, paths, replicate) serves every t."""
    lk = mi.link(link)
    vals, edges = {}, {}

    def point(delta, n, rep):
        """[criterion, bulk edge] at every t of ``times`` from one DMFT run of (δ, n, rep); kept in the unit's
        checkpoint, so an interrupted unit resumes its bisections where they stopped."""
        key = f"{round(delta, 12)!r}|{n}|{rep}"
        if key not in vals:
            def compute():
                r = dmft.run_dmft(act, lk, delta, eta, max(times), _even(n), m, Q0=scale * np.eye(m), keep=times,
                                  device=device, generator=seed + 7919 * rep + 13 * n)
                out = []
                for t in times:
                    try:
                        c = sp.nn_criterion(*_law(r, t, act, lk), delta)
                        out.append([float(c["crit"]), float(c["edge"])])
                    except sp.ConvergenceError:  # this t's bisection then stops with a nan row
                        out.append([float("nan"), float("nan")])
                return out
            vals[key] = sweep.memo(key, compute)
        return vals[key]

    res = []
    for it, t in enumerate(times):
        def crit(delta, n, rep, t=t, it=it):
            c, edge = point(delta, n, rep)[it]
            edges[(t, round(delta, 12), n, rep)] = edge
            return -c
        try:
            r = tr.noisy_bisect(crit, p["dnn_lo"], p["dnn_hi"], rtol=p["dnn_rtol"], n0=p["dnn_N"],
                                n_max=p["dnn_Nmax"], reps=p["dnn_reps"])
            # bulk edge of the law at the evaluated δ nearest the root (mean over replicates, most paths used there)
            keys = [k for k in edges if k[0] == t]
            dl0 = min({k[1] for k in keys}, key=lambda dl: abs(dl - r["root"]))
            n0 = max(k[2] for k in keys if k[1] == dl0)
            e = [edges[k] for k in keys if k[1] == dl0 and k[2] == n0]
            status = 2 if r["limited_by"] == "noise" and not np.isfinite(r["root_mc_se"]) else \
                float(r["limited_by"] == "noise")
            res.append([r["root"], r["lo"], r["hi"], float(r["limited_by"] == "noise"), r["root_mc_se"],
                        float(np.mean(e)) if e else np.nan, float(np.std(e, ddof=1) / np.sqrt(len(e))) if len(e) > 1
                        else np.nan, status])
        except ValueError as err:  # no sign change in the bracket, or the spectral solver failed at some δ
            res.append([np.nan, p["dnn_lo"], p["dnn_hi"]] + [np.nan] * 4
                       + [4 if str(err).startswith("non-finite") else 3])
        except (dmft.DMFTError, sp.ConvergenceError, torch.linalg.LinAlgError):  # the DMFT broke down at some δ
            res.append([np.nan, p["dnn_lo"], p["dnn_hi"]] + [np.nan] * 4 + [4])
    return np.array(res), len(vals)


DNN_FIELDS = ("delta_nn", "lo", "hi", "noise_limited", "root_mc_se", "edge", "edge_se", "status")
BISECT_STATUS = ("bisected", "noise-limited", "end undecided", "no sign change", "DMFT breakdown")
"""Outcome of a noise-controlled bisection (``status`` of ch3.dnn and ch3.dlin): to the tolerance; stopped by
Monte-Carlo noise at a mid-point; an end of the initial bracket undecided at the most paths; both ends decided with
the same sign (no root in the bracket); the DMFT or the spectral solver failed at some δ."""


DNN_UNIT_KEYS = ("dnn_times", "dnn_N", "dnn_Nmax", "dnn_reps", "dnn_rtol", "dnn_lo", "dnn_hi", "seed")


def dnn_nmax(p: dict, m: int) -> int:
    """The most paths per replicate of a cell of width ``m``: ``dnn_Nmax``, unless one DMFT run at the most paths
    the bisection would then reach needs more than ``dnn_run_gib`` GiB (:func:`costs.dmft_bytes`); then
    ``dnn_N`` doubled while the run still fits (at least ``dnn_N``, which the sweep's memory check then refuses if
    it does not fit). The path responses χ(t, s) grow as N·m²·T²/2: at the paper's sizes (t = 60, 160 000 paths)
    a run takes 9.4 GiB at m = 2 but 37 GiB at m = 4. Storing the paths in float32 would halve that, but the
    covariance Q_⊥ of w⁰ … wᵗ, built from float32 Monte-Carlo averages, then loses positive definiteness at the
    grid's small steps (a run stops within 20 steps, an eigenvalue ≈ −1e−8 against ≈ 5; ``tests/test_dmft.py``),
    so the wider cells double less."""
    fits = lambda nmax: _dnn_memory({**p, "m": m, "dnn_Nmax": nmax}) <= float(p["dnn_run_gib"]) * 2 ** 30
    if fits(p["dnn_Nmax"]):
        return int(p["dnn_Nmax"])
    n = int(p["dnn_N"])
    while 2 * n <= p["dnn_Nmax"] and fits(2 * n):
        n *= 2
    return n


def _dnn_units(p: dict) -> list[dict]:
    """One unit per cell (act, m, link, scale), each one bisection per t, with at most :func:`dnn_nmax` paths.
    Order (what a resumed sweep computes next): the cells of the first link and scale with m ≤ 2 — the students
    chapters 4 and 5 compare with — then the rest, the cheapest (small m) first; m = 4 last (its cells take an hour
    or more each on two CPU cores, and most of the memory :func:`dnn_nmax` allows)."""
    cells = [{"act": a, "m": int(m), "link": lk, "scale": float(s), "eta": p[f"eta_{a}"] * m,
              **{k: p[k] for k in DNN_UNIT_KEYS}, "dnn_Nmax": dnn_nmax(p, int(m))}
             for m in p["dnn_ms"] for a in p["dnn_acts"] for lk in p["dnn_links"] for s in p["dnn_scales"]]
    first = lambda u: u["link"] == p["dnn_links"][0] and u["scale"] == float(p["dnn_scales"][0]) and u["m"] <= 2
    return sorted(cells, key=lambda u: (not first(u), u["m"]))  # stable: the grid order within each group


def _dnn_reduce(p: dict, units: list[dict], results: list[dict]) -> dict:
    A, Ms, Ls, Ss, Ts = p["dnn_acts"], p["dnn_ms"], p["dnn_links"], p["dnn_scales"], p["dnn_times"]
    shape = (len(A), len(Ms), len(Ls), len(Ss), len(Ts))
    out = {k: np.full(shape, np.nan) for k in DNN_FIELDS}
    runs, wall = np.zeros(shape[:4]), np.zeros(shape[:4])
    for u, r in zip(units, results):
        i = (A.index(u["act"]), Ms.index(u["m"]), Ls.index(u["link"]), Ss.index(u["scale"]))
        for k, name in enumerate(DNN_FIELDS):
            out[name][i] = r["cell"][:, k]
        runs[i], wall[i] = r["dmft_runs"], r["wall_s"]
    out.update(dmft_runs=runs, wall_s=wall, times=np.array(Ts), scales=np.array(Ss), ms=np.array(Ms))
    return out


def _dnn_cost(u: dict) -> float:
    """Replicates × δ points of the bisections × a DMFT run of √(N·N_max) paths to max(times) (N·m²·T²), shared by
    every t, and a criterion per t."""
    k = _bisect_points(u["dnn_lo"], u["dnn_hi"], u["dnn_rtol"])
    n, T, nt = _bisect_paths(u["dnn_N"], u["dnn_Nmax"]), max(u["dnn_times"]), len(u["dnn_times"])
    runs = 2 + nt * (k - 2)  # the bracket's ends are evaluated once for every t
    return u["dnn_reps"] * (runs * costs.dmft_s(n, T, u["m"]) + nt * k * costs.law_s(n, u["m"]))


def _dnn_shrink(u: dict) -> dict:
    """The last t, two replicates of ``dnn_N`` paths at the two ends of a bracket too narrow to bisect (always four
    DMFT runs, whatever the signs)."""
    return {**u, "dnn_times": u["dnn_times"][-1:], "dnn_Nmax": u["dnn_N"], "dnn_reps": 2,
            "dnn_hi": 1.4 * u["dnn_lo"], "dnn_rtol": 0.5}


@experiment(SECTION, keys=["dnn_acts", "dnn_ms", "dnn_links", "dnn_scales", "dnn_times", "dnn_N", "dnn_Nmax",
                           "dnn_reps", "dnn_rtol", "dnn_lo", "dnn_hi", "eta_quad", "eta_gelu", "seed"],
            units=_dnn_units, reduce=_dnn_reduce, cost=_dnn_cost, shrink=_dnn_shrink)
def dnn(u, device):
    """δ_NN(t) of one cell (act, m, link, scale) at each t by noise-controlled bisection in δ on the Hessian
    criterion (eq. app-weights–app-outlier; :func:`_dnn_cell`). The assembled experiment holds, each [act, m, link,
    scale, t]: ``delta_nn`` (geometric mid-point of the final bracket), ``lo``, ``hi``, ``noise_limited`` (1:
    Monte-Carlo spread, not the tolerance, limited the bracket), ``root_mc_se`` (Monte-Carlo spread of the root),
    ``edge``/``edge_se`` (the bulk edge of the law at the evaluated δ nearest the root, mean and s.e. over
    replicates: < 0 means phase 1 has not settled), ``status`` (index into :data:`BISECT_STATUS`; delta_nn is nan
    unless it is ≤ 1, and nan everywhere marks a cell not computed); ``dmft_runs`` and ``wall_s``
    [act, m, link, scale]."""
    t0 = time.perf_counter()
    with dmft.reuse_memory():  # the cell's DMFT runs share one χ array (no fresh page faults per run)
        r, n = _dnn_cell(u["act"], u["m"], u["link"], u["scale"], u["dnn_times"], u, u["eta"], device, u["seed"] + 17)
    return {"cell": r, "dmft_runs": np.asarray(n), "wall_s": np.asarray(sweep.unit_elapsed(t0))}


dnn.unit_keys("dnn_run_gib")


@dnn.on_diverged
def _dnn_diverged(u: dict, err) -> dict:
    """The outcome of a cell whose DMFT diverges (its iterates exceed 1e30: the step size is too large at some δ
    of the bracket): the "DMFT breakdown" row of every t, as :func:`_dnn_cell` records a DMFT that loses positive
    definiteness — no root, the bracket searched, no DMFT run kept."""
    row = [np.nan, u["dnn_lo"], u["dnn_hi"]] + [np.nan] * 4 + [BISECT_STATUS.index("DMFT breakdown")]
    return {"cell": np.array([row] * len(u["dnn_times"]), float), "dmft_runs": np.asarray(0),
            "wall_s": np.asarray(0.0)}


def _bisect_max_paths(n0: int, n_max: int) -> int:
    """The most paths a replicate of ``transitions.noisy_bisect`` reaches: n0 doubled while it stays ≤ n_max."""
    n = n0
    while 2 * n <= n_max:
        n *= 2
    return n


@dnn.peak_memory
def _dnn_memory(u: dict) -> float:
    """One DMFT run at the most paths the bisection can reach, to the last step of ``dnn_times``: at m = 4,
    160 000 paths and t = 60 the path responses alone are 38.7 GB."""
    return costs.dmft_bytes(_even(_bisect_max_paths(u["dnn_N"], u["dnn_Nmax"])), max(u["dnn_times"]), u["m"])


def _alg_cost(p: dict) -> float:
    """The theory's bisection and an outlier equation per δ (a fixed-size law), and per δ trials × (n·d² for the
    spectral matrix + d³ for its eigendecomposition)."""
    d, R = p["alg_d"], p["alg_trials"]
    return 4.0 + sum(1.1 + R * (1e-10 * dl * d ** 3 + 5e-9 * dl * d * d + 3.2e-10 * d ** 3) for dl in p["alg_deltas"])


def _alg_shrink(p: dict) -> dict:
    """The first δ at d = 100, one trial (the theory's bisection is the same)."""
    return {**p, "alg_deltas": p["alg_deltas"][:1], "alg_d": 100, "alg_trials": 1}


@experiment(SECTION, keys=["alg_deltas", "alg_d", "alg_trials", "seed"], cost=_alg_cost, shrink=_alg_shrink)
def alg(p, device):
    """δ_alg: the spectral method with T(y) = 1 − 1/y (Luo–Alghamdi–Lu) for y = z². Theory: bisection on the top
    outlier (m = 1, G = T(y), ζ = z, Gauss–Hermite law) and the predicted overlap at each δ; finite d: overlap of the
    top eigenvector of (1/n) Σ T(y_i) x_i x_iᵀ with θ*."""
    xq, wq = np.polynomial.hermite_e.hermegauss(300)
    zq, wq = torch.tensor(xq), torch.tensor(wq / wq.sum())
    Gq = sp.luo_alghamdi_lu_T(zq ** 2)
    th = sp.delta_nn(lambda dl: (Gq, zq, wq), 0.3, 1.0, rtol=1e-3, side="right")
    pred = []
    for dl in p["alg_deltas"]:
        o = sp.outlier(Gq, zq, dl, weights=wq, side="right")
        pred.append(o["overlap"] if o["exists"] else 0.0)
    d, trials = p["alg_d"], p["alg_trials"]
    emp = np.zeros((len(p["alg_deltas"]), trials))
    g = torch.Generator(device=device).manual_seed(p["seed"] + 5)
    for i, dl in enumerate(p["alg_deltas"]):
        n = int(round(dl * d))
        X = torch.randn(trials, n, d, device=device, dtype=torch.float64, generator=g)
        y = X[..., 0] ** 2                                            # θ* = e_1 (the law is rotation invariant)
        T = sp.luo_alghamdi_lu_T(y).clamp_min(-1e6)
        Mx = torch.einsum("bnr,bn,bns->brs", X, T, X) / n
        v = torch.linalg.eigh(Mx)[1][..., -1]
        emp[i] = (v[:, 0] ** 2).cpu().numpy()
    return {"deltas": np.array(p["alg_deltas"]), "pred": np.array(pred), "emp": emp, "delta_alg": th["delta_nn"],
            "lo": th["lo"], "hi": th["hi"]}


def _linear_cost(p: dict) -> float:
    """One DMFT run per δ (N·T², m = 1)."""
    return len(p["lin_deltas"]) * costs.dmft_s(p["lin_N"], p["lin_T"], 1)


def _linear_shrink(p: dict) -> dict:
    """The first δ with 8000 paths."""
    return {**p, "lin_deltas": p["lin_deltas"][:1], "lin_N": 8000}


@experiment(SECTION, keys=["lin_deltas", "lin_T", "lin_N", "seed"], cost=_linear_cost, shrink=_linear_shrink)
def linear(p, device):
    """Linearised DMFT trajectories (eq. app-lin): Quad m = 1, y = min(z², 6), η = 0.1, antithetic, M_0 = 10⁻³."""
    with dmft.reuse_memory():  # successive DMFT runs share one χ array (no fresh page faults per run)
        Ms = []
        for dl in p["lin_deltas"]:
            r = dmft.run_dmft("quad", "pr_clip", dl, 0.1, p["lin_T"], _even(p["lin_N"]), 1, M0=[[1e-3]],
                              device=device, generator=p["seed"] + 31)
            Ms.append(r["M"][:, 0, 0].abs().cpu().numpy())
        return {"deltas": np.array(p["lin_deltas"]), "M": np.array(Ms)}


@linear.peak_memory
def _linear_memory(p: dict) -> float:
    return costs.dmft_bytes(_even(p["lin_N"]), p["lin_T"], 1)


SETTLE_TIMES = (10, 20, 30, 40, 60, 80, 120, 160, 240, 320)


def _settle_times(T: int, lag: int) -> list[int]:
    return sorted({t for t in SETTLE_TIMES if t <= T} | {T - lag, T})


def _settle_cost(p: dict) -> float:
    """Two DMFT runs per λ (N·T², m = 1) and a bulk edge at each recorded step."""
    T, N = p["settle_T"], p["settle_N"]
    steps = len(_settle_times(T, p["settle_lag"]))
    return 2 * len(p["settle_lams"]) * (costs.dmft_s(N, T, 1) + steps * costs.law_s(N, 1))


def _settle_shrink(p: dict) -> dict:
    """The first λ over 20 steps."""
    return {**p, "settle_lams": p["settle_lams"][:1], "settle_T": 20, "settle_lag": min(p["settle_lag"], 10)}


@experiment(SECTION, keys=["settle_delta", "settle_lams", "settle_T", "settle_N", "settle_lag", "eta_quad", "seed"],
            cost=_settle_cost, shrink=_settle_shrink)
def settle(p, device):
    """Does the first phase settle? Quad m = 1, y = min(z², 6), random init (hard overlap exactly 0, antithetic),
    for each ridge λ and two independent path sets: Q_⊥(t, t), the train risk at every step, and the left edge of
    the bulk of H + λI (eq. app-bulk on the DMFT law of the weights, shifted by λ) at the recorded steps."""
    with dmft.reuse_memory():  # successive DMFT runs share one χ array (no fresh page faults per run)
        T, lag, N = p["settle_T"], p["settle_lag"], _even(p["settle_N"])
        times = _settle_times(T, lag)
        lk = mi.link("pr_clip")
        Q, train, edge = [], [], []
        for il, lam in enumerate(p["settle_lams"]):
            Qr, trr, er = [], [], []
            for rep in range(2):
                r = dmft.run_dmft("quad", lk, p["settle_delta"], p["eta_quad"], T, N, 1, lam=lam, keep=times,
                                  device=device, generator=p["seed"] + 101 + 7919 * rep)
                Qr.append(r["Qperp"][:, 0, 0].cpu().numpy())
                trr.append(r["train"].cpu().numpy())
                er.append([sp.real_axis_edge(*_law(r, t, "quad", lk)[:1], p["settle_delta"]) + lam for t in times])
            Q.append(Qr)
            train.append(trr)
            edge.append(er)
        return {"lams": np.array(p["settle_lams"], float), "times": np.array(times), "Qperp": np.array(Q),
                "train": np.array(train), "edge": np.array(edge)}


@settle.peak_memory
def _settle_memory(p: dict) -> float:
    return costs.dmft_bytes(_even(p["settle_N"]), p["settle_T"], 1)


def lin_rate(delta: float, T: int, N: int, rep: int, *, eta: float, seed: int, device="cpu") -> float:
    """Net growth of the hard overlap over the second half of the horizon in the linearised DMFT (eq. app-lin),
    c = (M_T − M_{T/2}) / M_0: Quad m = 1, y = min(z², 6), M_0 = 10⁻³, antithetic paths. c > 0: the hard
    direction still grows at T (unstable); c < 0: it decays. Linear in M (no logarithm of an overlap that may
    pass through 0), so its Monte-Carlo noise is additive. The paths depend on (N, rep, seed) only, not on δ
    (common random numbers), so that one replicate's c is a smooth function of δ."""
    r = dmft.run_dmft("quad", "pr_clip", delta, eta, T, _even(N), 1, M0=[[1e-3]], device=device,
                      generator=seed + 7919 * rep + 13 * N)
    M = r["M"][:, 0, 0].cpu().numpy()
    return float((M[T] - M[T // 2]) / 1e-3)


def _dlin_cost(p: dict) -> float:
    """Per horizon T: replicates × δ points of the bisection × a DMFT run of √(N0·N_max) paths (N·T², m = 1)."""
    k = _bisect_points(p["dlin_lo"], p["dlin_hi"], p["dlin_rtol"])
    n = _bisect_paths(p["dlin_N0"], p["dlin_Nmax"])
    return p["dlin_reps"] * k * sum(costs.dmft_s(n, T, 1) for T in p["dlin_horizons"])


def _dlin_shrink(p: dict) -> dict:
    """The shortest horizon, two replicates of ``dlin_N0`` paths at the two ends of a bracket too narrow to bisect
    (always four DMFT runs, whatever the signs)."""
    return {**p, "dlin_horizons": [min(p["dlin_horizons"])], "dlin_Nmax": p["dlin_N0"], "dlin_reps": 2,
            "dlin_hi": 1.4 * p["dlin_lo"], "dlin_rtol": 0.5}


@experiment(SECTION, keys=["dlin_horizons", "dlin_N0", "dlin_Nmax", "dlin_reps", "dlin_rtol", "dlin_lo", "dlin_hi",
                           "eta_quad", "seed"], cost=_dlin_cost, shrink=_dlin_shrink)
def dlin(p, device):
    """δ_lin(T): the root in δ of the late growth c_T(δ) of the linearised DMFT (:func:`lin_rate`), by
    ``transitions.noisy_bisect`` (replicate path sets, paths doubled while the sign is undecided), for every
    horizon T. Arrays [horizon]: ``status`` (index into :data:`BISECT_STATUS`: bisected to the tolerance; stopped by
    Monte-Carlo noise at a mid-point; an end of the initial bracket undecided at the most paths; both ends decided
    with the same sign, so no root in the bracket), ``root`` (nan unless status ≤ 1), ``lo``, ``hi``,
    ``noise_limited``, ``root_mc_se``, ``n_final`` (most paths used), ``evals``; the evaluations (δ, paths, mean,
    s.e. over replicates) padded with nan in ``hist`` [horizon, eval, 4], kept whatever the status."""
    with dmft.reuse_memory():  # successive DMFT runs share one χ array (no fresh page faults per run)
        H = p["dlin_horizons"]
        out = {k: np.full(len(H), np.nan) for k in ("status", "root", "lo", "hi", "noise_limited", "root_mc_se",
                                                    "n_final", "evals")}
        hists = []
        for i, T in enumerate(H):
            seen = {}  # (δ, n) -> values over replicates, in evaluation order: the evidence, whatever the outcome

            def crit(dl, n, rep, T=T, seen=seen):  # kept in the unit's checkpoint: an interrupted unit resumes
                v = sweep.memo(f"{T}|{round(dl, 12)!r}|{n}|{rep}",
                               lambda: float(lin_rate(dl, T, n, rep, eta=p["eta_quad"], seed=p["seed"], device=device)))
                seen.setdefault((dl, n), []).append(v)
                return v
            try:
                r = tr.noisy_bisect(crit, p["dlin_lo"], p["dlin_hi"], rtol=p["dlin_rtol"], n0=p["dlin_N0"],
                                    n_max=p["dlin_Nmax"], reps=p["dlin_reps"])
                end_undecided = r["limited_by"] == "noise" and not np.isfinite(r["root_mc_se"])
                out["status"][i] = 2 if end_undecided else float(r["limited_by"] == "noise")
                out["root"][i], out["lo"][i], out["hi"][i] = r["root"], r["lo"], r["hi"]
                out["noise_limited"][i] = float(r["limited_by"] == "noise")
                out["root_mc_se"][i] = r["root_mc_se"]
            except ValueError:  # both ends decided with the same sign: no root in the bracket (a finding, not a crash)
                out["status"][i] = 3
                out["lo"][i], out["hi"][i] = p["dlin_lo"], p["dlin_hi"]
            hists.append(np.array([[dl, n, np.mean(v), np.std(v, ddof=1) / np.sqrt(len(v))]
                                   for (dl, n), v in seen.items()]).reshape(-1, 4))
            if not np.all(np.isfinite(hists[-1])):
                raise ValueError(f"dlin: non-finite growth c_T at T = {T}: {hists[-1].tolist()}")
            out["n_final"][i] = hists[-1][:, 1].max()
            out["evals"][i] = len(hists[-1])
        L = max(1, max(len(h) for h in hists))
        hist = np.full((len(H), L, 4), np.nan)
        for i, h in enumerate(hists):
            hist[i, :len(h)] = h
        out.update(hist=hist, horizons=np.array(H))
        return out


@dlin.peak_memory
def _dlin_memory(p: dict) -> float:
    """One DMFT run at the most paths of the bisection, to the longest horizon."""
    return costs.dmft_bytes(_even(_bisect_max_paths(p["dlin_N0"], p["dlin_Nmax"])), max(p["dlin_horizons"]), 1)


def _limit_units(p: dict) -> list[dict]:
    """One unit per δ of ``lim_deltas``: every replicate and every t of ``lim_times``. Both lists must increase
    strictly (a grid to interpolate roots on, steps to fit laws to)."""
    for k in ("lim_deltas", "lim_times"):
        v = list(p[k])
        if len(v) < 2 or any(b <= a for a, b in zip(v, v[1:])):
            raise ParamError(f"{k} = {v} must have at least two entries, in strictly increasing order")
    return [{"delta": float(dl), "times": list(p["lim_times"]), "N": p["lim_N"], "reps": p["lim_reps"],
             "eta": p["eta_quad"], "seed": p["seed"]} for dl in p["lim_deltas"]]


def _limit_reduce(p: dict, units: list[dict], results: list[dict]) -> dict:
    out = {k: np.stack([r[k] for r in results]) for k in ("crit", "edge")}  # [δ, rep, t]
    out.update(deltas=np.array(p["lim_deltas"], float), times=np.array(p["lim_times"]),
               wall_s=np.array([float(r["wall_s"]) for r in results]))
    return out


def _limit_cost(u: dict) -> float:
    """Replicates × (a DMFT run to max(times), N·T², m = 1, and a criterion per t)."""
    return u["reps"] * (costs.dmft_s(u["N"], max(u["times"]), 1) + len(u["times"]) * costs.law_s(u["N"], 1))


def _limit_shrink(u: dict) -> dict:
    """Three replicates of 2000 paths, the two earliest steps."""
    return {**u, "N": 2000, "reps": 3, "times": sorted(u["times"])[:2]}


@experiment(SECTION, keys=["lim_deltas", "lim_times", "lim_N", "lim_reps", "eta_quad", "seed"], units=_limit_units,
            reduce=_limit_reduce, cost=_limit_cost, shrink=_limit_shrink)
def limit(u, device):
    """The δ_NN criterion of the Quad toy (m = 1, y = min(z², 6), Q_0 = I, antithetic) on a grid: at one δ, for
    ``reps`` independent path sets (common to every δ: the paths depend on (N, rep) only), one DMFT run to the
    last step of ``times``, and at each t the criterion c = λ_min Φ_t(z₀) (eq. app-dnn; c < 0 ⇔ a negative
    informative outlier) and the left edge of the bulk (eq. app-bulk). Returns ``crit``, ``edge`` [rep, t]; the
    assembled experiment holds them as [δ, rep, t] with ``deltas``, ``times`` and ``wall_s`` [δ]. A criterion the
    spectral solver cannot evaluate is an error, not a row."""
    with dmft.reuse_memory():  # successive DMFT runs share one χ array (no fresh page faults per run)
        t0 = time.perf_counter()
        lk = mi.link("pr_clip")
        times, N = sorted(u["times"]), _even(u["N"])
        crit, edge = [], []
        for rep in range(u["reps"]):
            def compute(rep=rep):
                r = dmft.run_dmft("quad", lk, u["delta"], u["eta"], max(times), N, 1, Q0=np.eye(1), keep=times,
                                  device=device, generator=u["seed"] + 31 + 7919 * rep + 13 * N)
                rows = []
                for t in times:
                    c = sp.nn_criterion(*_law(r, t, "quad", lk), u["delta"])
                    rows.append([float(c["crit"]), float(c["edge"])])
                return rows
            rows = np.array(sweep.memo(f"{rep}", compute))
            crit.append(rows[:, 0])
            edge.append(rows[:, 1])
        crit, edge = np.array(crit), np.array(edge)
        if not (np.isfinite(crit).all() and np.isfinite(edge).all()):
            raise sp.ConvergenceError(float("nan"), 0, float("nan"), f"δ_NN criterion at δ = {u['delta']:g}")
        return {"crit": crit, "edge": edge, "wall_s": np.asarray(sweep.unit_elapsed(t0))}


@limit.peak_memory
def _limit_memory(u: dict) -> float:
    """One DMFT run of ``N`` paths to the last step (the replicates run one after another)."""
    return costs.dmft_bytes(_even(u["N"]), max(u["times"]), 1)


# --- analysis used by the chapter ----------------------------------------------------------------------------------
def outlier_split(O, name: str, threshold: float = 0.5) -> list[dict]:
    """Per δ, the seeds of the outlier comparison split by whether GD has escaped (|cos(θ^t, θ_*)| ≥ ``threshold``)
    at the step of the comparison, with ``failed``: the seeds that have not escaped and whose own outlier equation
    did not converge (no prediction, never a value). For the seeds that have not escaped and whose own empirical
    law predicts an outlier: the differences λ_min(GD) − z_out(empirical law), their mean, standard deviation and standard error
    (the seed spread), and ``agree`` = |mean| ≤ t·s.e. + 0.01 |z_out| (None with fewer than two such seeds), t the
    two-sided 95 % point of Student's t with n − 1 dof (``t_mult``; 2.20 for 12 seeds): the s.e. comes from the same
    few seeds, and the 1 % is a range allowed for the discretisation of the root search (``report.range_tol``)."""
    from scipy import stats

    rows = []
    for i, dl in enumerate(O[f"{name}_deltas"]):
        gd, emp, cos = O[f"{name}_gd"][i], O[f"{name}_emp"][i], O[f"{name}_cos"][i]
        fail = O[f"{name}_fail"][i] > 0 if f"{name}_fail" in getattr(O, "arrays", O) else np.zeros(cos.shape, bool)
        esc = cos >= threshold
        pred = ~esc & np.isfinite(emp[:, 0])
        diff = gd[pred, 0] - emp[pred, 0]
        n = int(pred.sum())
        mean = float(diff.mean()) if n else float("nan")
        sd = float(diff.std(ddof=1)) if n > 1 else float("nan")
        se = sd / math.sqrt(n) if n > 1 else float("nan")
        t_mult = float(stats.t.ppf(0.975, n - 1)) if n > 1 else float("nan")
        tol = t_mult * se + 0.01 * float(np.abs(emp[pred, 0]).mean()) if n > 1 else float("nan")
        rows.append({"delta": float(dl), "seeds": int(cos.size), "escaped": int(esc.sum()), "predicted": n,
                     "failed": int((fail & ~esc).sum()),
                     "gd_esc": gd[esc, 0], "gd_not": gd[~esc, 0], "emp_not": emp[~esc, 0], "mean_diff": mean,
                     "sd_diff": sd, "se_diff": se, "t_mult": t_mult, "tol": tol, "agree": bool(abs(mean) <= tol) if n > 1 else None})
    return rows


def settle_check(S, lag: int, tol: float) -> list[dict]:
    """Per ridge λ of :func:`settle`: the convergence criterion |x_T − x_{T−Δ}| < tol (``transitions.settled``) on
    Q_⊥ and the train risk (mean over the two path sets), and whether the bulk edge at T is ≥ 0 within Monte-Carlo
    error (mean + 2 s.e. over the path sets ≥ 0)."""
    t_all = np.arange(S["Qperp"].shape[-1])
    out = []
    for il, lam in enumerate(S["lams"]):
        q = tr.settled(t_all, S["Qperp"][il].mean(0), lag, tol)
        r = tr.settled(t_all, S["train"][il].mean(0), lag, tol)
        e = S["edge"][il][:, -1]
        e_mean, e_se = float(e.mean()), float(e.std(ddof=1) / math.sqrt(e.size))
        out.append({"lam": float(lam), "dQ": float(q["change"]), "dtrain": float(r["change"]), "edge": e_mean,
                    "edge_se": e_se, "settled": q["settled"] and r["settled"], "edge_ok": e_mean + 2 * e_se >= 0})
    return out


def dnn_cells(Dn, store=None) -> list[dict]:
    """Every cell of ``Dn``'s grid (a unit of ``dnn``) in grid order, with ``state``: "computed", "breakdown" (stored
    as a DMFT breakdown), "to do" (not computed; ``minutes``: estimated by the cost model calibrated on the timings
    of the stored cells of like cost, :func:`sweep.estimate_seconds`) or "too large" (not computed, and its memory model, ``need`` bytes, exceeds this machine's
    device); ``minutes`` of a computed cell is its compute time."""
    from ..store import Store

    q = Dn.meta["params"]
    scales = [float(x) for x in q["dnn_scales"]]

    def index(u):  # the cell's place in the grid [act, m, link, scale]
        return (q["dnn_acts"].index(u["act"]), q["dnn_ms"].index(u["m"]), q["dnn_links"].index(u["link"]),
                scales.index(u["scale"]))

    units = sorted(dnn.units(q), key=index)  # one unit per cell, in grid order
    missing = [u for u in units if not np.isfinite(Dn["status"][index(u)]).any()]
    secs = dict(zip(map(index, missing), sweep.estimate_seconds(dnn, store or Store(), missing, time_probe=False)[0]
                    if missing else []))
    limit = sweep.InProcess().memory_limit("auto")[0] if missing else None
    out = []
    for u in units:
        i = index(u)
        c = {"act": u["act"], "m": u["m"], "link": u["link"], "scale": u["scale"], "need": None}
        if i not in secs:
            bd = bool(np.all(Dn["status"][i] == BISECT_STATUS.index("DMFT breakdown")))
            c.update(state="breakdown" if bd else "computed", minutes=float(Dn["wall_s"][i]) / 60)
        else:
            need = dnn.memory_of(u)
            c.update(state="too large" if need is not None and need > limit else "to do",
                     minutes=secs[i] / 60, need=need)
        out.append(c)
    return out


def dnn_coverage_sentence(Dn, store=None) -> str:
    """The lead to :func:`dnn_coverage_table` for a δ_NN grid shown only in part (``Experiment.best(partial=True)``;
    the provenance line says how many cells are computed): how many computed cells are DMFT breakdowns, and how to
    read the table; "" for a whole grid. :func:`dnn_gap_sentence` says what is missing."""
    got = Dn.meta.get("units_stored")
    if not got or got[0] >= got[1]:
        return ""
    bd = sum(c["state"] == "breakdown" for c in dnn_cells(Dn, store))
    words = ("No", "One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine", "Ten")
    return ((f"{words[bd] if bd < len(words) else bd} of the computed cells {'is a DMFT breakdown' if bd == 1 else 'are DMFT breakdowns'}. "
             if bd else "")
            + "The table gives the compute time of each computed cell (bold) and, for each missing cell, its "
            "estimated time (in brackets, by the cost model) or, where it needs more memory than this machine has, "
            "how much:")


def dnn_coverage_table(Dn, store=None) -> str:
    """The grid's coverage as a Markdown table (rows: activation and width; columns: link and scale): a computed
    cell's compute time, "breakdown", a missing cell's estimated time ("≈ … ?") or the memory it needs beyond this
    machine; "" for a whole grid."""
    got = Dn.meta.get("units_stored")
    if not got or got[0] >= got[1]:
        return ""
    cells = dnn_cells(Dn, store)
    cols = list(dict.fromkeys((c["link"], c["scale"]) for c in cells))
    rows = list(dict.fromkeys((c["act"], c["m"]) for c in cells))

    def entry(c):
        t = c["minutes"]
        t = f"{t:.0f} min" if not t >= 120 else f"{t / 60:.1f} h"
        if c["state"] == "computed":
            return f"**{t}**"
        if c["state"] == "too large":
            return f"needs {sweep.fmt_bytes(c['need'])}"
        return "breakdown" if c["state"] == "breakdown" else f"({t})" if np.isfinite(c["minutes"]) else "(?)"

    by = {(c["act"], c["m"], c["link"], c["scale"]): c for c in cells}
    nb = "\u00a0"  # no-break space: "quad, m = 1" and "82.5 GB" stay on one line in a narrow column
    lines = ["| student | " + " | ".join(f"{lk}, s = {sc:g}" for lk, sc in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for a, m in rows:
        lines.append(f"| {a},{nb}m{nb}={nb}{m} | " + " | ".join(entry(by[(a, m, lk, sc)]).replace(" GB", f"{nb}GB")
                                                               for lk, sc in cols) + " |")
    return "\n".join(lines)


def dnn_cap_sentence(q: dict) -> str:
    """The widths whose paths stop below ``dnn_Nmax`` (:func:`dnn_nmax`), with the memory one run at ``dnn_Nmax``
    would need there and the cap it exceeds; "" when no width is capped."""
    num = lambda n: f"{n:,}".replace(",", " ")
    capped = [(m, n) for m, n in ((int(m), dnn_nmax(q, int(m))) for m in q["dnn_ms"]) if n < q["dnn_Nmax"]]
    if not capped:
        return ""
    need = max(_dnn_memory({**q, "m": m}) for m, _ in capped)
    return (f"At the wider students the doubling stops earlier ({', '.join(f'm = {m} up to {num(n)}' for m, n in capped)} "
            f"paths): one DMFT run at {num(_bisect_max_paths(q['dnn_N'], q['dnn_Nmax']))} paths would need "
            f"{need / 2 ** 30:.1f} GiB there, mostly the path responses χ(t, s) (N·m² values for each pair s ≤ t), "
            f"more than the {float(q['dnn_run_gib']):g} GiB a run may take (`dnn_run_gib`), so these cells are more "
            "often noise-limited. Paths stored in float32 would halve the memory, but then the covariance Q_⊥ of "
            "w⁰ … wᵗ, built from float32 Monte-Carlo averages, loses positive definiteness (an eigenvalue ≈ −10⁻⁸ "
            "against a largest of order 1) and the DMFT stops within its first twenty steps at the grid's step sizes "
            "(`tests/test_dmft.py`).")


def dnn_gap_sentence(Dn, store=None) -> str:
    """What the cells not computed are (per width: how many of its cells), what they would add, their compute time
    by the cost model (calibrated on the stored cells' own timings, those of like cost first), their peak memory by the memory
    model, and, when some need more than this machine's device has, that a sweep here does not start them and where
    they run. "" when every cell is computed."""
    cells = dnn_cells(Dn, store)
    miss = [c for c in cells if c["state"] in ("to do", "too large")]
    if not miss:
        return ""
    q = Dn.meta["params"]
    per_m = []
    for m in q["dnn_ms"]:
        k = sum(c["m"] == m for c in miss)
        n = sum(c["m"] == m for c in cells)
        if k:
            per_m.append(f"{'all' if k == n else f'{k} of the'} {n} cells at m = {m}")
    hours = sum(c["minutes"] for c in miss) / 60
    when = (f"about {sweep.fmt_seconds(hours * 3600)} by the cost model, at the rate the computed cells ran (their own "
            "wall times; each missing cell at the rate of the computed cells of like cost, where there are some)"
            if np.isfinite(hours) else "a time the cost model cannot yet estimate (no stored cell to calibrate it)")
    text = (f"The cells not computed — {', and '.join(per_m)} — would take {when}; they would show how δ_NN(t) "
            "moves with the width, the link and the initialisation scale beyond the cells computed. They compute, "
            "resuming where they stopped, with `python -m grokspectra run ch3.dnn --profile paper`.")
    big = [c for c in miss if c["state"] == "too large"]
    if big:
        ms = sorted({c["m"] for c in big})
        limit, _ = sweep.InProcess().memory_limit("auto")
        text += (f" Of these, {len(big)} (m = {', '.join(map(str, ms))}) need up to "
                 f"{sweep.fmt_bytes(max(c['need'] for c in big))} each for one DMFT run at the bisection's most "
                 f"paths, more than the {limit / 2 ** 30:.1f} GiB of the device that built this page: a sweep there "
                 "does not start them (`run --dry-run` lists every cell's estimate), and a machine with that much "
                 "memory, such as a large GPU (`--device cuda`), computes them with the same command.")
    return text


def dnn_scale_rows(Dn) -> list[dict]:
    """δ_NN(t) at the two initialisation scales of every cell computed at both (bisected or noise-limited at every
    t), with how many combined uncertainties apart they are (half-brackets and Monte-Carlo spreads in quadrature)."""
    q = Dn.meta["params"]
    out = []
    if len(q["dnn_scales"]) < 2:
        return out
    for ia, act in enumerate(q["dnn_acts"]):
        for im, m in enumerate(q["dnn_ms"]):
            for il, lk in enumerate(q["dnn_links"]):
                a_, b_ = (ia, im, il, 0), (ia, im, il, 1)
                if not (np.all(Dn["status"][a_] <= 1) and np.all(Dn["status"][b_] <= 1)):
                    continue
                u_ = lambda c: np.hypot(0.5 * (Dn["hi"][c] - Dn["lo"][c]), Dn["root_mc_se"][c])  # noqa: E731
                z = np.abs(Dn["delta_nn"][a_] - Dn["delta_nn"][b_]) / np.hypot(u_(a_), u_(b_))
                for it, t in enumerate(q["dnn_times"]):
                    out.append({"student": f"{act}, m = {m}, {lk}", "t": int(t),
                                "a": float(Dn["delta_nn"][a_][it]), "b": float(Dn["delta_nn"][b_][it]),
                                "z": float(z[it])})
    return out


def dlin_low_sentence(DL, L) -> str:
    """What c_T does at the lower end of the δ_lin bracket (the evaluations at δ = lo with the most paths, per
    horizon), and how the hard overlap of the linearised DMFT behaves at the smallest δ of ``linear``: its growth
    factor M_T/M_0 and the share of that growth made in the second half of the run (small: it saturates)."""
    lo = float(DL.meta["params"]["dlin_lo"])
    parts, undecided = [], 0
    for i, T in enumerate(DL["horizons"]):
        h = DL["hist"][i]
        h = h[np.isfinite(h[:, 0]) & (np.abs(h[:, 0] - lo) < 1e-9)]
        if not len(h):
            continue
        _, n, m, se = h[np.argmax(h[:, 1])]
        undecided += abs(m) < 2 * se
        parts.append(f"{m:+.2f} ± {se:.2f} at T = {int(T)} ({int(n)} paths)")
    if not parts:
        return ""
    M = np.abs(np.asarray(L["M"][0], float))
    T = len(M) - 1
    late = (M[T] - M[T // 2]) / max(M[T] - M[0], 1e-300)
    txt = (f"at the lower end of the bracket, δ = {lo:g}, c_T is {'; '.join(parts)}. "
           + (f"In {undecided} of {len(parts)} horizons its sign is undecided even at the largest path count. "
              if undecided else "")
           + (f"The trajectories above show why: at δ = {float(L['deltas'][0]):g} the hard overlap does not decay, "
              f"it grows by a factor {M[T] / M[0]:.1f} over {T} steps, only {100 * late:.0f} % of that in the second "
              "half: it levels off. Below the threshold c_T therefore tends to zero from above instead of turning "
              "negative, and a sign test separates 'still growing' from 'levelling off' only as far as the paths "
              "resolve a small positive number from zero." if M[T] > M[0] and late < 0.5 else
              f"At δ = {float(L['deltas'][0]):g} the hard overlap changes by a factor {M[T] / M[0]:.2f} over {T} "
              f"steps, {100 * late:.0f} % of that in the second half."))
    return txt


def settle_sentence(rows: list, tol: float, lag: int, T: int) -> str:
    """What the convergence check found, per ridge λ, in words: which part of eq. ch3-settled fails."""
    parts = []
    for r in rows:
        why = []
        if r["dQ"] >= tol:
            why.append(f"$Q_\\perp$ still moves by {r['dQ']:.3f}")
        if r["dtrain"] >= tol:
            why.append(f"the train risk still moves by {r['dtrain']:.3f}")
        if not r["edge_ok"]:
            why.append(f"the edge is {r['edge']:+.3f} ± {r['edge_se']:.3f}")
        elif r["edge"] < 0:
            why.append(f"the edge, {r['edge']:+.3f} ± {r['edge_se']:.3f}, is not resolved from zero")
        state = "settles" if r["settled"] and r["edge_ok"] else "does not settle"
        parts.append(f"with λ = {r['lam']:g} the first phase {state}" + (f" ({', '.join(why)})" if why else ""))
    return (f"Over the last {lag} of {T} steps (tolerance {tol:g}): " + "; ".join(parts) + ".")


def grid_root(deltas, c) -> dict:
    """The threshold on a δ grid: the first crossing of the criterion ``c`` [δ] from ≥ 0 (no outlier) to < 0 (an
    outlier), by linear interpolation, and by a quadratic through the crossing pair and its nearer outer neighbour
    (their difference bounds the interpolation error). ``status``: "root"; "below grid" (c < 0 already at the
    first δ); "above grid" (no crossing). ``crossings`` counts the sign changes (1 for a clean threshold)."""
    x, y = np.asarray(deltas, float), np.asarray(c, float)
    if x.ndim != 1 or y.shape != x.shape or x.size < 2 or np.any(np.diff(x) <= 0):
        raise ValueError(f"need an increasing δ grid of ≥ 2 points and one criterion per δ; got {x}, {y.shape}")
    if not np.all(np.isfinite(y)):
        raise ValueError(f"non-finite criterion on the grid: {y}")
    neg = y < 0
    crossings = int(np.sum(neg[1:] != neg[:-1]))
    nan = float("nan")
    if neg[0]:
        return {"root": nan, "quad": nan, "status": "below grid", "crossings": crossings, "i": -1}
    if not neg.any():
        return {"root": nan, "quad": nan, "status": "above grid", "crossings": crossings, "i": -1}
    i = int(np.argmax(neg)) - 1  # y[i] ≥ 0 > y[i+1]
    root = x[i] + y[i] * (x[i + 1] - x[i]) / (y[i] - y[i + 1])
    j = [i - 1, i, i + 1] if i + 2 >= x.size or (i >= 1 and root - x[i] < x[i + 1] - root) else [i, i + 1, i + 2]
    quad = root
    if j[0] >= 0:
        co = np.polyfit(x[j], y[j], 2)
        rr = [float(r.real) for r in np.roots(co) if abs(r.imag) < 1e-12 and x[i] <= r.real <= x[i + 1]]
        quad = min(rr, key=lambda r: abs(r - root)) if rr else root
    return {"root": float(root), "quad": float(quad), "status": "root", "crossings": crossings, "i": i}


EDGE_MISFIRE_SD = 20.0  # robust standard deviations from the other path sets: a bulk edge beyond is a solver misfire
EDGE_MISFIRE_MIN_REPS = 6  # fewer path sets give no robust spread to judge by


def edge_misfires(edge) -> np.ndarray:
    """Mask [δ, rep, t] of the bulk edges that lie more than :data:`EDGE_MISFIRE_SD` robust standard deviations
    (1.4826 × the median absolute deviation over the path sets at the same δ and t) from the path sets' median.

    The edge is the square-root extrapolation of the branch gap from the end of the followed real branch
    (:func:`~grokspectra.spectral.real_axis_edge`), which does not check that its result lies near that end; the
    criterion (``crit``) is read at the end itself, before the extrapolation. A Monte-Carlo spread does not put a
    path set 20 robust s.d. away (on the paper grid, 767 of its 768 edges lie within 14, the one beyond at 250), so
    such a value is the solver's, not the sample's. With fewer than
    :data:`EDGE_MISFIRE_MIN_REPS` path sets nothing is flagged (the median absolute deviation of three values can be
    arbitrarily small)."""
    e = np.asarray(edge, float)
    if e.shape[1] < EDGE_MISFIRE_MIN_REPS:
        return np.zeros(e.shape, bool)
    med = np.median(e, axis=1, keepdims=True)
    sd = 1.4826 * np.median(np.abs(e - med), axis=1, keepdims=True)
    return np.abs(e - med) > EDGE_MISFIRE_SD * np.maximum(sd, 1e-9 * (1 + np.abs(med)))


def limit_roots(L) -> dict:
    """δ_NN(t) and the bulk edge there from :func:`limit`'s grid ``crit``, ``edge`` [δ, rep, t]: per t the root of
    the replicate-mean criterion (:func:`grid_root`), its jackknife standard error over replicates (the path sets
    are common to every δ and t, so the leave-one-out roots carry the correlations between t), the interpolation
    error |quadratic − linear|, and the mean edge linearly interpolated to the root. Also the leave-one-out values
    ``root_jk``, ``edge_jk`` [rep, t] for :func:`limit_fits`. Edges flagged by :func:`edge_misfires` are left out
    of the means (``misfires``: their (δ, rep, t, value, and the range of the other path sets there);
    ``edge_with_misfires`` and its s.e.: the mean edge had they been kept)."""
    crit, edge = np.asarray(L["crit"], float), np.asarray(L["edge"], float)
    bad = edge_misfires(edge)
    edge_all, edge = edge, np.where(bad, np.nan, edge)
    deltas, R, nt = np.asarray(L["deltas"], float), crit.shape[1], crit.shape[2]
    if R < 3:
        raise ValueError(f"need ≥ 3 replicates for a jackknife, got {R}")

    def at(idx, edge=edge):
        cm, em = crit[:, idx].mean(1), np.nanmean(edge[:, idx], 1)  # [δ, t]
        g = [grid_root(deltas, cm[:, it]) for it in range(nt)]
        e = [float(np.interp(r["root"], deltas, em[:, it])) if r["status"] == "root" else float("nan")
             for it, r in enumerate(g)]
        return g, np.array([r["root"] for r in g]), np.array(e)

    g, root, e = at(np.arange(R))
    jk = [at(np.delete(np.arange(R), j)) for j in range(R)]
    root_jk, edge_jk = np.array([x[1] for x in jk]), np.array([x[2] for x in jk])

    def jse(v):
        return np.sqrt((R - 1) / R * np.sum((v - v.mean(0)) ** 2, axis=0))

    e_all = at(np.arange(R), edge_all)[2]
    e_all_se = jse(np.array([at(np.delete(np.arange(R), j), edge_all)[2] for j in range(R)]))
    misfires = [(float(deltas[i]), int(j), int(np.asarray(L["times"])[k]), float(edge_all[i, j, k]),
                 float(np.nanmin(edge[i, :, k])), float(np.nanmax(edge[i, :, k]))) for i, j, k in np.argwhere(bad)]

    return {"times": np.asarray(L["times"]), "root": root, "root_se": jse(root_jk),
            "interp": np.abs(np.array([r["quad"] for r in g]) - root), "status": [r["status"] for r in g],
            "crossings": np.array([r["crossings"] for r in g]), "edge": e, "edge_se": jse(edge_jk),
            "root_jk": root_jk, "edge_jk": edge_jk, "reps": R, "misfires": misfires, "edge_with_misfires": e_all,
            "edge_with_misfires_se": e_all_se, "n_edges": int(edge.size)}


def _fit_power(t, y, w):
    """y = y∞ − A t^(−a) by weighted least squares (a in [0.02, 4]); returns (y∞, A, a, χ²)."""
    from scipy.optimize import curve_fit

    f = lambda t, yi, A, a: yi - A * t ** (-a)  # noqa: E731
    A0 = (y[-1] - y[0]) / max(t[0] ** -0.5 - t[-1] ** -0.5, 1e-9)
    p, _ = curve_fit(f, t, y, p0=(y[-1] + A0 * t[-1] ** -0.5, A0, 0.5), sigma=1 / w,
                     bounds=([-np.inf, -np.inf, 0.02], [np.inf, np.inf, 4.0]), maxfev=20000)
    return (*map(float, p), float(np.sum((w * (y - f(t, *p))) ** 2)))


def limit_fits(t, y, se, y_jk, *, t_min: int) -> dict:
    """Two laws for a quantity y(t) (δ_NN(t) or the edge at it) over t ≥ ``t_min``: a power-law approach to a
    finite limit, y = y∞ − A t^(−a), and unbounded logarithmic growth, y = b₀ + b₁ log t, each weighted by 1/se.
    Parameter errors are jackknife errors: each law is refitted on every leave-one-out row of ``y_jk`` [rep, t],
    which carries the correlation between steps (the same paths serve every t); the χ² values ignore that
    correlation and are a guide only. Returns ``{"power": {...}, "log": {...}, "n": points}``."""
    t, y, se, y_jk = (np.asarray(a, float) for a in (t, y, se, y_jk))
    k = (t >= t_min) & np.isfinite(y) & np.isfinite(se) & np.all(np.isfinite(y_jk), axis=0)
    if k.sum() < 4:
        raise ValueError(f"need ≥ 4 finite points at t ≥ {t_min} for a three-parameter law; got {int(k.sum())}")
    t, y, w, y_jk = t[k], y[k], 1 / np.maximum(se[k], 1e-12), y_jk[:, k]
    R = y_jk.shape[0]

    def jse(v):
        v = np.asarray(v, float)
        return float(np.sqrt((R - 1) / R * np.sum((v - v.mean(0)) ** 2, axis=0)))

    yi, A, a, chi_p = _fit_power(t, y, w)
    pj = np.array([_fit_power(t, yj, w)[:3] for yj in y_jk])
    X = np.column_stack([np.ones_like(t), np.log(t)])
    lin = lambda yy: np.linalg.lstsq(X * w[:, None], yy * w, rcond=None)[0]  # noqa: E731
    b = lin(y)
    bj = np.array([lin(yj) for yj in y_jk])
    chi_l = float(np.sum((w * (y - X @ b)) ** 2))
    n = int(k.sum())
    return {"n": n, "t": t,
            "power": {"inf": yi, "inf_se": jse(pj[:, 0]), "A": A, "a": a, "a_se": jse(pj[:, 2]), "chi2": chi_p,
                      "dof": n - 3, "resid": (y - (yi - A * t ** -a)) * w},
            "log": {"b0": float(b[0]), "b1": float(b[1]), "b1_se": jse(bj[:, 1]), "chi2": chi_l, "dof": n - 2,
                    "resid": (y - X @ b) * w}}


def limit_windows(rt: dict, t_min: int, min_points: int = 5) -> list[dict]:
    """:func:`limit_fits` of δ_NN(t) (``fd``) and of the edge at it (``fe``) over every window t ≥ t₀, for t₀ among
    the computed steps with at least ``min_points`` steps from t₀ on (two degrees of freedom for the three-parameter
    law), and always for t₀ = ``t_min``; in increasing t₀. The spread over windows is the fit's systematic error:
    a law that held over the whole range would give the same limit in every window."""
    times = np.sort(np.asarray(rt["times"]))
    if int(t_min) not in set(times.tolist()) or np.sum(times >= t_min) < 4:
        raise ParamError(f"lim_tmin = {t_min} must be one of the computed steps {times.tolist()} with at least four "
                         "steps from it on (three parameters per law)")
    t0s = sorted({int(t) for t in times if np.sum(times >= t) >= min_points} | {int(t_min)})
    return [{"t_min": t0, "fd": limit_fits(rt["times"], rt["root"], rt["root_se"], rt["root_jk"], t_min=t0),
             "fe": limit_fits(rt["times"], rt["edge"], rt["edge_se"], rt["edge_jk"], t_min=t0)} for t0 in t0s]


def limit_verdict(wins: list[dict], t_min: int) -> dict:
    """What the window scan (:func:`limit_windows`) establishes. Two analyses must agree: the fit over all steps
    (the earliest window, the most precise if one law holds throughout) and the fit over t ≥ ``t_min`` (the chosen
    window, robust to early-time corrections); the other windows, with fewer steps, only measure the spread. The
    edge limit e∞ is ``"marginal"`` when it is within 2 jackknife s.e. of 0 (and resolved, s.e. < 0.1) in both,
    ``"below"`` when it is more than 2 s.e. below 0 in both, else ``"mixed"``. δ_NN(t) has a finite limit
    (``finite``) when its exponent a is more than 2 s.e. above 0 in both (otherwise the data cannot tell it from
    logarithmic growth). δ_NN(∞) is δ∞ of the chosen window ± its jackknife s.e. (``inf_se``) ± half the range of
    δ∞ over all windows (``inf_syst``); the book's limit definition applies (``ok``) only when the edge is
    marginal and the limit finite."""
    main = next(w for w in wins if w["t_min"] == t_min)
    judged = [wins[0], main] if wins[0] is not main else [main]
    pe = [w["fe"]["power"] for w in judged]
    pd = [w["fd"]["power"] for w in judged]
    marg = [abs(p["inf"]) <= 2 * p["inf_se"] and p["inf_se"] < 0.1 for p in pe]
    below = [p["inf"] + 2 * p["inf_se"] < 0 for p in pe]
    edge = "marginal" if all(marg) else "below" if all(below) else "mixed"
    finite = all(p["a"] > 2 * p["a_se"] for p in pd)
    infs = [w["fd"]["power"]["inf"] for w in wins]
    return {"edge": edge, "marginal": edge == "marginal", "edge_below": edge == "below", "finite": finite,
            "ok": edge == "marginal" and finite, "inf": main["fd"]["power"]["inf"],
            "inf_se": main["fd"]["power"]["inf_se"], "inf_syst": 0.5 * (max(infs) - min(infs)),
            "windows": [w["t_min"] for w in wins], "judged": [w["t_min"] for w in judged]}


def _later_windows(wins: list[dict], v: dict) -> tuple[list[dict], list[int]]:
    """The windows after those :func:`limit_verdict` judged, and the t₀ of those among them whose e∞ is within
    2 s.e. of 0."""
    late = [w for w in wins if w["t_min"] > max(v["judged"])]
    return late, [w["t_min"] for w in late if abs(w["fe"]["power"]["inf"]) <= 2 * w["fe"]["power"]["inf_se"]]


def limit_sentence(rt: dict, wins: list[dict], t_min: int) -> str:
    """The section's result in words, from :func:`limit_roots` and the window scan :func:`limit_windows`."""
    v = limit_verdict(wins, t_min)
    main = next(w for w in wins if w["t_min"] == t_min)
    fd, fe = main["fd"], main["fe"]
    pd, pe, lg = fd["power"], fe["power"], fd["log"]
    first = wins[0]["fe"]["power"]
    s = (f"Over t ≥ {t_min} ({fd['n']} steps, {rt['reps']} path sets), the bulk edge at the threshold follows "
         f"e(t) = e∞ − B t^(−b) with e∞ = {pe['inf']:+.3f} ± {pe['inf_se']:.3f} ({pe['inf'] / pe['inf_se']:+.1f} s.e.) "
         f"and b = {pe['a']:.2f} ± {pe['a_se']:.2f}")
    if wins[0] is not main:
        s += (f"; over all steps, t ≥ {wins[0]['t_min']}, e∞ = {first['inf']:+.3f} ± {first['inf_se']:.3f} "
              f"({first['inf'] / first['inf_se']:+.1f} s.e.)")
    s += ": " + {"marginal": "consistent with the marginal value 0, so the first phase ends only as t → ∞, at the "
                             "edge of stability. ",
                 "below": "below 0: the dynamics does not approach a marginal point within this law. ",
                 "mixed": "the windows agree on the value of e∞, but the fit over all steps puts it below 0 and the "
                          "fit over the later steps does not exclude 0, so that the edge reaches 0 as t → ∞ is not "
                          "established by these steps (a slower approach than one power law, or a limit slightly "
                          "below 0, fits them as well). "}[v["edge"]]
    late, free = _later_windows(wins, v)
    if v["edge"] != "marginal" and free:
        s += (f"Of the {len(late)} later windows, {len(free)} (t ≥ {', '.join(str(t) for t in free)}) have larger "
              "errors and do not exclude 0; the verdict rests on the windows judged, as set before the run. ")
    s += (f"δ_NN(t) = δ∞ − A t^(−a) gives δ∞ = {pd['inf']:.2f} ± {pd['inf_se']:.2f} (jackknife) ± "
          f"{v['inf_syst']:.2f} (half its range over the windows) with a = {pd['a']:.2f} ± {pd['a_se']:.2f} "
          f"(χ² = {pd['chi2']:.1f} on {pd['dof']} dof); unbounded growth b₀ + b₁ log t gives b₁ = {lg['b1']:.2f} ± "
          f"{lg['b1_se']:.2f} (χ² = {lg['chi2']:.1f} on {lg['dof']} dof; the χ² values ignore the correlation between "
          "steps that share paths). ")
    s += ("The exponent is resolved away from 0, so the limit is finite within the fits." if v["finite"]
          else "The exponent is not resolved away from 0: these steps cannot tell a finite limit from slow "
               "unbounded growth, and δ∞ is not established.")
    return s


def limit_window_table(wins: list[dict]) -> str:
    """The window scan as a markdown table: per t₀, δ∞, a, e∞, b and the χ² of both laws for δ_NN(t)."""
    rows = ["| fit window | δ∞ | exponent a | χ² power / log law (dof) | e∞ | exponent b |", "|---|---|---|---|---|---|"]
    for w in wins:
        p, e, lg = w["fd"]["power"], w["fe"]["power"], w["fd"]["log"]
        rows.append(f"| $t \\ge$ {w['t_min']} ({w['fd']['n']} steps) | {p['inf']:.2f} ± {p['inf_se']:.2f} | "
                    f"{p['a']:.2f} ± {p['a_se']:.2f} | {p['chi2']:.1f} ({p['dof']}) / {lg['chi2']:.1f} ({lg['dof']}) | "
                    f"{e['inf']:+.3f} ± {e['inf_se']:.3f} | {e['a']:.2f} ± {e['a_se']:.2f} |")
    return "\n".join(rows)


def limit_summary(Lm, t_min: int) -> dict:
    """δ_NN(∞) for other chapters: the window scan of :func:`limit` (``Lm``) reduced by :func:`limit_verdict` (δ∞
    ± s.e. ± window spread, ``ok``: the limit definition applies), the exponent and e∞ of the window t ≥ ``t_min``,
    the student it is for and the largest t computed."""
    rt = limit_roots(Lm)
    wins = limit_windows(rt, t_min)
    v = limit_verdict(wins, t_min)
    main = next(w for w in wins if w["t_min"] == t_min)
    p, pe = main["fd"]["power"], main["fe"]["power"]
    return {**v, "a": p["a"], "a_se": p["a_se"], "e_inf": pe["inf"], "e_inf_se": pe["inf_se"],
            "t_max": int(np.max(rt["times"])), "t_min": int(t_min), "act": "quad", "m": 1, "link": "pr_clip",
            "clip": 6.0, "eta": float(Lm.meta["params"]["eta_quad"]), "profile": Lm.meta.get("profile")}


def limit_misfire_sentence(rt: dict) -> str:
    """The bulk edges :func:`limit_roots` left out (:func:`edge_misfires`), beside the other path sets' range at the
    same δ and t, and how the affected rows would read had they been kept; "" when none was left out."""
    mf = rt.get("misfires") or []
    if not mf:
        return ""
    times = list(np.asarray(rt["times"]).astype(int))
    what = "; ".join(f"δ = {d:g}, path set {j + 1} of {rt['reps']}, t = {t}: {v:+.3f}, where the others give "
                     f"{lo:+.3f} to {hi:+.3f}" for d, j, t, v, lo, hi in mf)
    kept = "; ".join(f"t = {t}: {rt['edge_with_misfires'][times.index(t)]:+.3f} ± "
                     f"{rt['edge_with_misfires_se'][times.index(t)]:.3f} instead of {rt['edge'][times.index(t)]:+.3f} ± "
                     f"{rt['edge_se'][times.index(t)]:.3f}" for t in sorted({m[2] for m in mf}))
    n = len(mf)
    return (f"{n} of the {rt['n_edges']} bulk edges of the grid {'is' if n == 1 else 'are'} left out of the table's "
            f"means and the fits ({what}). A value more than {EDGE_MISFIRE_SD:g} robust standard deviations "
            "(1.4826 × the median absolute deviation over path sets) from the other path sets is no Monte-Carlo "
            "spread but a failure of the edge solver (it follows the real branch of the bulk equation to its end, "
            "then extrapolates the square-root law of the branch gap). The criterion of the same law is kept: it is "
            "read at the end of the followed branch, before the extrapolation. Kept, the table would read "
            f"{kept}. A check inside the solver waits for the next recompute of chapters 2–3: any change to it makes "
            "every stored result of theirs stale.")


def limit_dnn_sentence(rt: dict, Dn) -> str:
    """The grid's δ_NN(t) (:func:`limit_roots`) against the bisection of ``dnn`` for the same student (Quad, m = 1,
    first link and scale of the table) at the steps both have: the difference in units of the combined uncertainty
    (jackknife s.e. and interpolation error; half-bracket and Monte-Carlo spread). "" when no step is shared."""
    q = Dn.meta["params"]
    if "quad" not in list(q["dnn_acts"]) or 1 not in list(q["dnn_ms"]):
        return ""
    c = (list(q["dnn_acts"]).index("quad"), list(q["dnn_ms"]).index(1), 0, 0)
    parts = []
    for it, t in enumerate(q["dnn_times"]):
        j = np.flatnonzero(np.asarray(rt["times"]) == t)
        if not j.size or Dn["status"][c][it] > 1 or rt["status"][j[0]] != "root":
            continue
        j = j[0]
        a, b = float(rt["root"][j]), float(Dn["delta_nn"][c][it])
        u = math.hypot(math.hypot(rt["root_se"][j], rt["interp"][j]),
                       math.hypot(0.5 * (Dn["hi"][c][it] - Dn["lo"][c][it]), Dn["root_mc_se"][c][it]))
        parts.append(f"{a:.2f} against {b:.2f} at t = {int(t)} ({abs(a - b) / u:.1f} combined uncertainties)")
    if not parts:
        return ""
    return ("The grid and the bisection of the table above are independent computations (other paths, other δ); "
            "they give " + "; ".join(parts) + ".")


def limit_definition(wins: list[dict], t_min: int) -> str:
    """The paragraph that says which δ_NN the book uses, from :func:`limit_verdict` of the window scan."""
    v = limit_verdict(wins, t_min)
    if v["ok"]:
        return (f"**The definition this book uses.** The bulk edge reaches zero only as t → ∞, so δ_NN is the limit "
                f"δ∞ of eq. (ch3-limit), {v['inf']:.2f} ± {v['inf_se']:.2f} ± {v['inf_syst']:.2f} for the Quad toy; "
                "the finite-t values of the table above are lower estimates of it, and the chapters that compare GD "
                "with δ_NN (4 and 5) use both.")
    why = {"below": "the fitted limit of the bulk edge lies below zero", "mixed": "the fits do not establish that the edge reaches zero",
           "marginal": "δ_NN(t) is not shown to approach a finite limit"}[v["edge"]]
    extra = (f" The limit of δ_NN(t) itself is finite within the fits, δ∞ = {v['inf']:.2f} ± {v['inf_se']:.2f} ± "
             f"{v['inf_syst']:.2f}, and chapters 4 and 5 show it beside GD's thresholds, as a number whose meaning "
             "rests on that unproven end point." if v["finite"] else "")
    return (f"**The definition this book uses.** Since the end of the first phase is out of reach and the limit "
            f"t → ∞ is not established as its end ({why}), the book's δ_NN is the finite-horizon value δ_NN(t) at the "
            "latest step of the table, with its uncertainty, and always marked with the step. We do not call it the "
            "paper's δ_NN: it is a lower estimate if the upward drift with t continues, and the chapters that "
            "compare GD with it (4 and 5) say so." + extra)


def claims(O, split, Dn, DL, L, A, settle_rows, profile: str, *, settle_profile: str | None = None,
           limit: tuple | None = None) -> list:
    """The chapter's claims table (``report.Claim`` rows, each with the scale it was judged at: the profile of the
    result it rests on; ``profile`` is the notebook's, used where a result carries none, and ``settle_profile``
    that of the convergence check). ``limit`` = (result of :func:`limit`, :func:`limit_roots`, the window scan
    :func:`limit_windows`, t_min) adds the row of the limit t → ∞."""
    from .. import report

    def prof(R):
        return (R.meta.get("profile") if R is not None else None) or profile

    rows = []
    d = int(O.meta["params"]["out_d"])
    # 1. outlier equation vs GD Hessians, per student at the δ with the most non-escaped seeds that have a predicted
    #    outlier (at least 2; ties: the largest δ), so that the row is judged on the most data
    for name in ("gelu", "quad"):
        cand = [r for r in split[name] if r["predicted"] >= 2]
        st = STUDENTS[name]
        label = f"{name}, m = {st['m']}, η = {st['eta']:g}, t = {int(O[f'{name}_t'])}"
        if not cand:
            rows.append(report.at_scale(report.Claim(
                f"hard outlier of the GD Hessian = root of Φ_t on the run's own weights ({label})",
                "eq. app-outlier", "equal", "no δ with two non-escaped seeds that have an outlier", None),
                f"{prof(O)}: d = {d}"))
            continue
        r = max(cand, key=lambda r: (r["predicted"], r["delta"]))
        row = report.Claim(
            f"hard outlier of the GD Hessian = root of Φ_t on the run's own weights ({label}, δ = {r['delta']:g})",
            "eq. app-outlier; mechanism of [MW26]", "difference 0",
            f"{r['mean_diff']:+.4f} ± {r['se_diff']:.4f} over {r['predicted']} non-escaped seeds "
            f"({r['escaped']} of {r['seeds']} escaped: no outlier"
            + (f"; {r['failed']} not escaped whose outlier solve did not converge, left out" if r.get("failed") else "")
            + ")", r["agree"],
            f"(|mean| ≤ {r['t_mult']:.2f} s.e. (Student's t, {r['predicted'] - 1} dof) + 1 % = {r['tol']:.4f})")
        rows.append(report.at_scale(row, f"{prof(O)}: d = {d}, {r['seeds']} seeds",
                                    comparable=d >= 2000 and r["predicted"] >= 10,
                                    needs="d ≥ 2000 and ≥ 10 non-escaped seeds with an outlier"))
    # 2. antithetic sampling
    anti_max = float(max(O["quad_M"][:, 0].max(), O["gelu_M"][:, 0].max()))
    plain_min = float(min(O["quad_M"][:, 2].min(), O["gelu_M"][:, 2].min()))
    rows.append(report.at_scale(report.Claim(
        "antithetic DMFT keeps the hard overlap at 0; plain sampling does not", "eq. app-dmft (odd in z)",
        "0 vs > 0", f"{anti_max:.1e} vs ≥ {plain_min:.3f}", bool(anti_max == 0 and plain_min > 1e-3)),
        f"{prof(O)}: N = {int(O.meta['params']['out_N'])} paths"))
    # 3. the first phase settles
    ok = [r for r in settle_rows if r["settled"] and r["edge_ok"]]
    best = max(settle_rows, key=lambda r: r["edge"])
    rows.append(report.at_scale(report.Claim(
        "the first phase ends at a point with bulk ≥ 0 (where δ_NN is read)", "[MW26], abstract: δ_NN is read "
        "“after the first phase”", "order parameters converge, bulk edge ≥ 0",
        f"not within reach: largest edge {best['edge']:+.3f} ± {best['edge_se']:.3f} (ridge λ = {best['lam']:g})"
        if not ok else f"settles with ridge λ = {ok[0]['lam']:g}", None,
        "not established by our DMFT; the book reads δ_NN(t) at a finite t" if not ok else
        "settled by eq. ch3-settled"), f"{settle_profile or profile}: Quad toy, eq. ch3-settled"))
    # 4. δ_NN(t): value and drift
    t_list = list(Dn.meta["params"]["dnn_times"])
    acts = list(Dn.meta["params"]["dnn_acts"])
    if "quad" in acts:
        iq = acts.index("quad")
        v, se = Dn["delta_nn"][iq, 0, 0, 0], Dn["root_mc_se"][iq, 0, 0, 0]
        lo, hi = Dn["lo"][iq, 0, 0, 0], Dn["hi"][iq, 0, 0, 0]
        txt = "; ".join(f"t = {t}: {a:.2f} [{b:.2f}, {c:.2f}], MC spread {e:.2f}" for t, a, b, c, e
                        in zip(t_list, v, lo, hi, se))
        u = np.hypot(0.5 * (hi - lo), se)  # half-bracket and Monte-Carlo spread, per t
        drift = report.finite(v[0], v[-1], u[0], u[-1]) and abs(v[-1] - v[0]) > 2 * math.hypot(u[0], u[-1])
        rows.append(report.at_scale(report.Claim(
            "δ_NN of the Quad toy (m = 1, y = min(z², 6), η = 0.1)", "[MW26]; our eq. ch3-dnn",
            "read at the end of the first phase", txt, None,
            ("not established: drifts with t by more than twice its uncertainty, phase 1 has not ended" if drift
             else "not established: phase 1 has not ended")),
            f"{prof(Dn)}: {int(Dn.meta['params']['dnn_reps'])} path sets × ≤ {int(Dn.meta['params']['dnn_Nmax'])} paths"))
    # 4b. the limit t → ∞ of δ_NN(t) and of the edge at it, judged over every fit window
    if limit is not None:
        Lm, rt, wins, t_min = limit
        v = limit_verdict(wins, t_min)
        es = [w["fe"]["power"] for w in wins if w["t_min"] in v["judged"]]
        zs = ", ".join(f"{p['inf'] / p['inf_se']:+.1f}" for p in es)
        late, free = _later_windows(wins, v)
        lp = Lm.meta["params"]
        rows.append(report.at_scale(report.Claim(
            "δ_NN(t) tends to a finite limit where the bulk edge reaches 0 (phase 1 ends as t → ∞)",
            "our eq. ch3-limit; marginal stability (Sarao Mannelli et al. 2020)", "e∞ = 0 and a > 0",
            "e∞ = " + " and ".join(f"{p['inf']:+.3f} ± {p['inf_se']:.3f}" for p in es)
            + f" (t ≥ {' and t ≥ '.join(str(t) for t in v['judged'])}: {zs} s.e.); "
            f"δ∞ = {v['inf']:.2f} ± {v['inf_se']:.2f} ± {v['inf_syst']:.2f}",
            True if v["ok"] else (False if v["edge_below"] else None),
            "(|e∞| ≤ 2 s.e. and a > 2 s.e. over all steps and over the chosen window, jackknife)"
            + {"marginal": "" if v["finite"] else "; the limit of δ_NN(t) is not resolved",
               "below": (f"; {len(free)} of the {len(late)} later, shorter windows do not exclude 0" if free
                         else ""),
               "mixed": "; e∞ is below 0 over all steps, consistent with 0 over the later ones: not "
                        "established"}[
                v["edge"]]),
            f"{prof(Lm)}: {int(lp['lim_reps'])} path sets × {int(lp['lim_N'])} paths, t ≤ {int(max(lp['lim_times']))}, "
            f"fits over t ≥ {' and t ≥ '.join(str(t) for t in v['judged'])}"))
    # 5. δ_lin
    i = len(DL["horizons"]) - 1
    st = int(DL["status"][i])
    got = (f"{DL['root'][i]:.2f} [{DL['lo'][i]:.2f}, {DL['hi'][i]:.2f}]" if st <= 1 else
           f"{BISECT_STATUS[st]} on [{DL['lo'][i]:.1f}, {DL['hi'][i]:.1f}]")
    note = ("horizon differs from δ_NN's t" if st == 0 else
            "Monte-Carlo-limited: not a test" if st <= 2 else "the sign criterion has no root here: not a test")
    rows.append(report.at_scale(report.Claim(
        "linearised DMFT gives the same threshold", "eq. app-lin", "δ_lin(T) = δ_NN",
        f"T = {int(DL['horizons'][i])}: {got}", None, note),
        f"{prof(DL)}: ≤ {int(DL['n_final'][i])} paths × {int(DL.meta['params']['dlin_reps'])} sets"))
    # 6. δ_alg and δ_NN > δ_alg
    dalg = float(A["delta_alg"])
    rows.append(report.at_scale(report.Claim(
        "δ_alg of phase retrieval from the outlier equation", "Mondelli–Montanari [MM17]", "0.5", f"{dalg:.4f}",
        report.within(dalg, 0.5, 0.01), "(tol 0.01 = bisection tolerance)"), "exact quadrature"))
    dmin = float(np.nanmin(Dn["delta_nn"])) if np.isfinite(Dn["delta_nn"]).any() else float("nan")
    rows.append(report.at_scale(report.Claim(
        "δ_NN > δ_alg", "[MW26], abstract", "δ_NN > 1/2", f"smallest δ_NN(t) in the table: {report.fmt(dmin)}",
        bool(dmin - 0.5 > 0) if report.finite(dmin) else None, "holds at every t computed"), f"{prof(Dn)}"))
    rows.append(report.at_scale(report.Claim(
        "δ_NN values of the paper", "[MW26]", "not available to us", report.fmt(dmin), None,
        "our finite-t values only (eq. ch3-dnn)"), f"{prof(Dn)}"))
    return rows


# --- benchmark ---------------------------------------------------------------------------------------------------
def hvp_floor(X: torch.Tensor, m: int, reps: int = 5) -> float:
    """The floor of one Hessian-vector product of :func:`hessian.hessian_matvec` on X [n, d] (float64) for one
    vector V [d, m], timed here with plain ``torch`` calls of its sizes: the two reads of X, XV and XᵀW (W [n, m]),
    best of ``reps``. Seconds per product."""
    dev = X.device
    n, d = X.shape
    g = torch.Generator(device="cpu").manual_seed(0)
    V = torch.randn(d, m, generator=g, dtype=X.dtype).to(dev)
    W = torch.randn(n, m, generator=g, dtype=X.dtype).to(dev)
    best = float("inf")
    for _ in range(reps):
        synchronize(dev)
        t0 = time.perf_counter()
        X @ V
        X.T @ W
        synchronize(dev)
        best = min(best, time.perf_counter() - t0)
    return best


def bench_eig(device="auto", quick=False) -> dict:
    """Lowest eigenpairs (k = 3) of H = (1/n) Σ D_i ⊗ x_i x_iᵀ at d = 4000, m = 4 (16 000 × 16 000), δ = 4,
    matrix-free implicitly restarted Lanczos (``hessian.lowest_eigpairs(method="lanczos")``; 2.4× faster than its
    LOBPCG at d = 1000 on 2 CPU cores), at the end of 5 GD steps (GeLU, y = tanh z²); ``quick`` uses d = 500.
    Floor: the number of Hessian-vector products the solver asked for (counted), each at the time of its two plain
    products with X (:func:`hvp_floor`, measured in the same run)."""
    dev = get_device(device)
    d, m, delta = (500, 4, 4.0) if quick else (4000, 4, 4.0)
    prob = mi.sample_problem(d, int(delta * d), 1, "pr_tanh", trials=1, device=dev, dtype=torch.float32, generator=0)
    g = mi.run_gd(prob, m, 4.0, 5, act="gelu", return_theta=True, generator=1)
    Th, X, y = g["theta"][5][0], prob.X[0][0], prob.y[0][0]
    calls = []
    matvec = hs.hessian_matvec

    def counted(*args, **kw):  # counts the vectors of each product the solver asks for
        v = args[6] if len(args) > 6 else kw["v"]
        calls.append(1 if v.dim() < 2 else v.shape[0])
        return matvec(*args, **kw)

    hs.hessian_matvec = counted
    try:
        synchronize(dev)
        t0 = time.perf_counter()
        w, V = hs.lowest_eigpairs(Th, X, y, "gelu", k=3, method="lanczos", tol=1e-5)
        synchronize(dev)
        wall = time.perf_counter() - t0
    finally:
        hs.hessian_matvec = matvec
    per = hvp_floor(X.double(), m)
    floor = sum(calls) * per
    return {"device": device_name(dev), "d": d, "m": m, "n": int(delta * d), "md": m * d, "wall_s": round(wall, 2),
            "method": "lanczos", "lowest": [round(float(x), 5) for x in w.cpu()], "hessian_vector_products": sum(calls),
            "floor_s_per_product": round(per, 5), "floor_s": round(floor, 2), "ratio_to_floor": round(wall / floor, 2),
            "floor_note": "per product: X V and X^T W in float64 with plain torch, measured in this run"}


BENCHMARKS = {"eig": bench_eig}
