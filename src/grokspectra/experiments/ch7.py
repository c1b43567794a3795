"""Chapter 7: spectral lock-in — rolling update-Gram spectra, Xu's σ₂/σ₃ detector, x² vs ReLU, every sweep.

Experiments (brief §3.2–§3.8, §5). Every training run logs the band of update inner products
<ΔW_t, ΔW_{t−k}> for k < ``band`` (engine :func:`grokspectra.modadd.train`), so one run serves every window
W ≤ band; the rolling spectra are assembled afterwards by :func:`grokspectra.lockin.rolling_eigs`.

* ``headline``  x², η vs η = 0 on paired seeds: σ₁…σ₅ for every window in ``windows`` (the window sweep and the
  σ₁/σ₂ reanalysis reuse these runs), ΔV spectra, accuracies, ρ_tian.
* ``relu``      the same with σ = ReLU and ``relu_epochs``.
* ``eta_sweep`` η ∈ ``sweep_etas`` × ``sweep_seeds`` seeds, ``sweep_epochs`` epochs.
* ``eta_long``  the single long run at ``long_eta``.
* ``grid``      M × p grid of grok rates (η = ``eta``), with per-run detector summaries.

Every experiment returns the per-run arrays the detectors need; :func:`runs_table` turns any of them into the
per-run event epochs (lock-in fire, test 0.5/0.99, ρ crossing) used by the notebook.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import lockin, modadd
from ..params import Param, Schema
from .. import sweep
from . import experiment

SECTION = "ch7_lockin"
K_EIGS = 5

SCHEMA = Schema(
    Param("profile", str, help="parameter profile"),
    Param("device", str, choices=("auto", "cpu", "cuda"), help="torch device"),
    Param("M", int, lo=5, hi=257, help="modulus of the headline, ReLU and η-sweep runs"),
    Param("K", int, lo=8, hi=8192, help="hidden width"),
    Param("frac", float, lo=0.01, hi=0.95, help="training fraction n/M² (0.4 → n = 2016 at M = 71)"),
    Param("eta", float, lo=0.0, hi=0.1, help="weight decay of the grokking arm (and of the M×p grid)"),
    Param("seeds", int, lo=1, hi=64, help="seeds per arm in the headline (x²) comparison"),
    Param("epochs", int, lo=30, hi=20000, help="epochs of the headline runs"),
    Param("window", int, lo=3, hi=64, help="rolling window W of the detector"),
    Param("windows", list, of=int, lo=3, hi=64, help="windows of the window sweep (≤ band)"),
    Param("band", int, lo=3, hi=64, help="lags of update inner products kept (serves every W ≤ band)"),
    Param("relu_seeds", int, lo=1, hi=64, help="seeds per arm of the ReLU comparison"),
    Param("relu_epochs", int, lo=30, hi=20000, help="epochs of the ReLU runs"),
    Param("sweep_etas", list, of=float, lo=0.0, hi=0.1, help="weight decays of the η sweep"),
    Param("sweep_seeds", int, lo=1, hi=64, help="seeds per η"),
    Param("sweep_epochs", int, lo=30, hi=20000, help="epochs of the η sweep"),
    Param("long_eta", float, lo=0.0, hi=0.1, help="weight decay of the single long run"),
    Param("long_seed", int, lo=0, hi=10**6, help="seed of the long run"),
    Param("long_epochs", int, lo=30, hi=50000, help="epochs of the long run"),
    Param("grid_M", list, of=int, lo=5, hi=257, help="moduli of the M×p grid"),
    Param("grid_p", list, of=float, lo=0.01, hi=0.95, help="training fractions of the M×p grid"),
    Param("grid_seeds", int, lo=1, hi=64, help="seeds per grid cell"),
    Param("grid_epochs", list, of=int, lo=30, hi=20000, help="epochs per modulus (one per grid_M)"),
    Param("gram_every", int, lo=1, hi=1000, help="Gram diagnostics (ρ_tian) every this many epochs ..."),
    Param("gram_dense", int, lo=0, hi=20000, help="... and at every epoch up to this one"),
)


def n_train(M: int, frac: float) -> int:
    """Training pairs n = round(frac·M²) (brief §1: 0.4·71² → 2016)."""
    return int(round(frac * M * M))


def _spectra(out: dict, windows, dV_window: int | None = None) -> dict[str, np.ndarray]:
    """σ₁…σ₅ of the rolling ΔW Grams for each window (and of ΔV for ``dV_window``), as float64 numpy."""
    def top(band, w):  # σ₁…σ₅, NaN-padded when the window has fewer than five columns
        e = lockin.rolling_eigs(band, w, min(K_EIGS, w)).numpy()
        return np.concatenate([e, np.full(e.shape[:-1] + (K_EIGS - e.shape[-1],), np.nan)], axis=-1)

    res = {f"eigW{w}": top(out["dW_band"], w) for w in windows}
    if dV_window is not None:
        res["eigV"] = top(out["dV_band"], dV_window)
    return res


def _logs(out: dict) -> dict[str, np.ndarray]:
    keep = ("train_acc", "test_acc", "train_loss", "test_loss", "rho_code", "rho_paper", "ftf_ratio", "gf_norm",
            "gf_norm_all", "update_cos", "gram_epochs", "etas", "seeds")
    return {k: out[k].numpy() for k in keep}


SEED_BLOCK = 3  # runs per unit: ≈ 1–4 min per unit at paper scale on 2 CPU cores


def _check_windows(p: dict) -> list[int]:
    ws = sorted(set(p["windows"]) | {p["window"]})
    if max(ws) > p["band"]:
        raise ValueError(f"windows {ws} need band >= {max(ws)}, got band={p['band']}")
    return ws


def _runs_units(p: dict, arms: list[tuple[str, float]], seeds: list[int], epochs: int, windows: list[int],
                dV_window: int | None, *, M: int | None = None, n: int | None = None) -> list[dict]:
    """One unit per (arm, block of seeds): everything the training of that block needs."""
    M = p["M"] if M is None else M
    base = {"M": M, "K": p["K"], "n": n_train(M, p["frac"]) if n is None else n, "epochs": epochs,
            "band": max(windows), "windows": windows, "dV_window": dV_window, "gram_every": p["gram_every"],
            "gram_dense": p["gram_dense"]}
    return [{**base, "act": act, "eta": eta, "seeds": blk} for act, eta in arms for blk in sweep.blocks(seeds, SEED_BLOCK)]


def _runs_reduce(p: dict, units: list[dict], results: list[dict]) -> dict[str, np.ndarray]:
    return sweep.concat_runs(results, shared=("gram_epochs",))


def _runs_cost(u: dict) -> float:
    """Run-epochs × the size of one epoch's work (∝ M²K for the forward pass on every pair)."""
    return len(u["seeds"]) * u["epochs"] * u["M"] ** 2 * u["K"] / (71 ** 2 * 2048)


