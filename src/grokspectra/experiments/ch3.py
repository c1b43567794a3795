"""Chapter 3: hard-direction outliers of the GD Hessian and the threshold δ_NN (brief ``mw_theory.md`` §6–§7, §12).

Experiments:

* ``outliers``: for a Quad and a GeLU student, across δ on both sides of the transition, the lowest eigenpair of the
  exact GD Hessian against the outlier equation Φ_t(z) = E[ζζᵀ ⊗ G_t(I + S_t G_t/δ)⁻¹] − zI on three laws of the
  weights: the empirical D_i, the DMFT law with antithetic paths (hard overlap exactly 0, the d → ∞ law) and the
  DMFT law seeded with the finite-d hard overlap d^{-1/2}; plus the DMFT with plain sampling (brief R5).
* ``dnn``: δ_NN by bisection in δ (one DMFT per δ, antithetic) on the grid activation × width × link × init scale,
  at each step of ``dnn_times``; arrays for chapters 4–5.
* ``alg``: δ_alg = 1/2 of phase retrieval from the spectral method, in theory (m = 1, G = T(y)) and at finite d.
* ``linear``: the linearised-DMFT cross-check (brief §12.4, R7).

Benchmark ``eig``: lowest eigenpairs of H at d = 4000, m = 4 (matrix-free Lanczos).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from .. import dmft, hessian as hs, multiindex as mi, spectral as sp
from ..device import device_name, get_device, synchronize
from ..params import Param, Schema
from . import experiment

SECTION = "ch3_outlier"
SCHEMA = Schema(
    Param("profile", str, help="parameter profile"),
    Param("device", str, choices=("auto", "cpu", "cuda"), help="auto, cpu or cuda"),
    Param("quad_t", int, lo=1, hi=500, help="GD step of the Quad outlier comparison"),
    Param("gelu_t", int, lo=1, hi=500, help="GD step of the GeLU outlier comparison"),
    Param("out_d", int, lo=50, hi=20000, help="input dimension of the outlier comparison"),
    Param("out_N", int, lo=1000, hi=10**7, help="DMFT paths of the outlier comparison"),
    Param("quad_deltas", list, of=float, lo=0.5, hi=100.0, help="δ grid, Quad m=1, y=min(z²,6), η=0.1"),
    Param("gelu_deltas", list, of=float, lo=0.5, hi=100.0, help="δ grid, GeLU m=2, y=tanh z², η=2"),
    Param("dnn_acts", list, of=str, help="activations of the δ_NN table"),
    Param("dnn_ms", list, of=int, lo=1, hi=16, help="widths of the δ_NN table"),
    Param("dnn_links", list, of=str, help="links of the δ_NN table: pr_clip, pr_tanh, pr"),
    Param("dnn_scales", list, of=float, lo=0.01, hi=10.0, help="init scales: Q_0 = scale · I"),
    Param("dnn_times", list, of=int, lo=1, hi=1000, help="steps t at which δ_NN is evaluated"),
    Param("dnn_N", int, lo=1000, hi=10**7, help="DMFT paths per δ of the bisection"),
    Param("dnn_rtol", float, lo=1e-3, hi=0.5, help="relative width of the final δ bracket"),
    Param("eta_quad", float, lo=1e-3, hi=10.0, help="per-neuron step η/m for Quad"),
    Param("eta_gelu", float, lo=1e-3, hi=10.0, help="per-neuron step η/m for GeLU"),
    Param("alg_deltas", list, of=float, lo=0.1, hi=50.0, help="δ grid of the spectral method"),
    Param("alg_d", int, lo=50, hi=20000, help="dimension of the spectral method at finite d"),
    Param("alg_trials", int, lo=1, hi=100, help="trials per δ of the spectral method"),
    Param("lin_deltas", list, of=float, lo=0.5, hi=100.0, help="δ of the linearised-DMFT check"),
    Param("lin_T", int, lo=1, hi=500, help="steps of the linearised-DMFT check"),
    Param("lin_N", int, lo=1000, hi=10**7, help="DMFT paths of the linearised-DMFT check"),
    Param("seed", int, lo=0, hi=10**6, help="random seed"),
)
MODULES = ["grokspectra.multiindex", "grokspectra.dmft", "grokspectra.hessian", "grokspectra.spectral"]
STUDENTS = {"quad": dict(act="quad", m=1, eta=0.1, link="pr_clip"), "gelu": dict(act="gelu", m=2, eta=2.0, link="pr_tanh")}


def _even(n: int) -> int:
    return max(2, n - n % 2)


def _law(r, t, act, lk):
    law = r["law"][t]
    G = mi.per_sample_D(law["u"], law["y"], act).double().cpu()
    return G, law["z"][:, list(lk.hard)].double().cpu()


def _outlier_row(G, zeta, delta):
    o = sp.outlier(G, zeta, delta)
    return [o["root"] if o["exists"] else np.nan, o["overlap"] if o["exists"] else np.nan, o["edge"], o["phi_edge"]]


@experiment(SECTION, keys=["quad_t", "gelu_t", "out_d", "out_N", "quad_deltas", "gelu_deltas", "seed"])
def outliers(p, device):
    """Lowest eigenpair of the GD Hessian vs the outlier equation on the empirical law, the antithetic DMFT law, the
    DMFT law seeded with hard overlap d^{-1/2}, and (R5) the plain-sampling DMFT law."""
    d, N = p["out_d"], _even(p["out_N"])
    out = {}
    for name, st in STUDENTS.items():
        deltas, t = p[f"{name}_deltas"], p[f"{name}_t"]
        act, m, eta, lk = st["act"], st["m"], st["eta"], mi.link(st["link"])
        prob = mi.sample_problem(d, [int(round(dl * d)) for dl in deltas], 1, lk, trials=1, device=device,
                                 dtype=torch.float64, generator=p["seed"] + 1)
        g = mi.run_gd(prob, m, eta, t, act=act, keep=[t], generator=p["seed"] + 2)
        rows = {k: [] for k in ("gd", "emp", "anti", "seeded", "plain", "M")}
        for gi, dl in enumerate(deltas):
            X, y, Ts = prob.X[gi][0], prob.y[gi][0], prob.Theta_star[gi][0]
            Th = g["theta"][t][gi][0]
            w, V = torch.linalg.eigh(hs.hessian_dense(Th, X, y, act))
            ov = hs.overlap_with(V[:, :2].T, Ts).cpu().numpy()
            rows["gd"].append([float(w[0]), float(ov[0]), float(w[1]), float(ov[1])])
            De = hs.hessian_weights(Th, X, y, act).double().cpu()
            rows["emp"].append(_outlier_row(De, (X @ Ts).double().cpu(), dl))
            mt = []
            for tag, kw in (("anti", dict(antithetic=True)),
                            ("seeded", dict(antithetic=True, M0=[[d ** -0.5] * m])),
                            ("plain", dict(antithetic=False))):
                r = dmft.run_dmft(act, lk, dl, eta, t, N, m, keep=[t], device=device, generator=p["seed"] + 10 + gi, **kw)
                rows[tag].append(_outlier_row(*_law(r, t, act, lk), dl))
                mt.append(float(r["M"][t].abs().max()))
            mt.append(float(g["M"][gi, 0, t].abs().max()))
            rows["M"].append(mt)                                   # |M_t|: anti, seeded, plain, GD
        out[f"{name}_deltas"] = np.array(deltas)
        out[f"{name}_t"] = np.array(t)
        out.update({f"{name}_{k}": np.array(v) for k, v in rows.items()})
    return out


def _dnn_cell(act, m, link, scale, times, N, eta, rtol, device, seed):
    """δ_NN at each t of ``times`` for one cell; the DMFT run of each δ is shared by all t."""
    lk = mi.link(link)
    cache = {}

    def run(delta):
        key = round(delta, 12)
        if key not in cache:
            cache[key] = dmft.run_dmft(act, lk, delta, eta, max(times), _even(N), m, Q0=scale * np.eye(m),
                                       keep=times, device=device, generator=seed)
        return cache[key]

    res, z0zero = [], []
    for t in times:
        try:
            r = sp.delta_nn(lambda dl: _law(run(dl), t, act, lk), 2.0, 16.0, rtol=rtol, expand=5)
            res.append(r["delta_nn"])
            # the criterion is evaluated at z0 = min(0, edge): record whether z0 = 0 at the threshold (bulk ≥ 0)
            z0zero.append(float(r["z0s"][np.argmin(np.abs(r["deltas"] - r["hi"]))] == 0.0))
        except ValueError:
            res.append(np.nan)
            z0zero.append(np.nan)
    return res, z0zero, len(cache)


@experiment(SECTION, keys=["dnn_acts", "dnn_ms", "dnn_links", "dnn_scales", "dnn_times", "dnn_N", "dnn_rtol",
                           "eta_quad", "eta_gelu", "seed"])
def dnn(p, device):
    """δ_NN [act, m, link, scale, t] by bisection in δ with one antithetic DMFT per δ (brief §6.3)."""
    A, Ms, Ls, Ss, Ts = p["dnn_acts"], p["dnn_ms"], p["dnn_links"], p["dnn_scales"], p["dnn_times"]
    shape = (len(A), len(Ms), len(Ls), len(Ss), len(Ts))
    dnn_, z0, runs, wall = np.full(shape, np.nan), np.full(shape, np.nan), np.zeros(shape[:4]), np.zeros(shape[:4])
    for ia, act in enumerate(A):
        for im, m in enumerate(Ms):
            eta = p[f"eta_{act}"] * m
            for il, link in enumerate(Ls):
                for isc, s in enumerate(Ss):
                    t0 = time.perf_counter()
                    r, zz, n = _dnn_cell(act, m, link, s, Ts, p["dnn_N"], eta, p["dnn_rtol"], device, p["seed"] + 17)
                    dnn_[ia, im, il, isc], z0[ia, im, il, isc], runs[ia, im, il, isc] = r, zz, n
                    wall[ia, im, il, isc] = time.perf_counter() - t0
    return {"delta_nn": dnn_, "z0_is_zero": z0, "dmft_runs": runs, "wall_s": wall, "times": np.array(Ts),
            "scales": np.array(Ss), "ms": np.array(Ms)}


@experiment(SECTION, keys=["alg_deltas", "alg_d", "alg_trials", "seed"])
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


@experiment(SECTION, keys=["lin_deltas", "lin_T", "lin_N", "seed"])
def linear(p, device):
    """Linearised DMFT (brief §12.4, R7): Quad m = 1, y = min(z², 6), η = 0.1, antithetic, M_0 = 10⁻³."""
    Ms = []
    for dl in p["lin_deltas"]:
        r = dmft.run_dmft("quad", "pr_clip", dl, 0.1, p["lin_T"], _even(p["lin_N"]), 1, M0=[[1e-3]], device=device,
                          generator=p["seed"] + 31)
        Ms.append(r["M"][:, 0, 0].abs().cpu().numpy())
    return {"deltas": np.array(p["lin_deltas"]), "M": np.array(Ms)}


# --- benchmark ---------------------------------------------------------------------------------------------------
def bench_eig(device="auto", quick=False) -> dict:
    """Lowest eigenpairs (k = 3) of H = (1/n) Σ D_i ⊗ x_i x_iᵀ at d = 4000, m = 4 (16 000 × 16 000), δ = 4,
    matrix-free implicitly restarted Lanczos (``hessian.lowest_eigpairs(method="lanczos")``; 2.4× faster than its
    LOBPCG at d = 1000 on 2 CPU cores), at the end of 5 GD steps (GeLU, y = tanh z²); ``quick`` uses d = 500."""
    dev = get_device(device)
    d, m, delta = (500, 4, 4.0) if quick else (4000, 4, 4.0)
    prob = mi.sample_problem(d, int(delta * d), 1, "pr_tanh", trials=1, device=dev, dtype=torch.float32, generator=0)
    g = mi.run_gd(prob, m, 4.0, 5, act="gelu", return_theta=True, generator=1)
    Th, X, y = g["theta"][5][0], prob.X[0][0], prob.y[0][0]
    synchronize(dev)
    t0 = time.perf_counter()
    w, V = hs.lowest_eigpairs(Th, X, y, "gelu", k=3, method="lanczos", tol=1e-5)
    synchronize(dev)
    wall = time.perf_counter() - t0
    return {"device": device_name(dev), "d": d, "m": m, "n": int(delta * d), "md": m * d, "wall_s": round(wall, 2),
            "method": "lanczos", "lowest": [round(float(x), 5) for x in w.cpu()]}


BENCHMARKS = {"eig": bench_eig}
