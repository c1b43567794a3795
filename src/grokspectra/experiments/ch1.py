"""Chapter 1: the two-layer GD engine against the discrete-time DMFT for O(1) steps (the book's
reconstruction of Montanari–Wang, arXiv:2602.01434; derivation in the theory appendix).

Experiments: ``trajectories`` (DMFT with and without memory vs GD at several d, from a warm start) and ``easy_hard``
(random init: phase retrieval's overlap stays O(d^{-1/2}); the staircase's easy direction is learned).
Benchmarks ``gd`` and ``dmft`` print measured time beside a memory-bandwidth floor.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from .. import dmft, multiindex as mi
from ..device import device_name, get_device, synchronize
from ..params import Param, Schema
from . import costs, experiment

SECTION = "ch1_dmft"
SCHEMA = Schema(
    Param("profile", str, help="parameter profile"),
    Param("device", str, choices=("auto", "cpu", "cuda"), help="auto, cpu or cuda"),
    Param("act", str, choices=("gelu", "quad", "relu", "tanh"), help="activation σ"),
    Param("m", int, lo=1, hi=64, help="hidden neurons"),
    Param("delta", float, lo=0.1, hi=100.0, help="sample ratio δ = n/d"),
    Param("eta", float, lo=1e-4, hi=100.0, help="GD step size η"),
    Param("M0", list, of=float, lo=-10.0, hi=10.0, help="initial overlaps M_0 (one per neuron; k = 1)"),
    Param("T", int, lo=6, hi=200, help="GD steps (≥ 6: the comparison is read at t = 6)"),
    Param("ds", list, of=int, lo=50, hi=100000, help="dimensions d for GD vs DMFT"),
    Param("seeds", int, lo=2, hi=1000, help="GD trials per d"),
    Param("N", int, lo=1000, hi=10**7, help="DMFT Monte Carlo paths (all replicas together)"),
    Param("reps", int, lo=2, hi=64, help="independent DMFT replicas (for its Monte Carlo error bars)"),
    Param("T_eh", int, lo=1, hi=200, help="steps of the easy-vs-hard runs (random init)"),
    Param("ds_eh", list, of=int, lo=50, hi=100000, help="dimensions d of the easy-vs-hard GD runs"),
    Param("N_eh", int, lo=1000, hi=10**7, help="DMFT paths of the easy-vs-hard runs"),
)


def _even(n: int) -> int:
    return max(2, n - n % 2)


KEYS = ("M", "Q", "train", "test")


def _traj_units(p: dict) -> list[dict]:
    """DMFT replicas with memory (``reps``) and without (2), each with its own path seed, and one GD unit per d."""
    if len(p["M0"]) != p["m"]:
        raise ValueError(f"M0 has {len(p['M0'])} entries but m = {p['m']}")
    base = {k: p[k] for k in ("act", "m", "delta", "eta", "T")} | {"M0": [p["M0"]]}
    units = [{**base, "kind": "dmft", "tag": tag, "memory": mem, "N": _even(p["N"] // reps), "seed": s0 + r}
             for tag, mem, reps, s0 in (("dm", True, p["reps"], 1000), ("nm", False, 2, 2000)) for r in range(reps)]
    units += [{**base, "kind": "gd", "d": d, "trials": p["seeds"], "data_seed": 10 + i, "init_seed": 100 + i}
              for i, d in enumerate(p["ds"])]
    return units


def _traj_reduce(p: dict, units: list[dict], results: list[dict]) -> dict:
    out, reps = {}, {}
    for u, r in zip(units, results):
        if u["kind"] == "dmft":
            reps.setdefault(u["tag"], []).append(r)
        else:
            out.update({f"gd{u['d']}_{k}": r[k] for k in KEYS})
    for tag, rs in reps.items():
        out.update({f"{tag}_{k}": np.stack([r[k] for r in rs]) for k in KEYS})
    return out


def _traj_cost(u: dict) -> float:
    return u["N"] * u["T"] ** 2 * u["m"] / 4e3 if u["kind"] == "dmft" else u["trials"] * u["delta"] * u["d"] ** 2 * u["T"] / 2e5


def _shrink(u: dict) -> dict:
    return {**u, "N": min(u.get("N", 0), 4000)} if u["kind"] == "dmft" else {**u, "d": min(u["d"], 200)}


@experiment(SECTION, keys=["act", "m", "delta", "eta", "M0", "T", "ds", "seeds", "N", "reps"], units=_traj_units,
            reduce=_traj_reduce, cost=_traj_cost, shrink=_shrink)
def trajectories(u, device):
    """Warm start M_0 on y = z²: one DMFT replica (with or without the memory terms) or GD at one d with every
    trial; the chapter compares their overlaps, norms and risks."""
    if u["kind"] == "dmft":
        o = dmft.run_dmft_factored(u["act"], "pr", u["delta"], u["eta"], u["T"], u["N"], u["m"], M0=u["M0"],
                          memory=u["memory"], antithetic=True, device=device, generator=u["seed"])
        return {k: o[k] for k in KEYS}
    d = u["d"]
    prob = mi.sample_problem(d, int(round(u["delta"] * d)), 1, "pr", trials=u["trials"], device=device,
                             dtype=torch.float32, generator=u["data_seed"])
    g = mi.run_gd(prob, u["m"], u["eta"], u["T"], act=u["act"], M0=u["M0"], generator=u["init_seed"])
    return {k: g[k] for k in KEYS}


@trajectories.peak_memory
def _traj_memory(u: dict) -> float | None:
    """A DMFT unit: one run of N paths to T, with or without its memory terms (GD units: no estimate)."""
    return costs.dmft_bytes(u["N"], u["T"], u["m"], memory=u["memory"]) if u["kind"] == "dmft" else None


def _eh_units(p: dict) -> list[dict]:
    """Per link (phase retrieval, staircase): antithetic DMFT, (phase retrieval only) plain-sampling DMFT, and GD
    at every d of ``ds_eh``."""
    base = {k: p[k] for k in ("act", "m", "delta", "eta")} | {"T": p["T_eh"]}
    units = []
    for tag, lk in (("pr", "pr"), ("st", "staircase")):
        units.append({**base, "kind": "dmft", "tag": tag, "link": lk, "N": _even(p["N_eh"]), "antithetic": True})
        if tag == "pr":
            units.append({**base, "kind": "dmft", "tag": tag, "link": lk, "N": _even(p["N_eh"]), "antithetic": False})
        units += [{**base, "kind": "gd", "tag": tag, "link": lk, "d": d, "trials": p["seeds"], "data_seed": 20 + i,
                   "init_seed": 200 + i} for i, d in enumerate(p["ds_eh"])]
    return units


def _eh_reduce(p: dict, units: list[dict], results: list[dict]) -> dict:
    out = {}
    for u, r in zip(units, results):
        t = u["tag"]
        if u["kind"] == "gd":
            out.update({f"{t}_gd{u['d']}_{k}": r[k] for k in ("M", "train", "test")})
        elif u["antithetic"]:
            out.update({f"{t}_dm_M": r["M"], f"{t}_dm_train": r["train"], f"{t}_dm_test": r["test"]})
        else:
            out[f"{t}_plain_M"] = r["M"]
    return out


@experiment(SECTION, keys=["act", "m", "delta", "eta", "T_eh", "ds_eh", "seeds", "N_eh"], units=_eh_units,
            reduce=_eh_reduce, cost=_traj_cost, shrink=_shrink)
def easy_hard(u, device):
    """Random init. Phase retrieval: DMFT with antithetic paths (M ≡ 0) or plain paths (a spurious M of order
    N^{-1/2}), GD overlaps at each d. Staircase y = z₁ + z₂²: DMFT (antithetic in z₂) and GD overlaps with both
    latent directions. One unit is one DMFT or one GD at one d."""
    if u["kind"] == "dmft":
        a = dmft.run_dmft_factored(u["act"], u["link"], u["delta"], u["eta"], u["T"], u["N"], u["m"],
                          antithetic=u["antithetic"], device=device, generator=3000)
        return {k: a[k] for k in ("M", "train", "test")}
    d = u["d"]
    prob = mi.sample_problem(d, int(round(u["delta"] * d)), mi.link(u["link"]).k, u["link"], trials=u["trials"],
                             device=device, dtype=torch.float32, generator=u["data_seed"])
    g = mi.run_gd(prob, u["m"], u["eta"], u["T"], act=u["act"], generator=u["init_seed"])
    return {k: g[k] for k in ("M", "train", "test")}


@easy_hard.peak_memory
def _eh_memory(u: dict) -> float | None:
    """A DMFT unit: one run of N paths to T (GD units: no estimate)."""
    return costs.dmft_bytes(u["N"], u["T"], u["m"]) if u["kind"] == "dmft" else None


# --- benchmarks ------------------------------------------------------------------------------------------------------
NOMINAL_BW = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}


def bandwidth(device: torch.device, mbytes: int = 256) -> float:
    """Measured device memory bandwidth (bytes/s) of a large copy (read + write), best of 5."""
    x = torch.empty(mbytes * 2**20 // 4, device=device, dtype=torch.float32).uniform_()
    y = torch.zeros_like(x)  # touched once, so the timed copies pay no page faults
    best = float("inf")
    for _ in range(5):
        synchronize(device)
        t0 = time.perf_counter()
        y.copy_(x)
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * x.numel() * 4 / best


def _floor(nbytes: float, device: torch.device, bw: float) -> dict:
    out = {"bytes": nbytes, "bandwidth_measured_GBs": bw / 1e9, "floor_s_measured_bw": nbytes / bw}
    name = device_name(device)
    for key, nominal in NOMINAL_BW.items():
        if key in name:
            out["bandwidth_nominal_GBs"] = nominal / 1e9
            out["floor_s_nominal_bw"] = nbytes / nominal
    return out


def bench_gd(device="auto", quick=False) -> dict:
    """GD sweep (20 δ × 20 trials × d = 2000 × 1000 steps; ``quick``: 4 δ × 4 trials × d = 400 × 40 steps).
    Floor: every step reads each X twice (XΘ and XᵀF), 2 · T · Σ_δ trials · n · d · 4 bytes at the bandwidth."""
    dev = get_device(device)
    d, deltas, trials, T = (1000, [1.0, 2.0, 3.0, 4.0], 4, 20) if quick else (2000, np.linspace(1, 8, 20).tolist(), 20, 1000)
    ns = [int(round(dl * d)) for dl in deltas]
    prob = mi.sample_problem(d, ns, 1, "pr", trials=trials, device=dev, dtype=torch.float32, generator=0)
    mi.run_gd(prob, 2, 2.0, 2, n_test=1024, generator=1)  # warm-up
    synchronize(dev)
    t0 = time.perf_counter()
    out = mi.run_gd(prob, 2, 2.0, T, n_test=1024, generator=1)
    synchronize(dev)
    wall = time.perf_counter() - t0
    assert torch.isfinite(out["train"]).all()
    nbytes = 2.0 * T * sum(trials * n * d * 4 for n in ns)
    res = {"bench": "gd", "device": device_name(dev), "d": d, "n_deltas": len(ns), "trials": trials, "steps": T,
           "time_s": wall}
    res.update(_floor(nbytes, dev, bandwidth(dev)))
    res["ratio_to_floor"] = wall / res["floor_s_measured_bw"]
    return res


def bench_dmft(device="auto", quick=False, *, T: int | None = None, N: int | None = None, m: int | None = None) -> dict:
    """DMFT (:func:`grokspectra.dmft.run_dmft_factored`) with T = 50, N = 10⁵ paths, m = 2 (``quick``: T = 10,
    N = 2·10⁴; ``T``, ``N``, ``m`` override either, as ``bench dmft --size T=120``: the per-step overhead weighs
    less against the O(T²) recursion as T grows).
    Memory-bound: the floor is the
    traffic the response recursion needs, at the bandwidth measured in this run. At step t it reads χ(p, s) for
    s ≤ p < t (t(t+1)/2 blocks of N·m² float64 values), writes χ(t, s) for s ≤ t and reads them back for R_F
    (2(t+1) blocks). Timed twice: a first run in fresh memory (``time_cold_s``: it pays the page faults of first
    touch) and a run inside :func:`grokspectra.dmft.reuse_memory` after another of the same size (``time_s``), as a
    sweep of many runs does."""
    dev = get_device(device)
    T0, N0, m0 = (10, 20000, 2) if quick else (50, 100000, 2)
    T, N, m = T or T0, N or N0, m or m0
    args = ("gelu", "pr", 3.0, 2.0)
    M0 = [([0.5, 0.3] + [0.2] * m)[:m]]  # the first-layer overlaps at t = 0, one hard direction
    dmft.run_dmft_factored(*args, 2, N, m, M0=M0, device=dev, generator=0)  # warm-up
    synchronize(dev)
    t0 = time.perf_counter()
    dmft.run_dmft_factored(*args, T, N, m, M0=M0, device=dev, generator=0)
    synchronize(dev)
    cold = time.perf_counter() - t0
    with dmft.reuse_memory():
        dmft.run_dmft_factored(*args, T, N, m, M0=M0, device=dev, generator=1)
        synchronize(dev)
        t0 = time.perf_counter()
        out = dmft.run_dmft_factored(*args, T, N, m, M0=M0, device=dev, generator=0)
        synchronize(dev)
        wall = time.perf_counter() - t0
    assert torch.isfinite(out["train"]).all()
    nbytes = 8.0 * sum((t * (t + 1) // 2 + 2 * (t + 1)) * N * m * m for t in range(1, T + 1))
    res = {"bench": "dmft", "device": device_name(dev), "T": T, "N": N, "m": m, "time_s": wall,
           "time_cold_s": cold, "M_T": out["M"][-1].flatten().tolist()}
    res.update(_floor(nbytes, dev, bandwidth(dev)))
    res["ratio_to_floor"] = wall / res["floor_s_measured_bw"]
    return res


BENCHMARKS = {"gd": bench_gd, "dmft": bench_dmft}


# --- helpers for the notebook ----------------------------------------------------------------------------------------
def rms_gap(gd: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """Root-mean-square distance of single GD runs [seeds, ...] from the DMFT value [...] (averaged over the trailing
    entries), and its standard error by the delta method over seeds."""
    sq = ((gd - ref) ** 2).reshape(gd.shape[0], -1).mean(1)
    r = math.sqrt(sq.mean())
    se = sq.std(ddof=1) / math.sqrt(len(sq)) / (2 * r) if r > 0 else float("nan")
    return r, se


def loglog_slope(x, y, w=None) -> tuple[float, float]:
    """Least-squares slope of log y on log x (weights ``w`` = 1/σ² of log y), with its standard error."""
    X, Y = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    w = np.ones_like(X) if w is None else np.asarray(w, float)
    A = np.stack([np.ones_like(X), X], 1)
    cov = np.linalg.inv(A.T @ (A * w[:, None]))
    beta = cov @ A.T @ (w * Y)
    resid = Y - A @ beta
    dof = max(len(X) - 2, 1)
    s2 = float((w * resid ** 2).sum() / dof) if len(X) > 2 else 1.0
    return float(beta[1]), float(math.sqrt(cov[1, 1] * max(s2, 1.0)))


# --- the chapter's analysis: observables, figures and the claims table (used by the notebook; tested) --------------
OBS_LABELS = ["$M_t$ (neuron 1)", "$M_t$ (neuron 2)", "$Q_t$ (1,1)", "$Q_t$ (2,2)", "train risk", "test risk"]
T_READ = 6  # the step at which the chapter reads its numbers


def obs(M: np.ndarray, Q: np.ndarray, tr: np.ndarray, te: np.ndarray) -> np.ndarray:
    """[..., T+1, 6]: the two overlaps of M_t (first latent direction), diag Q_t, train and test risk."""
    return np.concatenate([M[..., 0, :], np.diagonal(Q, axis1=-2, axis2=-1), tr[..., None], te[..., None]], -1)


def mean_se(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean over the first axis and its standard error."""
    return x.mean(0), x.std(0, ddof=1) / math.sqrt(x.shape[0])