def _runs_shrink(u: dict) -> dict:
    return {**u, "seeds": u["seeds"][:1], "epochs": min(u["epochs"], 2 * u["band"] + 2)}


def _train_unit(u: dict, device: torch.device) -> dict[str, np.ndarray]:
    """Train one block of runs (x² or ReLU, one η) and reduce it to the logs and rolling σ₁…σ₅ spectra."""
    out = modadd.train(u["M"], u["K"], u["n"], u["act"], [u["eta"]] * len(u["seeds"]), u["seeds"], u["epochs"],
                       device=device, dtype=torch.float32, gram_every=u["gram_every"], gram_dense=u["gram_dense"],
                       band=u["band"], progress=True)
    return {**_logs(out), **_spectra(out, u["windows"], u["dV_window"])}


UNITS = dict(reduce=_runs_reduce, cost=_runs_cost, shrink=_runs_shrink)


def _headline_units(p: dict) -> list[dict]:
    S = p["seeds"]
    return _runs_units(p, [("x2", p["eta"]), ("x2", 0.0)], list(range(S)), p["epochs"], _check_windows(p),
                       p["window"])


@experiment(SECTION, keys=["M", "K", "frac", "eta", "seeds", "epochs", "window", "windows", "band", "gram_every",
                           "gram_dense"], units=_headline_units, **UNITS)
def headline(u: dict, device: torch.device) -> dict[str, np.ndarray]:
    """x² network, η = ``eta`` (grok arm, runs 0…S−1) vs η = 0 (control, runs S…2S−1) on the same seeds 0…S−1
    ({cite}`xu2026repulsion`, §3): logs, ρ_tian and rolling σ₁…σ₅ for every window of the window sweep. One
    unit is one (arm, block of seeds)."""
    return _train_unit(u, device)


def _relu_units(p: dict) -> list[dict]:
    return _runs_units(p, [("relu", p["eta"]), ("relu", 0.0)], list(range(p["relu_seeds"])), p["relu_epochs"],
                       [p["window"]], p["window"])


@experiment(SECTION, keys=["M", "K", "frac", "eta", "relu_seeds", "relu_epochs", "window", "gram_every",
                           "gram_dense"], units=_relu_units, **UNITS)
def relu(u: dict, device: torch.device) -> dict[str, np.ndarray]:
    """ReLU network, η = ``eta`` vs η = 0 on seeds 0…S−1, ``relu_epochs`` epochs; one unit per (arm, seed block)."""
    return _train_unit(u, device)


