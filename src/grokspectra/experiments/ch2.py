"""Chapter 2: the bulk of the GD Hessian against the matrix Marchenko–Pastur law (brief ``mw_theory.md`` §5).

Experiment ``bulk``: GD from random init at several δ; at the steps ``times`` the full Hessian spectrum (dense, all
m·d eigenvalues), its bulk law S_t computed from two laws of the Hessian weights — the empirical D_i of the same GD
run and the DMFT law G_t (antithetic paths, brief §3.3) — their left edges (end of the real branch, and the
square-root fit of the density, brief §5.4), and the hard outlier equation as a check that no outlier is predicted
where none is seen. Experiment ``caveat``: the same for y = z², whose weights are unbounded below (brief §5.5): the
edge of the sample law keeps moving with the number of samples, and the lowest GD eigenvectors are localised on
single training examples.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import dmft, hessian as hs, multiindex as mi, spectral as sp
from ..params import Param, Schema
from . import experiment

SECTION = "ch2_bulk"
SCHEMA = Schema(
    Param("profile", str, help="parameter profile"),
    Param("device", str, choices=("auto", "cpu", "cuda"), help="auto, cpu or cuda"),
    Param("act", str, choices=("gelu", "quad", "tanh"), help="activation σ"),
    Param("m", int, lo=1, hi=8, help="hidden neurons"),
    Param("link", str, choices=("pr_tanh", "pr_clip"), help="bounded phase-retrieval link"),
    Param("eta", float, lo=1e-3, hi=10.0, help="GD step η"),
    Param("deltas", list, of=float, lo=0.5, hi=50.0, help="sample ratios δ = n/d"),
    Param("times", list, of=int, lo=1, hi=200, help="GD steps t at which the Hessian is analysed"),
    Param("d", int, lo=50, hi=20000, help="input dimension of the GD runs"),
    Param("N", int, lo=1000, hi=10**7, help="DMFT Monte Carlo paths"),
    Param("N_plot", int, lo=200, hi=10**6, help="samples of each law used for the density curves"),
    Param("n_x", int, lo=10, hi=2000, help="grid points of the density curves"),
    Param("N_caveat", list, of=int, lo=100, hi=10**7, help="law sizes for the y = z² edge drift"),
    Param("seed", int, lo=0, hi=10**6, help="random seed"),
)
MODULES = ["grokspectra.multiindex", "grokspectra.dmft", "grokspectra.hessian", "grokspectra.spectral"]


def _even(n: int) -> int:
    return max(2, n - n % 2)


def _localisation(V: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """max_i ‖Vᵀx_i‖²/‖x_i‖² for eigenvectors V [k, d, m] (unit norm): ≈ 1 for a mode localised on one sample,
    O(m·log n/d) for a delocalised bulk vector."""
    P = torch.einsum("nd,kdm->knm", X, V)
    return ((P ** 2).sum(-1) / (X ** 2).sum(-1)[None]).max(-1).values


def _gd_hessians(p, device, link, deltas, times, seed):
    """GD (one trial per δ, float64) and, at each t in ``times``: all eigenvalues of H, the hard overlap and the
    localisation of the 3 lowest eigenvectors, and the empirical Hessian weights D_i with ζ_i = ⟨x_i, θ*⟩."""
    d, m = p["d"], p["m"]
    prob = mi.sample_problem(d, [int(round(dl * d)) for dl in deltas], 1, link, trials=1, device=device,
                             dtype=torch.float64, generator=seed)
    g = mi.run_gd(prob, m, p["eta"], max(times), act=p["act"], keep=times, generator=seed + 1)
    out = {"eigs": [], "hard": [], "loc": [], "D": [], "zeta": [], "train": g["train"][:, 0].cpu().numpy(),
           "test": g["test"][:, 0].cpu().numpy()}
    for gi in range(len(deltas)):
        X, y, Ts = prob.X[gi][0], prob.y[gi][0], prob.Theta_star[gi][0]
        eg, hd, lc, Ds = [], [], [], []
        for t in times:
            Th = g["theta"][t][gi][0]
            w, V = torch.linalg.eigh(hs.hessian_dense(Th, X, y, p["act"]))
            Vl = hs.vec_to_mat(V[:, :3].T, d, m)                      # [3, d, m]
            eg.append(w.cpu().numpy())
            hd.append(hs.overlap_with(V[:, :3].T, Ts).cpu().numpy())
            lc.append(_localisation(Vl, X).cpu().numpy())
            Ds.append(hs.hessian_weights(Th, X, y, p["act"]))
        out["eigs"].append(eg)
        out["hard"].append(hd)
        out["loc"].append(lc)
        out["D"].append(Ds)
        out["zeta"].append((X @ Ts)[:, 0])
    return out


def _law_summary(G, zeta, delta, xs, n_plot):
    """Edges (real branch, density fit), outlier prediction and density curve of one law."""
    o = sp.outlier(G, zeta, delta)
    try:
        e_dens = sp.left_edge(G[:n_plot], delta, method="density")
    except ValueError:
        e_dens = float("nan")
    rho = sp.bulk_density(G[:n_plot], delta, xs)
    return o, e_dens, rho


@experiment(SECTION, keys=["act", "m", "link", "eta", "deltas", "times", "d", "N", "N_plot", "n_x", "seed"])
def bulk(p, device):
    """R2 set-up: empirical Hessian spectra of GD vs the bulk law from the empirical D_i and from the DMFT law G_t."""
    deltas, times = p["deltas"], p["times"]
    gd = _gd_hessians(p, device, p["link"], deltas, times, p["seed"])
    nd, nt = len(deltas), len(times)
    res = {k: np.full((nd, nt), np.nan) for k in
           ("edge_emp", "edge_dmft", "edge_dens_emp", "edge_dens_dmft", "out_emp", "ov_emp", "out_dmft", "ov_dmft",
            "phi_emp", "phi_dmft", "dmft_hard")}
    rho_emp = np.zeros((nd, nt, p["n_x"]))
    rho_dmft = np.zeros((nd, nt, p["n_x"]))
    xs_all = np.zeros((nd, nt, p["n_x"]))
    dm_train = np.zeros((nd, max(times) + 1))
    lk = mi.link(p["link"])
    for i, dl in enumerate(deltas):
        r = dmft.run_dmft(p["act"], lk, dl, p["eta"], max(times), _even(p["N"]), p["m"], keep=times, device=device,
                          generator=p["seed"] + 100 + i)
        dm_train[i] = r["train"].cpu().numpy()
        for j, t in enumerate(times):
            law = r["law"][t]
            Gd = mi.per_sample_D(law["u"], law["y"], p["act"]).double().cpu()
            zd = law["z"][:, list(lk.hard)].double().cpu()
            ev = gd["eigs"][i][j]
            lo, hi = float(ev[0]), float(ev[-1])
            pad = 0.08 * (hi - lo)
            xs = np.linspace(lo - pad, hi + pad, p["n_x"])
            xs_all[i, j] = xs
            De, ze = gd["D"][i][j].double().cpu(), gd["zeta"][i].double().cpu()
            for tag, G, z, rho in (("emp", De, ze, rho_emp), ("dmft", Gd, zd, rho_dmft)):
                o, e_dens, rr = _law_summary(G, z, dl, xs, p["N_plot"])
                res[f"edge_{tag}"][i, j] = o["edge"]
                res[f"edge_dens_{tag}"][i, j] = e_dens
                res[f"out_{tag}"][i, j] = o["root"] if o["exists"] else np.nan
                res[f"ov_{tag}"][i, j] = o["overlap"] if o["exists"] else np.nan
                res[f"phi_{tag}"][i, j] = o["phi_edge"]
                rho[i, j] = rr
            res["dmft_hard"][i, j] = float(r["M"][t].abs().max())
    out = {"deltas": np.array(deltas), "times": np.array(times), "xs": xs_all, "rho_emp": rho_emp,
           "rho_dmft": rho_dmft, "gd_train": gd["train"], "gd_test": gd["test"], "dmft_train": dm_train,
           "eigs": np.array(gd["eigs"]), "hard": np.array(gd["hard"]), "loc": np.array(gd["loc"])}
    out.update(res)
    return out


@experiment(SECTION, keys=["act", "m", "eta", "deltas", "times", "d", "N_caveat", "seed"])
def caveat(p, device):
    """y = z² (brief §5.5) at the largest δ and last t: GD spectrum, localisation of its lowest modes, and the left
    edge of the law of D(u; y) as the law's sample size grows (DMFT law and the empirical D_i, sub-sampled)."""
    dl, t = max(p["deltas"]), max(p["times"])
    gd = _gd_hessians(p, device, "pr", [dl], [t], p["seed"] + 7)
    Nmax = _even(max(p["N_caveat"]))
    r = dmft.run_dmft(p["act"], "pr", dl, p["eta"], t, Nmax, p["m"], keep=[t], device=device,
                      generator=p["seed"] + 300)
    law = r["law"][t]
    Gd = mi.per_sample_D(law["u"], law["y"], p["act"]).double().cpu()
    perm = torch.randperm(Nmax, generator=torch.Generator().manual_seed(p["seed"]))
    Gd = Gd[perm]
    De = gd["D"][0][0].double().cpu()
    edges = []
    for N in p["N_caveat"]:
        edges.append(sp.real_axis_edge(Gd[:N], dl))
    n = De.shape[0]
    sub = [max(50, n // 16), max(100, n // 4), n]
    edges_emp = [sp.real_axis_edge(De[:k], dl) for k in sub]
    Gb = None
    # the same run with the bounded link for comparison of the localisation
    gb = _gd_hessians(p, device, "pr_tanh", [dl], [t], p["seed"] + 7)
    Gb = gb["D"][0][0].double().cpu()
    return {"delta": np.array(dl), "t": np.array(t), "eigs": gd["eigs"][0][0], "loc": gd["loc"][0][0],
            "hard": gd["hard"][0][0], "N": np.array(p["N_caveat"]), "edges_dmft": np.array(edges),
            "n_sub": np.array(sub), "edges_emp": np.array(edges_emp),
            "Dmin_emp": float(torch.linalg.eigvalsh(De)[:, 0].min()), "Dmin_bounded": float(torch.linalg.eigvalsh(Gb)[:, 0].min()),
            "eigs_bounded": gb["eigs"][0][0], "loc_bounded": gb["loc"][0][0],
            "edge_bounded": sp.real_axis_edge(Gb, dl)}