def traj_summary(res) -> dict:
    """The trajectories result as observables: DMFT (with and without memory) and GD at each d, and the gaps of
    single GD runs from the DMFT with their log–log slope in d."""
    p = res.meta["params"]
    dlist = [int(d) for d in p["ds"]]
    dm = obs(res["dm_M"], res["dm_Q"], res["dm_train"], res["dm_test"])
    nm = obs(res["nm_M"], res["nm_Q"], res["nm_train"], res["nm_test"])
    gd = {d: obs(res[f"gd{d}_M"], res[f"gd{d}_Q"], res[f"gd{d}_train"], res[f"gd{d}_test"]) for d in dlist}
    dm_mu, _ = mean_se(dm)
    gaps = np.array([rms_gap(gd[d][:, 1:, :4], dm_mu[1:, :4]) for d in dlist])  # M and Q entries, t >= 1
    slope, slope_se = loglog_slope(dlist, gaps[:, 0], w=(gaps[:, 0] / gaps[:, 1]) ** 2)
    return {"T": int(p["T"]), "ds": dlist, "dmax": dlist[-1], "seeds": int(p["seeds"]), "N": int(p["N"]),
            "reps": int(p["reps"]), "dm": dm, "nm": nm, "gd": gd, "gaps": gaps, "slope": slope, "slope_se": slope_se}