def _sweep_units(p: dict) -> list[dict]:
    return _runs_units(p, [("x2", e) for e in p["sweep_etas"]], list(range(p["sweep_seeds"])), p["sweep_epochs"],
                       [p["window"]], None)


@experiment(SECTION, keys=["M", "K", "frac", "sweep_etas", "sweep_seeds", "sweep_epochs", "window", "gram_every",
                           "gram_dense"], units=_sweep_units, **UNITS)
def eta_sweep(u: dict, device: torch.device) -> dict[str, np.ndarray]:
    """x² runs for every η in ``sweep_etas`` × seeds 0…S−1 (η-major order), ``sweep_epochs`` epochs; one unit
    per (η, seed block)."""
    return _train_unit(u, device)


def _long_units(p: dict) -> list[dict]:
    return _runs_units(p, [("x2", p["long_eta"])], [p["long_seed"]], p["long_epochs"], [p["window"]], None)


@experiment(SECTION, keys=["M", "K", "frac", "long_eta", "long_seed", "long_epochs", "window", "gram_every",
                           "gram_dense"], units=_long_units, **UNITS)
def eta_long(u: dict, device: torch.device) -> dict[str, np.ndarray]:
    """One x² run at η = ``long_eta`` for ``long_epochs`` epochs (Xu's η = 10⁻⁵, 2000-epoch run)."""
    return _train_unit(u, device)


def _grid_units(p: dict) -> list[dict]:
    Ms, ps = p["grid_M"], p["grid_p"]
    if len(p["grid_epochs"]) != len(Ms):
        raise ValueError(f"grid_epochs {p['grid_epochs']} needs one entry per modulus in grid_M {Ms}")
    out = []
    for i, (M, E) in enumerate(zip(Ms, p["grid_epochs"])):
        for j, frac in enumerate(ps):
            for u in _runs_units(p, [("x2", p["eta"])], list(range(p["grid_seeds"])), E, [p["window"]], None,
                                 M=M, n=n_train(M, frac)):
                out.append({**u, "cell": [i, j]})
    return out


def _grid_reduce(p: dict, units: list[dict], results: list[dict]) -> dict[str, np.ndarray]:
    """Arrays ``[len(grid_M), len(grid_p), seeds, ...]``, curves NaN-padded to the longest run."""
    Ms, ps, S = p["grid_M"], p["grid_p"], p["grid_seeds"]
    Emax = max(p["grid_epochs"])
    shape = (len(Ms), len(ps), S)
    out = {"test_acc": np.full(shape + (Emax + 1,), np.nan), "r23": np.full(shape + (Emax + 1,), np.nan),
           "rho_fire": np.full(shape, np.nan), "rho_max": np.full(shape, np.nan)}
    n = np.zeros((len(Ms), len(ps)), dtype=np.int64)
    for u, r in zip(units, results):
        i, j = u["cell"]
        n[i, j] = u["n"]
        s = np.asarray(u["seeds"])
        E = u["epochs"]
        out["test_acc"][i, j, s, :E + 1] = r["test_acc"]
        out["r23"][i, j, s, :E + 1] = r["r23"]
        out["rho_fire"][i, j, s] = r["rho_fire"]
        out["rho_max"][i, j, s] = r["rho_max"]
    return {**out, "n": n, "grid_M": np.array(Ms), "grid_p": np.array(ps), "grid_epochs": np.array(p["grid_epochs"])}


@experiment(SECTION, keys=["K", "eta", "grid_M", "grid_p", "grid_seeds", "grid_epochs", "window", "gram_every",
                           "gram_dense"], units=_grid_units, reduce=_grid_reduce, cost=_runs_cost, shrink=_runs_shrink)
def grid(u: dict, device: torch.device) -> dict[str, np.ndarray]:
    """M × p grid of grok rates (Xu's scaling sweep) at η = ``eta``; one unit per (M, p, seed block): per run the
    test-accuracy and σ₂/σ₃ curves, the epoch ρ_tian first reaches 0.075 and its maximum."""
    out = modadd.train(u["M"], u["K"], u["n"], "x2", [u["eta"]] * len(u["seeds"]), u["seeds"], u["epochs"],
                       device=device, dtype=torch.float32, gram_every=u["gram_every"], gram_dense=u["gram_dense"],
                       band=u["band"], progress=True)
    rho = out["rho_code"].numpy()
    return {"test_acc": out["test_acc"].numpy(),
            "r23": lockin.ratios(lockin.rolling_eigs(out["dW_band"], u["windows"][0], 3))[1],
            "rho_fire": lockin.rho_fire(rho, 0.075, out["gram_epochs"].numpy()),
            "rho_max": np.nanmax(np.where(np.isfinite(rho), rho, np.nan), axis=-1)}


# --- analysis shared by the notebook ------------------------------------------------------------------------
def runs_table(test_acc: np.ndarray, r23: np.ndarray, *, rho: np.ndarray | None = None,
               gram_epochs: np.ndarray | None = None, rho_thresh: float = 0.075) -> dict[str, np.ndarray]:
    """Per-run events (brief §1, §3.3, §3.6): ``fire`` (Xu's slope detector on σ₂/σ₃), ``t05`` and ``t99``
    (first epoch with test accuracy ≥ 0.5 / 0.99), ``grok`` (test 0.99 reached), ``late`` (median σ₂/σ₃ over the
    second half of the run: Xu's 200–400 of 400 and 300–600 of 600), and ``t_rho`` (ρ_tian ≥ ``rho_thresh``)."""
    E = test_acc.shape[-1] - 1
    last = np.where(np.isfinite(test_acc), np.arange(E + 1), -1).max(-1)  # last logged epoch per run
    late = np.full(test_acc.shape[:-1], np.nan)
    for e in np.unique(last):
        sel = last == e
        late[sel] = lockin.late_median(r23[sel], int(e) // 2, int(e))
    t99 = lockin.first_epoch(test_acc, 0.99)
    out = {"fire": lockin.slope_fire(r23), "t05": lockin.first_epoch(test_acc, 0.5), "t99": t99,
           "grok": np.isfinite(t99), "late": late}
    if rho is not None:
        out["t_rho"] = lockin.rho_fire(rho, rho_thresh, gram_epochs)
    return out


def events(res, window: int) -> dict[str, np.ndarray]:
    """:func:`runs_table` of a stored headline / relu / eta_sweep / eta_long result for window W."""
    r23 = lockin.ratios(res[f"eigW{window}"])[1]
    return runs_table(res["test_acc"], r23, rho=res["rho_code"], gram_epochs=res["gram_epochs"])


def split_arms(x: np.ndarray, S: int) -> tuple[np.ndarray, np.ndarray]:
    """Grok arm (runs 0…S−1) and control arm (runs S…2S−1) of a headline or ReLU result."""
    return x[:S], x[S:2 * S]


def count(x: np.ndarray) -> str:
    """'k/n' fired (finite entries) out of all."""
    x = np.asarray(x, float).ravel()
    return f"{int(np.isfinite(x).sum())}/{x.size}"


def med_str(x: np.ndarray, digits: int = 3) -> str:
    """'median [q25, q75]' of the finite entries, '–' when none."""
    m, lo, hi = lockin.median_iqr(x)
    if not np.isfinite(m):
        return "–"
    f = lambda v: f"{v:.{digits}g}"  # noqa: E731
    return f"{f(m)} [{f(lo)}, {f(hi)}]"


# --- benchmark ------------------------------------------------------------------------------------------------
def paper_run_epochs(P: dict) -> int:
    """Total run-epochs the chapter trains for the parameters ``P`` (to turn an engine timing per run-epoch into
    the chapter's total)."""
    return (2 * P["seeds"] * P["epochs"] + 2 * P["relu_seeds"] * P["relu_epochs"]
            + len(P["sweep_etas"]) * P["sweep_seeds"] * P["sweep_epochs"] + P["long_epochs"]
            + len(P["grid_p"]) * P["grid_seeds"] * sum(P["grid_epochs"]))


def bench_lockin(device: str = "auto", quick: bool = False) -> dict:
    """Time the post-processing of the headline: rolling σ₁…σ₅ for every window of the sweep from a band of
    [30 runs, 401 epochs, 30 lags] (the paper-scale headline), on the CPU and on ``device``."""
    import time

    from ..device import get_device, synchronize
    from ..params import load_profile

    dev = get_device(device)
    R, T, B = (4, 101, 30) if quick else (30, 401, 30)
    g = torch.Generator().manual_seed(0)
    D = torch.randn(R, T - 1, 64, generator=g, dtype=torch.float64)
    band = lockin.band_from_updates(D, B)
    out = {"shape": [R, T, B]}
    for name, d in (("cpu", torch.device("cpu")), (str(dev), dev)):
        b = band.to(d)
        lockin.rolling_eigs(b, 5, K_EIGS)  # warm-up
        synchronize(d)
        t0 = time.perf_counter()
        for w in (5, 10, 20, 30):
            lockin.rolling_eigs(b, w, K_EIGS)
        synchronize(d)
        out[f"rolling_eigs_4_windows_s[{name}]"] = time.perf_counter() - t0
    P = SCHEMA.validate(load_profile("paper", SECTION))
    out["paper_run_epochs"] = paper_run_epochs(P)
    return out


BENCHMARKS = {"lockin": bench_lockin}