def z_score(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|mean a − mean b| in units of their combined standard error, per entry ([runs, ...] each)."""
    (ma, sa), (mb, sb) = mean_se(a), mean_se(b)
    return np.abs(ma - mb) / np.sqrt(sa ** 2 + sb ** 2)


def fig_traj(ts: dict):
    """DMFT against GD for the six observables (DMFT band ±2 SE over replicas, GD ±2 SE over trials)."""
    import matplotlib.pyplot as plt

    from .. import plotting

    t = np.arange(ts["T"] + 1)
    dm_mu, dm_se = mean_se(ts["dm"])
    fig, axes = plt.subplots(2, 3, figsize=(7.2, 5.2))
    for j, ax in enumerate(axes.flat):
        for i, d in enumerate(ts["ds"][:-1]):
            ax.plot(t, ts["gd"][d].mean(0)[:, j], color=plotting.CYCLE[1 + i], alpha=0.6, lw=1, label=f"GD $d$={d}")
        mu, se = mean_se(ts["gd"][ts["dmax"]])
        ax.errorbar(t, mu[:, j], yerr=2 * se[:, j], fmt="o", ms=3, color=plotting.COLORS["grok"],
                    label=f"GD $d$={ts['dmax']}")
        ax.plot(t, dm_mu[:, j], color="k", label="DMFT")
        ax.fill_between(t, dm_mu[:, j] - 2 * dm_se[:, j], dm_mu[:, j] + 2 * dm_se[:, j], color="k", alpha=0.2, lw=0)
        ax.set_title(OBS_LABELS[j])
        ax.set_xlabel("GD step $t$")
        ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels))
    return fig


def fig_gap(ts: dict):
    """RMS distance of single GD runs from the DMFT against d, with the d^(-1/2) reference."""
    import matplotlib.pyplot as plt

    from .. import plotting

    dl, gaps = ts["ds"], ts["gaps"]
    fig, ax = plt.subplots(figsize=(5, 3.4))
    ax.errorbar(dl, gaps[:, 0], yerr=2 * gaps[:, 1], fmt="o", color=plotting.COLORS["grok"], label="GD runs vs DMFT")
    ax.plot(dl, gaps[0, 0] * (np.array(dl) / dl[0]) ** -0.5, "k--", lw=1, label="$\\propto d^{-1/2}$")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(dl, [str(d) for d in dl])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set(xlabel="$d$", ylabel="RMS distance of $(M_t, Q_t)$")
    ax.legend()
    return fig


def fig_memory(ts: dict):
    """GD against the DMFT with and without its memory terms: M_t, Q_t(1,1) and the train risk."""
    import matplotlib.pyplot as plt

    from .. import plotting

    t = np.arange(ts["T"] + 1)
    mu, se = mean_se(ts["gd"][ts["dmax"]])
    fig, axes = plt.subplots(1, 3, figsize=(7.2, 3.0))
    for ax, j in zip(axes, [0, 2, 4]):
        ax.errorbar(t, mu[:, j], yerr=2 * se[:, j], fmt="o", ms=3, color=plotting.COLORS["grok"],
                    label=f"GD $d$={ts['dmax']}")
        ax.plot(t, ts["dm"].mean(0)[:, j], color="k", label="DMFT")
        ax.plot(t, ts["nm"].mean(0)[:, j], color=plotting.COLORS["relu"], ls="--", label="DMFT, memory off")
        ax.set_title(OBS_LABELS[j])
        ax.set_xlabel("GD step $t$")
        ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncol=3)
    return fig


def easy_hard_summary(res) -> dict:
    """Hard and easy overlaps of the random-initialisation runs and their scaling with d."""
    p = res.meta["params"]
    Te, deh = int(p["T_eh"]), [int(d) for d in p["ds_eh"]]

    def hard_rms(key):
        return np.array([rms_gap(res[f"{key}{d}_M"][:, Te, -1, :], 0.0) for d in deh])

    pr_h, st_h = hard_rms("pr_gd"), hard_rms("st_gd")
    Md = res["st_dm_M"]
    return {"T": Te, "ds": deh, "N": int(p["N_eh"]),
            "pr_slope": loglog_slope(deh, pr_h[:, 0], w=(pr_h[:, 0] / pr_h[:, 1]) ** 2),
            "st_slope": loglog_slope(deh, st_h[:, 0], w=(st_h[:, 0] / st_h[:, 1]) ** 2),
            "easy": float(np.sqrt((Md[Te, 0, :] ** 2).mean())), "hard_dm": float(np.abs(Md[:, 1]).max()),
            "anti": float(np.abs(res["pr_dm_M"]).max()), "plain": float(np.abs(res["pr_plain_M"]).max()),
            "gap": float(res["st_dm_test"][Te] - res["st_dm_train"][Te])}


def fig_easy_hard(res):
    """Random initialisation: phase retrieval's hard overlap ×√d, the staircase's overlaps and its risks."""
    import matplotlib.pyplot as plt

    from .. import plotting

    p = res.meta["params"]
    Te, deh = int(p["T_eh"]), [int(d) for d in p["ds_eh"]]
    t = np.arange(Te + 1)
    fig, axes = plt.subplots(1, 3, figsize=(7.2, 3.2))
    ax = axes[0]
    for i, d in enumerate(deh):
        hard = np.sqrt(d) * np.sqrt((res[f"pr_gd{d}_M"][:, :, 0, :] ** 2).mean(-1))
        plotting.band(ax, t, hard, plotting.CYCLE[1 + i], label=f"GD $d$={d}")
    ax.plot(t, np.sqrt(deh[-1]) * np.abs(res["pr_plain_M"][:, 0, :]).max(-1), color=plotting.COLORS["accent"],
            ls=":", label="DMFT, plain")
    ax.plot(t, np.abs(res["pr_dm_M"][:, 0, :]).max(-1), color="k", label="DMFT, antithetic")
    ax.set_title("(a) $\\sqrt{d}\\,|M_t|$")
    ax.legend(fontsize=9)
    ax = axes[1]
    for i, d in enumerate(deh):
        M = res[f"st_gd{d}_M"]
        plotting.band(ax, t, np.sqrt((M[:, :, 0, :] ** 2).mean(-1)), plotting.CYCLE[1 + i])
        plotting.band(ax, t, np.sqrt((M[:, :, 1, :] ** 2).mean(-1)), plotting.CYCLE[1 + i], ls="--")
    Md = res["st_dm_M"]
    ax.plot(t, np.sqrt((Md[:, 0, :] ** 2).mean(-1)), "k", label="easy")
    ax.plot(t, np.sqrt((Md[:, 1, :] ** 2).mean(-1)), "k--", label="hard")
    ax.set_title("(b) overlaps")
    ax.legend()
    ax = axes[2]
    d = deh[-1]
    plotting.band(ax, t, res[f"st_gd{d}_train"], plotting.COLORS["relu"], label="train")
    plotting.band(ax, t, res[f"st_gd{d}_test"], plotting.COLORS["grok"], label="test")
    ax.plot(t, res["st_dm_train"], "k", lw=1, label="DMFT")
    ax.plot(t, res["st_dm_test"], "k", lw=1)
    ax.set_title("(c) risks")
    ax.legend()
    for ax in axes:
        ax.set_xlabel("GD step $t$")
    return fig


def claims(traj, eh) -> list:
    """The closing table. The paper publishes no number for this set-up, so every row compares two computations of
    this book (the DMFT against gradient descent, or a scaling law against its prediction); tolerances as stated
    in the chapter: three combined standard errors for DMFT against GD, two standard errors for slopes."""
    from ..report import Claim, at_scale, fmt, fmt_pm

    ts = traj_summary(traj)
    es = easy_hard_summary(eh)
    t6 = T_READ
    g, dm, nm = ts["gd"][ts["dmax"]], ts["dm"], ts["nm"]
    z = z_score(g[:, t6], dm[:, t6])
    z_nm = z_score(g[:, t6], nm[:, t6])
    (gm, gs), (dmu, dse) = mean_se(g[:, t6]), mean_se(dm[:, t6])
    scale = ({"ci": "CI", "paper": "paper"}.get(traj.meta.get("profile"), str(traj.meta.get("profile")))
             + f": $d$ ≤ {ts['dmax']}")
    src = "this book: DMFT vs GD"
    pm = lambda j: fmt_pm(gm[j], gs[j])  # noqa: E731
    rows = [
        Claim("overlap $M_6$ (neuron 1, 2)", src, f"DMFT ({fmt(dmu[0])}, {fmt(dmu[1])})",
              f"GD ({pm(0)}, {pm(1)})", bool(max(z[0], z[1]) <= 3), f"{max(z[0], z[1]):.1f} SE apart"),
        Claim("$Q_6$ (1,1), (2,2)", src, f"DMFT ({fmt(dmu[2])}, {fmt(dmu[3])})", f"GD ({pm(2)}, {pm(3)})",
              bool(max(z[2], z[3]) <= 3), f"{max(z[2], z[3]):.1f} SE apart"),
        Claim("train / test risk at $t = 6$", src, f"DMFT {fmt(dmu[4])} / {fmt(dmu[5])}",
              f"GD {pm(4)} / {pm(5)}", bool(max(z[4], z[5]) <= 3), f"{max(z[4], z[5]):.1f} SE apart"),
        Claim("memory terms are needed", "this book: DMFT without memory", "misses GD",
              f"≥ {fmt(z_nm[[2, 3, 4]].min(), 2)} SE off", bool(z_nm[[2, 3, 4]].min() > 5),
              "$Q_{11}$, $Q_{22}$, train; > 5 SE"),
        Claim("GD–DMFT distance $\\propto d^{-1/2}$", "DMFT as the $d \\to \\infty$ limit", "slope −0.5",
              fmt_pm(ts['slope'], ts['slope_se']), bool(abs(ts["slope"] + 0.5) <= 2 * ts["slope_se"]),
              "2 SE"),
        Claim("phase retrieval: DMFT $M_t \\equiv 0$ (antithetic)", "symmetry $z \\to -z$", "0 exactly",
              f"{fmt(es['anti'])}; plain paths {fmt(es['plain'])}", bool(es["anti"] == 0.0), ""),
        Claim("phase retrieval: GD overlap $O(d^{-1/2})$", "symmetry $z \\to -z$", "slope −0.5",
              fmt_pm(*es['pr_slope'][:2]),
              bool(abs(es["pr_slope"][0] + 0.5) <= 2 * es["pr_slope"][1]), f"$t$ = {es['T']}; 2 SE"),
        Claim("staircase: easy learned, hard $O(d^{-1/2})$", "{cite}`montanari2026phase`, abstract",
              "easy $\\Omega(1)$; hard slope −0.5",
              f"easy {fmt(es['easy'])}; hard {fmt_pm(*es['st_slope'][:2])}",
              bool(es["easy"] > 0.5 and abs(es["st_slope"][0] + 0.5) <= 2 * es["st_slope"][1]),
              f"$t$ = {es['T']}; 2 SE"),
    ]
    return [at_scale(r, scale) for r in rows]
