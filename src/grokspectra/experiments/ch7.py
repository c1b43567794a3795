"""Chapter 7: spectral lock-in — rolling update-Gram spectra, Xu's σ₂/σ₃ detector, x² vs ReLU, every sweep.

Experiments: every sweep of Xu's lock-in study (Xu, arXiv:2605.08119, and his repository
skydancerosel/grokking-integrability, tian_eigengap/paper/note_technical.tex and findings.md). Every training run logs the band of update inner products
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
from ..report import epoch_tol, fractions_agree, iqr_se, median_se, median_z, plural as report_plural, sci_tex, slope_z
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
    Param("prec_eta", float, lo=0.0, hi=0.1, help="weight decay of the float64 reruns (one of sweep_etas)"),
    Param("prec_seeds", int, lo=1, hi=64, help="seeds 0…S−1 of the η sweep rerun in float64"),
    Param("gram_every", int, lo=1, hi=1000, help="Gram diagnostics (ρ_tian) every this many epochs ..."),
    Param("gram_dense", int, lo=0, hi=20000, help="... and at every epoch up to this one"),
)


def n_train(M: int, frac: float) -> int:
    """Training pairs n = round(frac·M²) (0.4·71² → 2016, the split size of Tian's and Xu's runs)."""
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


def _precision_units(p: dict) -> list[dict]:
    if not any(np.isclose(p["prec_eta"], e) for e in p["sweep_etas"]):
        raise ValueError(f"prec_eta = {p['prec_eta']} must be one of sweep_etas {p['sweep_etas']}: the float64 runs "
                         "are compared with the η sweep's float32 runs of the same seeds")
    if p["prec_seeds"] > p["sweep_seeds"]:
        raise ValueError(f"prec_seeds = {p['prec_seeds']} exceeds sweep_seeds = {p['sweep_seeds']}")
    base = {"M": p["M"], "K": p["K"], "n": n_train(p["M"], p["frac"]), "epochs": p["sweep_epochs"],
            "window": p["window"], "eta": p["prec_eta"]}
    return [{**base, "seeds": [s]} for s in range(p["prec_seeds"])]


def _precision_reduce(p: dict, units: list[dict], results: list[dict]) -> dict[str, np.ndarray]:
    return sweep.concat_runs(results)


def _precision_cost(u: dict) -> float:
    """A float64 run-epoch costs about 2.2 float32 run-epochs on the CPU (measured); no Gram diagnostics."""
    return 2.2 * len(u["seeds"]) * u["epochs"] * u["M"] ** 2 * u["K"] / (71 ** 2 * 2048)


def _precision_shrink(u: dict) -> dict:
    return {**u, "epochs": min(u["epochs"], 2 * u["window"] + 2)}


@experiment(SECTION, keys=["M", "K", "frac", "sweep_etas", "sweep_seeds", "sweep_epochs", "window", "prec_eta",
                           "prec_seeds"], units=_precision_units, reduce=_precision_reduce, cost=_precision_cost,
            shrink=_precision_shrink)
def precision(u: dict, device: torch.device) -> dict[str, np.ndarray]:
    """The η sweep's x² run at η = ``prec_eta`` for one seed, trained and logged in float64 (weights, Adam, the
    band of update inner products): the same dynamics as the float32 run of that seed, with the rounding floor of
    the rolling Gram ~10⁹ times lower. σ₁…σ₅ of the rolling W-Gram, test accuracy and train loss per epoch."""
    E, W = u["epochs"], u["window"]
    out = modadd.train(u["M"], u["K"], u["n"], "x2", [u["eta"]], u["seeds"], E, device=device, dtype=torch.float64,
                       gram_every=E + 1, gram_dense=0, band=W, progress=True)
    return {"eigW": lockin.rolling_eigs(out["dW_band"], W, K_EIGS).numpy(), "test_acc": out["test_acc"].numpy(),
            "train_loss": out["train_loss"].numpy(), "seeds": out["seeds"].numpy(), "etas": out["etas"].numpy()}


# --- analysis shared by the notebook ------------------------------------------------------------------------
def runs_table(test_acc: np.ndarray, r23: np.ndarray, *, rho: np.ndarray | None = None,
               gram_epochs: np.ndarray | None = None, rho_thresh: float = 0.075) -> dict[str, np.ndarray]:
    """Per-run events (Xu's definitions): ``fire`` (Xu's slope detector on σ₂/σ₃), ``t05`` and ``t99``
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
    [30 runs, 401 epochs, 30 lags] (the paper-scale headline), on the CPU and on ``device``. Floor: the
    symmetric eigensolver alone on as many window Grams of the same sizes, already assembled."""
    import time

    from ..device import get_device, synchronize
    from ..params import load_profile

    dev = get_device(device)
    R, T, B = (4, 101, 30) if quick else (30, 401, 30)
    g = torch.Generator().manual_seed(0)
    D = torch.randn(R, T - 1, 64, generator=g, dtype=torch.float64)
    band = lockin.band_from_updates(D, B)
    out = {"shape": [R, T, B]}
    windows = (5, 10, 20, 30)
    for name, d in (("cpu", torch.device("cpu")), (str(dev), dev)):
        b = band.to(d)
        lockin.rolling_eigs(b, 5, K_EIGS)  # warm-up
        best, floor = float("inf"), float("inf")
        for _ in range(3):  # best of 3, for the engine and its floor alike
            synchronize(d)
            t0 = time.perf_counter()
            for w in windows:
                lockin.rolling_eigs(b, w, K_EIGS)
            synchronize(d)
            best = min(best, time.perf_counter() - t0)
            # the floor: eigvalsh of as many symmetric W × W float64 matrices, already assembled
            mats = [(lambda A: A @ A.transpose(-1, -2))(torch.randn(R, T, w, w, generator=g, dtype=torch.float64)
                                                          ).to(d) for w in windows]
            synchronize(d)
            t0 = time.perf_counter()
            for G in mats:
                torch.linalg.eigvalsh(G)
            synchronize(d)
            floor = min(floor, time.perf_counter() - t0)
        out[f"rolling_eigs_4_windows_s[{name}]"] = round(best, 4)
        out[f"floor_s[{name}]"] = round(floor, 4)
        out[f"ratio_to_floor[{name}]"] = round(best / floor, 2)
    out["floor_note"] = ("torch.linalg.eigvalsh of runs x epochs random Gram matrices (W x W, float64) per window, "
                         "already assembled, measured in this run (best of 3)")
    P = SCHEMA.validate(load_profile("paper", SECTION))
    out["paper_run_epochs"] = paper_run_epochs(P)
    return out


BENCHMARKS = {"lockin": bench_lockin}


# --- the chapter's analysis: scales, statistics, tables, figures and the claims table ------------------------
# Used by the notebook (and tested); nothing below changes what the experiments compute.
XU_NET = {"M": 71, "K": 2048, "frac": 0.4}  # Xu's network and split: M = 71, K = 2048, n = 2016


def scale_label(res, seeds_key: str = "seeds") -> str:
    """"CI scale (2 seeds)" / "paper scale (15 seeds)": the profile a result was computed at and its seeds."""
    from ..report import plural

    prof = res.meta.get("profile", "?")
    name = {"ci": "CI", "paper": "paper"}.get(prof, prof)
    n = res.meta["params"].get(seeds_key)
    return f"{name} scale" + (f" ({plural(int(n), 'seed')})" if n is not None else "")


def at_xu_scale(res, *, seeds_key: str | None = "seeds", seeds: int = 0, epochs_key: str | None = None,
                epochs: int = 0, net: bool = True) -> bool:
    """Whether ``res`` ran at least Xu's seeds and epochs (and, with ``net``, on his network and split)."""
    p = res.meta["params"]
    ok = all(p.get(k, v) == v for k, v in XU_NET.items()) if net else True
    if seeds_key is not None:
        ok = ok and p[seeds_key] >= seeds
    if epochs_key is not None:
        ok = ok and p[epochs_key] >= epochs
    return bool(ok)


def n_finite(x) -> int:
    """How many entries of ``x`` are finite (the runs a median and its standard error are taken over)."""
    return int(np.isfinite(np.asarray(x, float)).sum())


def factor_note(ours_log: float, claimed_log: float, tol: float) -> str:
    """A magnitude row's note: how far apart the two numbers are and the tolerance, both as factors to three
    decimals (at two, 1.061 against a tolerance of 1.063 would read as 1.06 against 1.06); empty without a
    tolerance."""
    if not np.isfinite(tol):
        return ""
    return f"a factor {np.exp(abs(ours_log - claimed_log)):.3f} apart; tolerance: factor {np.exp(tol):.3f}"


def log_median(x) -> tuple[float, float]:
    """ln of the median of the positive finite entries and its standard error (from the spread of ln x)."""
    x = np.asarray(x, float).ravel()
    x = x[np.isfinite(x) & (x > 0)]
    if x.size == 0:
        return float("nan"), float("nan")
    return float(np.log(np.median(x))), median_se(np.log(x))


def linfit_se(x, y) -> dict:
    """Least-squares line y ≈ a x + b over the finite pairs with the standard error of the slope; NaN entries
    when fewer than three pairs (or no spread in x) remain."""
    x, y = np.asarray(x, float).ravel(), np.asarray(y, float).ravel()
    ok = np.isfinite(x) & np.isfinite(y)
    n = int(ok.sum())
    try:
        a, b, r2, n = lockin.linfit(x, y)
    except ValueError:
        return {"a": np.nan, "b": np.nan, "r2": np.nan, "n": n, "a_se": np.nan}
    x, y = x[ok], y[ok]
    res = y - (a * x + b)
    a_se = float(np.sqrt(res @ res / (n - 2) / ((x - x.mean()) ** 2).sum())) if n > 2 else np.nan
    return {"a": a, "b": b, "r2": r2, "n": n, "a_se": a_se}


def epoch_words(x, never: str = "never") -> str:
    """An epoch as text: the median [IQR] of the finite entries, or ``never`` when there are none."""
    s = med_str(x)
    return never if s == "–" else s


def headline_summary(H) -> dict:
    """Everything the headline section says about the x² runs (numbers and ready-made phrases)."""
    hp = H.meta["params"]
    S, E, W = hp["seeds"], hp["epochs"], hp["window"]
    ev = events(H, W)
    fire_g, fire_c = split_arms(ev["fire"], S)
    late_g, late_c = split_arms(ev["late"], S)
    t05_g, _ = split_arms(ev["t05"], S)
    t99_g, t99_c = split_arms(ev["t99"], S)
    eig = H[f"eigW{W}"]
    mid = E // 2
    r23_v = lockin.ratios(H["eigV"])[1]
    return {
        "S": S, "E": E, "W": W, "n": n_train(hp["M"], hp["frac"]),
        "fire_g": fire_g, "fire_c": fire_c, "late_g": late_g, "late_c": late_c, "t05_g": t05_g,
        "t99_g": t99_g, "t99_c": t99_c,
        "late_ratio": float(np.nanmedian(late_g) / np.nanmedian(late_c)),
        "ctrl_final": float(np.median(split_arms(H["test_acc"][:, -1], S)[1])),
        "v_late_g": float(np.nanmedian(lockin.late_median(r23_v[:S], E // 2, E))),
        "v_late_c": float(np.nanmedian(lockin.late_median(r23_v[S:], E // 2, E))),
        "mid": mid, "s2_g": float(np.median(eig[:S, mid, 1])), "s3_g": float(np.median(eig[:S, mid, 2])),
        "s2_c": float(np.median(eig[S:, mid, 1])), "s3_c": float(np.median(eig[S:, mid, 2])),
        "floor": float(np.nanmedian(eig[:S, E // 2:, 4] / eig[:S, E // 2:, 0])),
        "s3rel": float(np.nanmedian(eig[:S, E // 2:, 2] / eig[:S, E // 2:, 0])),
    }


def _eta_tex(eta: float) -> str:
    """η as mathtext: '$\\eta = 2\\times10^{-4}$', '$\\eta = 0$'."""
    return f"$\\eta = {sci_tex(eta)}$"


def fig_headline(H):
    """Test accuracy, ρ_tian and σ₂/σ₃ of the rolling Gram, both arms (median and IQR over seeds)."""
    import matplotlib.pyplot as plt

    from .. import plotting

    hp = H.meta["params"]
    S, E, W = hp["seeds"], hp["epochs"], hp["window"]
    t = np.arange(E + 1)
    C = plotting.COLORS
    fig, ax = plt.subplots(1, 3, figsize=(7.2, 2.9))
    acc_g, acc_c = split_arms(H["test_acc"], S)
    plotting.band(ax[0], t, acc_g, C["grok"], label=_eta_tex(hp["eta"]))
    plotting.band(ax[0], t, acc_c, C["control"], label=_eta_tex(0))
    ax[0].set(xlabel="epoch", ylabel="test accuracy")
    ax[0].legend(loc="center right")
    rho_g, rho_c = split_arms(H["rho_code"], S)
    plotting.band(ax[1], H["gram_epochs"], rho_g, C["grok"])
    plotting.band(ax[1], H["gram_epochs"], rho_c, C["control"])
    ax[1].axhline(0.075, color="k", ls=":", lw=1)
    ax[1].set(xlabel="epoch", ylabel=r"$\rho_{\rm tian}$")
    r23 = lockin.ratios(H[f"eigW{W}"])[1]
    rg, rc = split_arms(r23, S)
    plotting.band(ax[2], t, rg, C["grok"])
    plotting.band(ax[2], t, rc, C["control"])
    fire_g = split_arms(events(H, W)["fire"], S)[0]
    if np.isfinite(fire_g).any():
        ax[2].axvline(np.nanmedian(fire_g), color=C["grok"], ls="--", lw=1)
    ax[2].set(yscale="log", xlabel="epoch", ylabel=r"$\sigma_2/\sigma_3$")
    return fig


def fig_rank(H):
    """σ₁…σ₅ of the rolling Gram for seed 0, with and without weight decay."""
    import matplotlib.pyplot as plt

    from .. import plotting

    hp = H.meta["params"]
    S, E, W = hp["seeds"], hp["epochs"], hp["window"]
    t = np.arange(E + 1)
    eig = H[f"eigW{W}"]
    fig, ax = plt.subplots(1, 2, figsize=(7.2, 3.2), sharey=True)
    for a, r, title in ((ax[0], 0, _eta_tex(hp["eta"]) + ", seed 0"), (ax[1], S, _eta_tex(0) + ", seed 0")):
        for k in range(K_EIGS):
            a.plot(t, np.clip(eig[r, :, k], 1e-12, None), color=plotting.CYCLE[k], label=f"$\\sigma_{k + 1}$")
        a.set(yscale="log", xlabel="epoch", title=title)
    ax[0].set_ylabel("eigenvalue of $G_t$")
    fig.legend(*ax[0].get_legend_handles_labels(), loc="outside lower center", ncol=K_EIGS)
    return fig


def relu_summary(H, Rl) -> dict:
    """The ReLU section's numbers: firings, late separations and σ₁/σ₂ for ReLU and x²."""
    hp, rp = H.meta["params"], Rl.meta["params"]
    S, E, Sr, Er = hp["seeds"], hp["epochs"], rp["relu_seeds"], rp["relu_epochs"]
    ev = events(Rl, rp["window"])
    r12_r = lockin.ratios(Rl[f"eigW{rp['window']}"])[0]
    r12_h = lockin.ratios(H[f"eigW{hp['window']}"])[0]
    late_g, late_c = split_arms(ev["late"], Sr)
    return {
        "Sr": Sr, "Er": Er, "fire_g": split_arms(ev["fire"], Sr)[0], "fire_c": split_arms(ev["fire"], Sr)[1],
        "late_g": late_g, "late_c": late_c, "ratio": float(np.nanmedian(late_g) / np.nanmedian(late_c)),
        "t99_g": split_arms(ev["t99"], Sr)[0], "t05_g": split_arms(ev["t05"], Sr)[0],
        "rho0": Rl["rho_code"][:, 0], "s12_relu": float(np.nanmedian(split_arms(r12_r, Sr)[0][:, Er // 2:])),
        "s12_x2": float(np.nanmedian(split_arms(r12_h, S)[0][:, E // 2:])),
    }


def fig_relu(H, Rl):
    """x² against ReLU, with and without weight decay: test accuracy, σ₂/σ₃ and σ₁/σ₂."""
    import matplotlib.pyplot as plt

    from .. import plotting

    hp, rp = H.meta["params"], Rl.meta["params"]
    S, Sr = hp["seeds"], rp["relu_seeds"]
    t, tr = np.arange(hp["epochs"] + 1), np.arange(rp["relu_epochs"] + 1)
    r12_h, r23_h = lockin.ratios(H[f"eigW{hp['window']}"])
    r12_r, r23_r = lockin.ratios(Rl[f"eigW{rp['window']}"])
    C = plotting.COLORS
    fig, ax = plt.subplots(1, 3, figsize=(7.2, 3.0))
    for a, xg, xr, yl, logy in ((ax[0], H["test_acc"], Rl["test_acc"], "test accuracy", False),
                                (ax[1], r23_h, r23_r, r"$\sigma_2/\sigma_3$", True),
                                (ax[2], r12_h, r12_r, r"$\sigma_1/\sigma_2$", True)):
        plotting.band(a, t, split_arms(xg, S)[0], C["x2"], label=r"$x^2$, $\eta > 0$")
        plotting.band(a, t, split_arms(xg, S)[1], C["x2"], ls=":", label=r"$x^2$, $\eta = 0$")
        plotting.band(a, tr, split_arms(xr, Sr)[0], C["relu"], label=r"ReLU, $\eta > 0$")
        plotting.band(a, tr, split_arms(xr, Sr)[1], C["relu"], ls=":", label=r"ReLU, $\eta = 0$")
        a.set(xlabel="epoch", ylabel=yl, yscale="log" if logy else "linear")
    fig.legend(*ax[0].get_legend_handles_labels(), loc="outside lower center", ncol=4)
    return fig


def window_table(H) -> tuple[str, dict]:
    """The window sweep on the headline runs as a markdown table, and the control false positives per window."""
    hp = H.meta["params"]
    S, E = hp["seeds"], hp["epochs"]
    i_rank = E // 2
    rows, fpos = [], {}
    for w in hp["windows"]:
        ev = runs_table(H["test_acc"], lockin.ratios(H[f"eigW{w}"])[1])
        fg, fc = split_arms(ev["fire"], S)
        lg, lc = split_arms(ev["late"], S)
        fpos[w] = int(np.isfinite(fc).sum())
        e3 = np.median(H[f"eigW{w}"][:S, i_rank, 2:5], axis=0)
        rows.append(f"| {w} | {count(fg)} · {med_str(fg)} | {count(fc)} · {med_str(fc)} | {np.nanmedian(lg):.3g} | "
                    f"{np.nanmedian(lc):.3g} | {e3[0]:.1e} / {e3[1]:.1e} / {e3[2]:.1e} |")
    head = ("| $W$ | grok: fired · epoch | control: fired · epoch | late $\\sigma_2/\\sigma_3$, grok | "
            f"late $\\sigma_2/\\sigma_3$, control | $\\sigma_3 / \\sigma_4 / \\sigma_5$ at epoch {i_rank} (grok) |\n"
            "|---|---|---|---|---|---|\n")
    return head + "\n".join(rows), fpos


def fig_window(H):
    """Median σ₂/σ₃ for each window of the sweep (grokking arm solid, control dotted)."""
    import matplotlib.pyplot as plt

    from .. import plotting

    hp = H.meta["params"]
    S = hp["seeds"]
    t = np.arange(hp["epochs"] + 1)
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for k, w in enumerate(hp["windows"]):
        g_, c_ = split_arms(lockin.ratios(H[f"eigW{w}"])[1], S)
        with np.errstate(all="ignore"):
            ax.plot(t, np.nanmedian(np.where(g_ > 0, g_, np.nan), 0), color=plotting.CYCLE[k], label=f"$W = {w}$")
            ax.plot(t, np.nanmedian(np.where(c_ > 0, c_, np.nan), 0), color=plotting.CYCLE[k], ls=":")
    ax.set(yscale="log", xlabel="epoch", ylabel=r"median $\sigma_2/\sigma_3$")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=len(hp["windows"]))
    return fig


def s12_tables(H) -> str:
    """σ₁/σ₂ medians at Xu's epochs, and his σ₁/σ₂ (and σ₂/σ₃) detectors on the headline runs: two tables."""
    hp = H.meta["params"]
    S, E, W = hp["seeds"], hp["epochs"], hp["window"]
    r12, r23 = lockin.ratios(H[f"eigW{W}"])
    t05_g = split_arms(events(H, W)["t05"], S)[0]
    marks = [e for e in (30, 50, 75, 100, 125, 150, 170, 200) if e <= E]
    g12, c12 = split_arms(r12, S)
    first = ["| epoch | " + " | ".join(str(e) for e in marks) + " |", "|---" * (len(marks) + 1) + "|",
             "| grok | " + " | ".join(f"{np.nanmedian(g12[:, e]):.3g}" for e in marks) + " |",
             "| control | " + " | ".join(f"{np.nanmedian(c12[:, e]):.3g}" for e in marks) + " |"]
    dets = [("$\\sigma_1/\\sigma_2 \\ge 25$ for 5 epochs", lambda x: lockin.threshold_fire(x, 25, sustained=5), r12),
            ("$\\sigma_1/\\sigma_2 \\ge 100$", lambda x: lockin.threshold_fire(x, 100), r12),
            ("$\\sigma_1/\\sigma_2 \\ge 200$", lambda x: lockin.threshold_fire(x, 200), r12),
            ("slope of $\\sigma_1/\\sigma_2$ > 0.04, epoch ≥ 100", lambda x: lockin.slope_fire(x), r12),
            ("slope of $\\sigma_2/\\sigma_3$ > 0.04, epoch ≥ 100 (Xu)", lambda x: lockin.slope_fire(x), r23),
            ("$\\sigma_2/\\sigma_3 \\ge 50$, epoch ≥ 100", lambda x: lockin.threshold_fire(x, 50, ep_min=100), r23)]
    second = ["| detector | grok: fired · epoch | control: fired | median lag behind test 0.5 |", "|---|---|---|---|"]
    for name, fn, x in dets:
        fg, fc = split_arms(fn(x), S)
        lag = fg - t05_g
        second.append(f"| {name} | {count(fg)} · {med_str(fg)} | {count(fc)} | "
                      f"{report_fmt(np.nanmedian(lag)) if np.isfinite(lag).any() else 'no firing after test 0.5'} |")
    return "\n".join(first) + "\n\n" + "\n".join(second)


def report_fmt(x: float) -> str:
    from ..report import fmt

    return fmt(x)


def rho_table(H) -> tuple[str, dict]:
    """ρ_tian thresholds on the headline runs: fired and epoch per arm, lead over test 0.5; and the grok arm's
    firing epochs per threshold."""
    hp = H.meta["params"]
    S = hp["seeds"]
    t05_g = split_arms(events(H, hp["window"])["t05"], S)[0]
    rho_c_max = float(np.nanmax(split_arms(H["rho_code"], S)[1]))
    rows = ["| threshold | grok: fired · epoch | control: fired (max $\\rho$) | median lead over test 0.5 |",
            "|---|---|---|---|"]
    fire_at = {}
    for th in (0.070, 0.075, 0.085, 0.10):
        fg, fc = split_arms(lockin.rho_fire(H["rho_code"], th, H["gram_epochs"]), S)
        fire_at[th] = fg
        ld = lockin.lead(fg, t05_g)
        lead_s = report_fmt(np.nanmedian(ld)) if np.isfinite(ld).any() else "test 0.5 not reached"
        rows.append(f"| {th:.3f} | {count(fg)} · {med_str(fg)} | {count(fc)} ({rho_c_max:.3f}) | {lead_s} |")
    return "\n".join(rows), fire_at


def eta_summary(Es) -> dict:
    """The η sweep: per-η table, the regression of the ρ crossing on the test-0.5 epoch, and the leads."""
    ep = Es.meta["params"]
    ev = events(Es, ep["window"])
    etas = Es["etas"]

    def md(x):
        return report_fmt(np.nanmedian(x)) if np.isfinite(x).any() else "never"

    rows = ["| $\\eta$ | grokked (0.99) | $\\rho \\ge 0.075$ (median) | test 0.5 (median) | lead | slope fires · epoch | "
            "late $\\sigma_2/\\sigma_3$ |", "|---|---|---|---|---|---|---|"]
    for e_ in ep["sweep_etas"]:
        sel = np.isclose(etas, e_)
        ld = lockin.lead(ev["t_rho"][sel], ev["t05"][sel])
        rows.append(f"| ${sci_tex(e_)}$ | {int(ev['grok'][sel].sum())}/{int(sel.sum())} | {md(ev['t_rho'][sel])} | "
                    f"{md(ev['t05'][sel])} | {md(ld) if np.isfinite(ld).any() else '–'} | "
                    f"{count(ev['fire'][sel])} · {epoch_words(ev['fire'][sel], '–')} | "
                    f"{np.nanmedian(ev['late'][sel]):.3g} |")
    gk = ev["grok"] & np.isfinite(ev["t_rho"]) & np.isfinite(ev["t05"])
    fit = linfit_se(ev["t05"][gk], ev["t_rho"][gk])
    lead_all = lockin.lead(ev["t_rho"][ev["grok"]], ev["t05"][ev["grok"]])
    return {"table": "\n".join(rows), "fit": fit, "gk": gk, "ev": ev, "n_grok": int(ev["grok"].sum()),
            "lead_pos": int((lead_all > 0).sum())}


def long_summary(L) -> dict:
    """The single long run: event epochs (NaN: never) and the peak of σ₂/σ₃."""
    lp = L.meta["params"]
    ev = events(L, lp["window"])
    r23 = lockin.ratios(L[f"eigW{lp['window']}"])[1][0]
    return {"t05": float(ev["t05"][0]), "t99": float(ev["t99"][0]), "t_rho": float(ev["t_rho"][0]),
            "fire": float(ev["fire"][0]), "peak": float(np.nanmax(r23[3:])), "final": float(L["test_acc"][0, -1]),
            "E": lp["long_epochs"], "eta": lp["long_eta"], "seed": lp["long_seed"], "r23": r23}


def long_sentence(ls: dict) -> str:
    """What the long run reached, in words (an event that did not happen is said to be absent, not 'NaN')."""
    def ep(x, what):
        return f"{what} at epoch {x:.0f}" if np.isfinite(x) else f"never {what}"

    parts = [ep(ls["t05"], "reaches test accuracy 0.5"), ep(ls["t99"], "reaches 0.99")]
    s = (f"The long run ({_eta_tex(ls['eta'])}, seed {ls['seed']}, {ls['E']} epochs) " + " and ".join(parts)
         + f" (final test accuracy {ls['final']:.3f}); "
         + ("$\\rho_{\\rm tian}$ crosses 0.075 at epoch " + f"{ls['t_rho']:.0f}" if np.isfinite(ls["t_rho"])
            else "$\\rho_{\\rm tian}$ never crosses 0.075")
         + ", " + (f"the slope detector fires at epoch {ls['fire']:.0f}" if np.isfinite(ls["fire"])
                   else "the slope detector never fires")
         + f", and $\\sigma_2/\\sigma_3$ peaks at {ls['peak']:.3g}.")
    return s


UNLOCK_FRAC = 0.1  # a lock-in has ended when the 25-epoch median of σ₂/σ₃ falls below a tenth of its peak


def control_margin(H) -> dict:
    """How close the η = 0 controls of the headline come to firing: the largest log-slope of each control's
    σ₂/σ₃ after epoch 100 (:func:`grokspectra.lockin.max_slope`) against Xu's threshold 0.04, and Fisher's exact
    test of our count of firing controls against Xu's 0/15 (two-sided)."""
    from scipy.stats import fisher_exact

    from ..published import CH7

    hp = H.meta["params"]
    S, W = hp["seeds"], hp["window"]
    r23 = lockin.ratios(H[f"eigW{W}"])[1]
    ms = lockin.max_slope(r23[S:2 * S])
    k = int(np.sum(ms > 0.04))
    k_xu, n_xu = CH7["fire_ctrl"].value
    p = float(fisher_exact([[k, S - k], [k_xu, n_xu - k_xu]])[1])
    return {"S": S, "k": k, "slopes": ms, "med": float(np.nanmedian(ms)), "lo": float(np.nanmin(ms)),
            "hi": float(np.nanmax(ms)), "p": p, "k_xu": k_xu, "n_xu": n_xu}


def control_sentence(cm: dict) -> str:
    """The control margin in words."""
    s = (f"The largest log-slope of the {cm['S']} controls' $\\sigma_2/\\sigma_3$ after epoch 100 has median "
         f"{cm['med']:.3f} (range {cm['lo']:.3f}–{cm['hi']:.3f}) against the threshold 0.04")
    if cm["k"]:
        s += (f": the {'control that fires exceeds' if cm['k'] == 1 else 'controls that fire exceed'} it by at most "
              f"{100 * (cm['hi'] / 0.04 - 1):.0f} %, so the detector's margin on the controls is thin")
    s += (f". Our {cm['k']}/{cm['S']} and Xu's {cm['k_xu']}/{cm['n_xu']} firing controls do not differ "
          f"(Fisher's exact test, p = {cm['p']:.2f}).")
    return s


def lock_end(res) -> dict:
    """Peak and end of the lock-in (:func:`grokspectra.lockin.unlock_epoch`: the trailing 25-epoch median of
    σ₂/σ₃ falls below ``UNLOCK_FRAC`` of its peak) in every run of a headline or η-sweep result, and what changes
    between the two epochs: the factors by which σ₂ and σ₃ of the rolling Gram move."""
    W = res.meta["params"]["window"]
    eig = np.asarray(res[f"eigW{W}"], float)
    r23 = lockin.ratios(eig)[1]
    peak, end = lockin.unlock_epoch(r23, frac=UNLOCK_FRAC)
    idx = np.arange(eig.shape[0])
    pk, e = (np.nan_to_num(x, nan=0).astype(int) for x in (peak, end))
    with np.errstate(all="ignore"):
        s3 = np.where(np.isfinite(end), eig[idx, e, 2] / eig[idx, pk, 2], np.nan)
        s2 = np.where(np.isfinite(end), eig[idx, e, 1] / eig[idx, pk, 1], np.nan)
    # the train loss around the end: largest one-epoch |Δ ln loss| over the 25 epochs before it, and 100…50 before
    dl = np.abs(np.diff(np.log(np.asarray(res["train_loss"], float)), axis=-1))  # dl[:, t-1] = change into epoch t
    t = np.arange(1, dl.shape[-1] + 1)

    def step_max(lo, hi):
        m = (t > (end - lo)[:, None]) & (t <= (end - hi)[:, None])
        return np.where(m.any(-1), np.where(m, dl, -np.inf).max(-1), np.nan)

    return {"fire": lockin.slope_fire(r23), "peak": peak, "end": end, "s3_jump": s3, "s2_jump": s2,
            "loss_step": step_max(25, 0), "loss_step_before": step_max(100, 50),
            "r_last": r23[:, -1], "E": r23.shape[-1] - 1, "etas": np.asarray(res["etas"], float)}


FLOOR_RESOLVED = 2.0  # σ₂/σ₃ counts as measured only when σ₃ is at least twice σ₅ (the rounding floor)


def late_floor(res) -> np.ndarray:
    """Per run, the median of σ₃/σ₅ over the second half of the run (the late window). The band of update inner
    products is accumulated in float32, so the bottom of the Gram spectrum flattens at a rounding floor where
    σ₃ ≈ σ₄ ≈ σ₅; a ratio near 1 means σ₃ sits on that floor and σ₂/σ₃ is a bound, not a measurement."""
    W = res.meta["params"]["window"]
    eig = np.asarray(res[f"eigW{W}"], float)
    E = eig.shape[1] - 1
    with np.errstate(all="ignore"):
        return lockin.late_median(eig[..., 2] / eig[..., 4], E // 2, E)


def _num(x: float) -> str:
    """Three significant digits without an exponent for values up to 10⁶ ('1180', '2.13')."""
    return f"{x:.0f}" if 1000 <= abs(x) < 1e6 else f"{x:.3g}"


def _xu_late(eta: float) -> float | None:
    """Xu's late σ₂/σ₃ of the η sweep at ``eta`` (None when he gives none)."""
    from ..published import CH7

    return next((v for k, v in CH7["eta_late"].value.items() if np.isclose(k, eta)), None)


def _sweep_run(Es, eta: float, seed: int) -> int:
    """Index of the η sweep's run at (``eta``, ``seed``)."""
    return int(np.where(np.isclose(Es["etas"], eta) & (np.asarray(Es["seeds"]) == seed))[0][0])


def precision_summary(Es, Pr) -> dict:
    """The float64 reruns beside the η sweep's float32 runs of the same η and seeds: per seed the late σ₂/σ₃
    (second half of the run), σ₃/σ₁ and σ₅/σ₁ (the rounding floor shows as σ₃ ≈ σ₅), and the largest difference of
    test accuracy between the two precisions (the same trajectory when it is small); and both late medians over
    seeds with their standard errors in log space."""
    pp = Pr.meta["params"]
    W = Es.meta["params"]["window"]
    eta = pp["prec_eta"]
    e64 = np.asarray(Pr["eigW"], float)
    E = e64.shape[1] - 1
    seeds = np.asarray(Pr["seeds"])
    idx = [_sweep_run(Es, eta, s) for s in seeds]
    e32 = np.asarray(Es[f"eigW{W}"], float)[idx, :E + 1]

    def late(x):
        with np.errstate(all="ignore"):
            return lockin.late_median(x, E // 2, E)

    out = {"eta": float(eta), "E": E, "seeds": seeds, "n": len(seeds)}
    for tag, e in (("32", e32), ("64", e64)):
        out[f"r23_{tag}"] = late(e[..., 1] / e[..., 2])
        out[f"s3_{tag}"] = late(e[..., 2] / e[..., 0])
        out[f"s5_{tag}"] = late(e[..., 4] / e[..., 0])
        out[f"lm_{tag}"], out[f"se_{tag}"] = log_median(out[f"r23_{tag}"])
    out["dacc"] = np.nanmax(np.abs(np.asarray(Pr["test_acc"], float) - np.asarray(Es["test_acc"], float)[idx, :E + 1]),
                            axis=-1)
    out["xu"] = _xu_late(eta)
    rows = ["| seed | late $\\sigma_2/\\sigma_3$, float32 | float64 | late $\\sigma_3/\\sigma_1$, float32 | float64 | "
            "late $\\sigma_5/\\sigma_1$, float32 | float64 | largest test-accuracy difference |",
            "|---|---|---|---|---|---|---|---|"]
    for i, s in enumerate(seeds):
        rows.append(f"| {int(s)} | {_num(out['r23_32'][i])} | {_num(out['r23_64'][i])} | {out['s3_32'][i]:.1e} | "
                    f"{out['s3_64'][i]:.1e} | {out['s5_32'][i]:.1e} | {out['s5_64'][i]:.1e} | {out['dacc'][i]:.3f} |")
    out["table"] = "\n".join(rows)
    return out


def precision_intro(ps: dict) -> str:
    """Why the float64 reruns: the float32 late ratio beside Xu's, and how close σ₃ is to σ₅ in float32."""
    med = lambda x: float(np.nanmedian(x))  # noqa: E731
    s = (f"At {_eta_tex(ps['eta'])} the late median of our float32 runs (epochs {ps['E'] // 2}–{ps['E']}) is "
         f"{_num(np.exp(ps['lm_32']))}")
    s += f", against Xu's {ps['xu']:g}. " if ps["xu"] is not None else ". "
    s += (f"Late in those runs $\\sigma_3/\\sigma_1$ is {med(ps['s3_32']):.1e} and $\\sigma_5/\\sigma_1$ is "
          f"{med(ps['s5_32']):.1e}")
    floor = med(ps["s3_32"] / ps["s5_32"]) < FLOOR_RESOLVED
    return s + (": the bottom of the spectrum is flat, the mark of a rounding floor." if floor else
                ": at this scale $\\sigma_3$ is still clearly above $\\sigma_5$.")


def precision_sentence(ps: dict) -> str:
    """The float64 check in words."""
    med = lambda x: _num(float(np.nanmedian(x)))  # noqa: E731
    runs = "the run" if ps["n"] == 1 else f"the {ps['n']} runs"
    s = (f"Rerun in float64, {runs} at {_eta_tex(ps['eta'])} (seeds of the sweep) follow{'s' if ps['n'] == 1 else ''} "
         f"the same trajectory (test accuracies within {np.nanmax(ps['dacc']):.3f} of the float32 runs). Their late "
         f"$\\sigma_5/\\sigma_1$ drops from {float(np.nanmedian(ps['s5_32'])):.1e} to "
         f"{float(np.nanmedian(ps['s5_64'])):.1e}, while $\\sigma_3/\\sigma_1$ settles at "
         f"{float(np.nanmedian(ps['s3_64'])):.1e} instead of {float(np.nanmedian(ps['s3_32'])):.1e}.")
    if np.nanmedian(ps["s3_64"] / ps["s3_32"]) < 0.5:
        s += " So in float32, $\\sigma_3$ sat on the rounding floor."
    else:
        s += " Here $\\sigma_3$ is the same in both precisions: it is above the floor."
    s += (f" The late median of $\\sigma_2/\\sigma_3$ is {med(ps['r23_64'])} in float64 against {med(ps['r23_32'])} "
          "in float32")
    s += f" (Xu: {ps['xu']:g})." if ps["xu"] is not None else "."
    return s


def fig_precision(Es, Pr):
    """Seed 0 of the float64 reruns beside its float32 run: σ₃/σ₁ and σ₅/σ₁ of the rolling Gram (left) and
    σ₂/σ₃ (right), float32 dashed, float64 solid."""
    import matplotlib.pyplot as plt

    from .. import plotting

    W = Es.meta["params"]["window"]
    eta = Pr.meta["params"]["prec_eta"]
    s0 = int(np.asarray(Pr["seeds"])[0])
    i32 = _sweep_run(Es, eta, s0)
    e64 = np.asarray(Pr["eigW"], float)[0]
    e32 = np.asarray(Es[f"eigW{W}"], float)[i32, :e64.shape[0]]
    t = np.arange(e64.shape[0])
    fig, ax = plt.subplots(1, 2, figsize=(7.2, 3.0), layout="constrained")
    for e, ls, lab in ((e32, "--", "float32"), (e64, "-", "float64")):
        with np.errstate(all="ignore"):
            ax[0].plot(t, e[:, 2] / e[:, 0], ls, color=plotting.CYCLE[0], label=f"$\\sigma_3/\\sigma_1$, {lab}")
            ax[0].plot(t, e[:, 4] / e[:, 0], ls, color=plotting.CYCLE[1], label=f"$\\sigma_5/\\sigma_1$, {lab}")
            ax[1].plot(t, e[:, 1] / e[:, 2], ls, color=plotting.COLORS["grok"], label=lab)
    ax[0].set(yscale="log", xlabel="epoch", ylabel="eigenvalue / $\\sigma_1$")
    ax[0].legend(fontsize=7)
    ax[1].set(yscale="log", xlabel="epoch", ylabel="$\\sigma_2/\\sigma_3$")
    ax[1].legend()
    return fig


def lock_end_summary(H, Es) -> dict:
    """The headline's grokking arm, and the η sweep per η: lock-ins (a rise of σ₂/σ₃ by ×10), their peak and end
    epochs, and σ₂/σ₃ at the last epoch beside the late medians (ours and Xu's)."""
    S = H.meta["params"]["seeds"]
    g = {k: v[:S] if isinstance(v, np.ndarray) and v.ndim else v for k, v in lock_end(H).items()}
    es = lock_end(Es)
    late = events(Es, Es.meta["params"]["window"])["late"]
    rows = ["| $\\eta$ | lock-ins | peak epoch | ended within the run | end epoch | "
            "$\\sigma_2/\\sigma_3$ at the last epoch | late $\\sigma_2/\\sigma_3$: ours (Xu) |", "|---|---|---|---|---|---|---|"]
    for e_ in Es.meta["params"]["sweep_etas"]:
        sel = np.isclose(es["etas"], e_)
        xv = _xu_late(e_)
        rows.append(f"| ${sci_tex(e_)}$ | {count(es['peak'][sel])} | {epoch_words(es['peak'][sel], '–')} | "
                    f"{count(es['end'][sel])} | {epoch_words(es['end'][sel], '–')} | "
                    f"{_num(np.median(es['r_last'][sel]))} | {_num(np.nanmedian(late[sel]))} "
                    f"({'–' if xv is None else f'{xv:g}'}) |")

    def med(x):
        return float(np.nanmedian(x)) if np.isfinite(x).any() else np.nan

    after = np.isfinite(es["end"]) & (es["fire"] > es["end"])  # the detector fired only after the lock-in ended
    late_fire = [(float(e_), int(after[np.isclose(es["etas"], e_)].sum()), int(np.isclose(es["etas"], e_).sum()))
                 for e_ in Es.meta["params"]["sweep_etas"] if after[np.isclose(es["etas"], e_)].any()]

    still = []  # η whose every lock-in lasts to the last epoch: (η, peak epochs)
    for e_ in Es.meta["params"]["sweep_etas"]:
        sel = np.isclose(es["etas"], e_) & np.isfinite(es["peak"])
        if sel.any() and np.isnan(es["end"][sel]).all():
            xv = _xu_late(e_)
            still.append((float(e_), epoch_words(es["peak"][sel], "–"),
                          float(np.nanmedian(late[np.isclose(es["etas"], e_)])), xv))
    return {"S": S, "E": g["E"], "E_sweep": es["E"], "locked": count(g["peak"]), "still": still, "ended": count(g["end"]),
            "n_ended": int(np.isfinite(g["end"]).sum()), "end": med_str(g["end"]), "peak": med_str(g["peak"]),
            "dur": med_str(g["end"] - g["fire"]), "s3": med(g["s3_jump"]), "s2": med(g["s2_jump"]),
            "loss_step": med(g["loss_step"]), "loss_step_before": med(g["loss_step_before"]),
            "r_last": med_str(g["r_last"]), "table": "\n".join(rows), "late_fire": late_fire}


def still_sentence(ls: dict) -> str:
    """η values of the sweep whose every lock-in lasts to the last epoch, in words."""
    if not ls["still"]:
        return "Every lock-in of the sweep has ended by the last epoch."
    parts = [f"at {_eta_tex(e)} (peak at epoch {pk}; late median {lm:.3g}"
             + ("" if xv is None else f", Xu's {xv:g}") + ")" for e, pk, lm, xv in ls["still"]]
    return (f"The lock-in is still in place at the sweep's last epoch, {ls['E_sweep']}, " + ", ".join(parts)
            + ": there the late median is that of a locked network, and its size depends on how far the lock-in "
            "has risen by the end of the window.")


def late_fire_sentence(ls: dict) -> str:
    """Runs of the η sweep whose detector fired only after their lock-in had ended, in words."""
    if not ls["late_fire"]:
        return "In every run of the sweep with a lock-in, the detector fired before the lock-in ended."
    parts = [f"{k}/{n} runs at {_eta_tex(e)}" for e, k, n in ls["late_fire"]]
    return ("The detector is not always on time: in " + ", ".join(parts) + " it fires only after the lock-in has "
            "ended. There $\\sigma_2/\\sigma_3$ rose to its peak too slowly for a log-slope of 0.04 over 25 epochs, "
            "and a later fluctuation triggered the detector.")


def lock_end_sentence(ls: dict) -> str:
    """The headline's lock-in ending, in words; at a scale whose runs stop before it, says so."""
    if not ls["n_ended"]:
        return (f"Within the {ls['E']} epochs shown here, none of the {ls['S']} grokking runs' lock-ins has ended "
                "(the 25-epoch median of $\\sigma_2/\\sigma_3$ falling below a tenth of its peak).")
    return (f"The lock-in ends before epoch {ls['E']} in {ls['ended']} grokking runs of the headline. The median "
            f"of $\\sigma_2/\\sigma_3$ over the last 25 epochs peaks at epoch {ls['peak']}. It falls below a tenth "
            f"of its peak at epoch {ls['end']}, {ls['dur']} epochs after the detector fired, and at epoch {ls['E']} "
            f"it is {ls['r_last']}. What changes is $\\sigma_3$: from the peak to the end it grows by a median "
            f"factor {ls['s3']:.3g}, while $\\sigma_2$ keeps its slow decay (factor {ls['s2']:.2f}). The train "
            f"loss does not jump: its largest one-epoch change in the 25 epochs before the end is "
            f"{100 * ls['loss_step']:.1f} % (median over runs), against {100 * ls['loss_step_before']:.1f} % "
            "50–100 epochs earlier. The rank-2 structure of the updates breaks while the fit keeps improving "
            "smoothly.")


def fit_sentence(es: dict) -> str:
    """The regression of the ρ crossing on the test-0.5 epoch, or why there is none at this scale."""
    f = es["fit"]
    if not np.isfinite(f["a"]):
        return (f"With {f['n']} grokking {'run' if f['n'] == 1 else 'runs'} in which both events happen, this "
                "profile has too few points for a regression (it needs three with different test-0.5 epochs).")
    return (f"Ours: $t_\\rho$ = {f['a']:.2f} ± {f['a_se']:.2f} $t_{{\\rm test}}$ {f['b']:+.0f} "
            f"($R^2$ = {f['r2']:.2f}, {f['n']} grokking runs).")


def fig_eta(Es, L):
    """Left: median σ₂/σ₃ per η. Middle: ρ crossing against test 0.5 (grokking runs; least-squares line when
    there are enough points). Right: the long run."""
    import matplotlib.pyplot as plt

    from .. import plotting

    ep = Es.meta["params"]
    es = eta_summary(Es)
    ls = long_summary(L)
    ev, gk = es["ev"], es["gk"]
    r23 = lockin.ratios(Es[f"eigW{ep['window']}"])[1]
    fig, ax = plt.subplots(1, 3, figsize=(7.2, 3.0))
    te = np.arange(ep["sweep_epochs"] + 1)
    for k, e_ in enumerate(ep["sweep_etas"]):
        sel = np.isclose(Es["etas"], e_)
        with np.errstate(all="ignore"):
            ax[0].plot(te, np.nanmedian(r23[sel], 0), color=plotting.CYCLE[k], label=_eta_tex(e_))
    ax[0].set(yscale="log", xlabel="epoch", ylabel=r"median $\sigma_2/\sigma_3$")
    fig.legend(*ax[0].get_legend_handles_labels(), loc="outside lower center", ncol=len(ep["sweep_etas"]))
    cols = [plotting.CYCLE[list(np.isclose(ep["sweep_etas"], x)).index(True)] for x in Es["etas"][gk]]
    ax[1].scatter(ev["t05"][gk], ev["t_rho"][gk], c=cols, s=24)
    f = es["fit"]
    if np.isfinite(f["a"]):
        xx = np.linspace(np.nanmin(ev["t05"][gk]), np.nanmax(ev["t05"][gk]), 10)
        ax[1].plot(xx, f["a"] * xx + f["b"], color="k", lw=1)
    ax[1].set(xlabel="epoch of test acc. 0.5", ylabel=r"epoch of $\rho \geq 0.075$")
    tl = np.arange(ls["E"] + 1)
    ax[2].plot(tl, L["test_acc"][0], color=plotting.COLORS["control"])
    ax2 = ax[2].twinx()
    with np.errstate(all="ignore"):
        ax2.plot(tl, np.where(ls["r23"] > 0, ls["r23"], np.nan), color=plotting.COLORS["grok"], lw=1)
    ax2.set(yscale="log")
    ax2.set_ylabel(r"$\sigma_2/\sigma_3$", color=plotting.COLORS["grok"])
    ax2.grid(False)
    ax[2].set(xlabel="epoch", ylabel="test accuracy")
    return fig


def grid_summary(Gd) -> dict:
    """The M × p grid: grok rates, per-run events, its table, and the critical fractions of Tian's two laws."""
    from ..published import CH7

    gM, gp, gE = Gd["grid_M"], Gd["grid_p"], Gd["grid_epochs"]
    gev = runs_table(Gd["test_acc"], Gd["r23"])
    rate = gev["grok"].mean(-1)
    ns = gev["grok"].shape[-1]
    rows = ["| $M$ | $p$ | $n$ | grokked | test 0.99 (median) | slope fires | $\\rho \\ge 0.075$ · epoch | max $\\rho$ |",
            "|---|---|---|---|---|---|---|---|"]
    for i, m in enumerate(gM):
        for j, pp in enumerate(gp):
            rows.append(f"| {m} | {pp:g} | {Gd['n'][i, j]} | {int(gev['grok'][i, j].sum())}/{ns} | "
                        f"{epoch_words(gev['t99'][i, j])} | {count(gev['fire'][i, j])} | "
                        f"{count(Gd['rho_fire'][i, j])} · {epoch_words(Gd['rho_fire'][i, j])} | "
                        f"{np.nanmax(Gd['rho_max'][i, j]):.3f} |")
    c = float(CH7["p_crit_c"])
    gPP, gMM = np.meshgrid(gp, gM)
    return {"gM": gM, "gp": gp, "gE": gE, "gev": gev, "rate": rate, "seeds": ns, "table": "\n".join(rows), "c": c,
            "bound_fit": {cc: int(((gPP > lockin.p_crit(gMM, cc)) == (rate >= 0.5)).sum()) for cc in (1.0, c)}}


def fig_grid(Gd):
    """Grok rate per (M, p) cell with Tian's two boundaries."""
    import matplotlib.pyplot as plt

    gs = grid_summary(Gd)
    gM, gp, gE, rate, gev, c = gs["gM"], gs["gp"], gs["gE"], gs["rate"], gs["gev"], gs["c"]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    X, Y = np.meshgrid(np.arange(len(gM)), gp, indexing="ij")
    sc = ax.scatter(X.ravel(), Y.ravel(), c=rate.ravel(), cmap="RdBu_r", vmin=0, vmax=1, s=700, marker="s",
                    edgecolors="k", linewidths=0.5)
    for i in range(len(gM)):
        for j in range(len(gp)):
            ax.text(i, gp[j], f"{int(gev['grok'][i, j].sum())}/{gs['seeds']}", ha="center", va="center",
                    fontsize=9, color="w" if abs(rate[i, j] - 0.5) > 0.3 else "k")
    mm = np.linspace(min(gM), max(gM), 50)
    xm = np.interp(mm, gM, np.arange(len(gM)))  # the M axis is categorical: place M between its neighbours
    for cc, ls, lab in ((1.0, ":", r"$\ln M/M$"), (c, "--", f"${c:g}\\,\\ln M/M$")):
        ax.plot(xm, lockin.p_crit(mm, cc), "k" + ls, label=lab)
    ax.set_xticks(range(len(gM)), [f"$M = {m}$\n({e} epochs)" for m, e in zip(gM, gE)])
    ax.set(xlim=(-0.6, len(gM) - 0.4), ylim=(0, max(gp) + 0.3), ylabel="training fraction $p$")
    ax.legend(loc="upper center", ncol=2)
    fig.colorbar(sc, ax=ax, label="grok rate (test ≥ 0.99)")
    return fig


def pool_runs(H, Rl, Es, L, Gd) -> list[tuple]:
    """Every run of every experiment: (label, fire, absolute-threshold fire, t05, t99, max slope)."""
    out = []
    for lab, res in (("headline", H), ("ReLU", Rl), ("η sweep", Es), ("η long", L)):
        w = res.meta["params"]["window"]
        r = lockin.ratios(res[f"eigW{w}"])[1]
        e = runs_table(res["test_acc"], r)
        out.append((lab, e["fire"], lockin.threshold_fire(r, 50, ep_min=100), e["t05"], e["t99"], lockin.max_slope(r)))
    gev = runs_table(Gd["test_acc"], Gd["r23"])
    out.append(("M×p grid", gev["fire"].reshape(-1), lockin.threshold_fire(Gd["r23"], 50, ep_min=100).reshape(-1),
                gev["t05"].reshape(-1), gev["t99"].reshape(-1), lockin.max_slope(Gd["r23"]).reshape(-1)))
    return out


def pooled_summary(runs: list[tuple]) -> dict:
    """Confusion tables of the two detectors against grokking over the pooled runs, the per-experiment table,
    the AUC of the largest slope, and the verdict in words."""
    from ..report import fmt

    fire = np.concatenate([r[1] for r in runs])
    absf = np.concatenate([r[2] for r in runs])
    t05 = np.concatenate([r[3] for r in runs])
    t99 = np.concatenate([r[4] for r in runs])
    ms = np.concatenate([r[5] for r in runs])
    grok = np.isfinite(t99)
    conf = ["| detector | runs | TP | FP | FN | TN | sensitivity | specificity | precision |",
            "|---|---|---|---|---|---|---|---|---|"]
    confs = {}
    for name, f_ in (("slope of $\\sigma_2/\\sigma_3$ (Xu)", fire), ("$\\sigma_2/\\sigma_3 \\ge 50$, epoch ≥ 100", absf)):
        c = lockin.confusion(np.isfinite(f_), grok)
        confs[name] = c
        rate = lambda v: fmt(v) if np.isfinite(v) else "undefined"  # noqa: E731
        conf.append(f"| {name} | {len(f_)} | {c['tp']} | {c['fp']} | {c['fn']} | {c['tn']} | {rate(c['sensitivity'])} "
                    f"| {rate(c['specificity'])} | {rate(c['precision'])} |")
    per = ["| experiment | runs | grokked | fired | fired without grokking | grokked without firing |",
           "|---|---|---|---|---|---|"]
    for lab, f_, _, _, t99_, _ in runs:
        g_, fi = np.isfinite(t99_), np.isfinite(f_)
        per.append(f"| {lab} | {f_.size} | {int(g_.sum())} | {int(fi.sum())} | {int((fi & ~g_).sum())} | "
                   f"{int((g_ & ~fi).sum())} |")
    both = np.isfinite(fire) & grok
    c = confs["slope of $\\sigma_2/\\sigma_3$ (Xu)"]
    if both.any():
        lag = (f"Where it fires in a grokking run it does so {med_str(fire[both] - t05[both])} epochs after test "
               f"accuracy 0.5 and {med_str(fire[both] - t99[both])} epochs after 0.99 (median [IQR]); it fired "
               f"before 0.99 in {int((fire[both] < t99[both]).sum())} of {int(both.sum())} such runs. ")
    else:
        lag = ""
    if c["tp"] == 0:
        verdict = ("At this scale the detector never fired in a run that grokked, so here it has no sensitivity "
                   "at all: the rank-2 collapse of the update Gram (visible in the late $\\sigma_2/\\sigma_3$ levels) "
                   "builds up too slowly for a slope threshold calibrated on Xu's $M = 71$, $K = 2048$ runs.")
    elif np.nanmedian(fire[both] - t99[both]) > 0:
        verdict = ("In the grokking runs where it fires it does so after test accuracy has already reached 0.99, "
                   "as in Xu's own headline runs: it confirms lock-in rather than predicting it.")
    else:
        verdict = ("In the grokking runs where it fires it does so before test accuracy reaches 0.99, so it can "
                   "serve as an online marker of the end of the transition.")
    if c["fp"] > 0:
        verdict += (f" It also fired in {c['fp']} {'run' if c['fp'] == 1 else 'runs'} that never grokked, so a "
                    "firing alone does not certify generalisation.")
    n_g, n_ng = int(grok.sum()), int((~grok).sum())
    a = lockin.auc(ms[grok], ms[~grok])
    auc_s = (f"{a:.2f}" if np.isfinite(a) else
             "undefined here, because " + ("no run grokked" if n_g == 0 else "every run grokked"))

    def rate_words(v, what):
        return f"{what} {v:.2f}" if np.isfinite(v) else f"{what} undefined (no {'grokking' if 'sens' in what else 'non-grokking'} runs)"

    return {"conf": "\n".join(conf), "per": "\n".join(per), "confs": confs, "n": int(fire.size), "auc": a,
            "auc_words": auc_s, "lag": lag, "verdict": verdict,
            "rates": rate_words(c["sensitivity"], "sensitivity") + " and " + rate_words(c["specificity"], "specificity")}


def fig_slopes(runs: list[tuple]):
    """Largest log-slope of σ₂/σ₃ after epoch 100 for every run, filled when the run grokked."""
    import matplotlib.pyplot as plt

    from .. import plotting

    fig, ax = plt.subplots(figsize=(7, 3.4))
    for k, (lab, *_, ms) in enumerate(runs):
        g_ = np.isfinite(runs[k][4])
        jit = np.linspace(-0.15, 0.15, len(ms)) if len(ms) > 1 else np.zeros(1)
        ax.scatter(k + jit[g_], ms[g_], color=plotting.COLORS["grok"], s=22, label="grokked" if k == 0 else None)
        ax.scatter(k + jit[~g_], ms[~g_], facecolors="none", edgecolors=plotting.COLORS["control"], s=22,
                   label="did not grok" if k == 0 else None)
    ax.axhline(0.04, color="k", ls=":", lw=1, label="threshold 0.04")
    ax.set_xticks(range(len(runs)), [r[0] for r in runs])
    ax.set(ylabel=r"max$_{t\geq 100}\ s(t)$")
    ax.legend(loc="best")
    return fig


def claims(H, Rl, Es, L, Gd, Pr=None) -> list:
    """The closing table: every number of Xu's (and Tian's constant) this chapter addresses, ours, and agreement
    decided with statistical tolerances (see the notebook's text); rows whose result is not at the published
    scale are not scored."""
    from ..published import CH7
    from ..report import Claim, at_scale, fmt, fmt_pm, within

    hp, rp, ep, lp = (r.meta["params"] for r in (H, Rl, Es, L))
    hs = headline_summary(H)
    rs = relu_summary(H, Rl)
    es = eta_summary(Es)
    ls = long_summary(L)
    gs = grid_summary(Gd)
    S = hs["S"]
    scale_h, scale_r, scale_e = scale_label(H), scale_label(Rl, "relu_seeds"), scale_label(Es, "sweep_seeds")
    head_ok = at_xu_scale(H, seeds=15, epochs_key="epochs", epochs=400)
    relu_ok = at_xu_scale(Rl, seeds_key="relu_seeds", seeds=15, epochs_key="relu_epochs", epochs=800)
    win_ok = at_xu_scale(H, seeds=3, epochs_key="epochs", epochs=400)
    eta_ok = (at_xu_scale(Es, seeds_key="sweep_seeds", seeds=5, epochs_key="sweep_epochs", epochs=600)
              and all(np.isclose(ep["sweep_etas"], e).any() for e in CH7_ETAS))
    grid_ok = (list(gs["gM"]) == [41, 71, 127] and np.allclose(gs["gp"], [0.1, 0.2, 0.3, 0.5]) and gs["seeds"] >= 5
               and list(gs["gE"]) == [400, 600, 1000])
    needs_h, needs_r = "15 seeds per arm, 400 epochs", "15 seeds per arm, 800 epochs"
    P = CH7

    def frac_row(claim, pub, fired, n_claim):
        k, n = int(np.isfinite(fired).sum()), int(np.size(fired))
        kc, nc = pub.value[0], pub.value[1]
        return Claim(claim, pub.source, f"{kc}/{nc}", f"{k}/{n}", fractions_agree(k, n, kc, nc))

    def epoch_row(claim, pub, ours):
        m, q25, q75 = pub.value[-3:]
        tol = epoch_tol(ours, q25, q75, 15)
        med = np.nanmedian(ours) if np.isfinite(ours).any() else np.nan
        return Claim(claim, pub.source, f"{m} [{q25}, {q75}]", epoch_words(ours), within(med, m, tol),
                     f"tolerance ±{tol:.1f} epochs" if np.isfinite(tol) else "")

    rows = []
    r = frac_row("slope detector fires, grok arm", P["fire_grok"], hs["fire_g"], 15)
    rows.append(at_scale(r, scale_h, head_ok, needs_h))
    r = frac_row("slope detector fires, $\\eta = 0$ control", P["fire_ctrl"], hs["fire_c"], 15)
    rows.append(at_scale(r, scale_h, head_ok, needs_h))
    rows.append(at_scale(epoch_row("median fire epoch", P["fire_grok"], hs["fire_g"]), scale_h, head_ok, needs_h))
    rows.append(at_scale(epoch_row("epoch of test accuracy 0.5", P["test05"], hs["t05_g"]), scale_h, head_ok, needs_h))
    k = int(np.isfinite(hs["t99_c"]).sum())
    rows.append(at_scale(Claim("controls reaching test accuracy 0.99", P["ctrl_test"].source, "0/15",
                               f"{k}/{S}", fractions_agree(k, S, 0, 15)), scale_h, head_ok, needs_h))
    lag = hs["fire_g"] - hs["t99_g"]
    lag_med = np.nanmedian(lag) if np.isfinite(lag).any() else np.nan
    rows.append(at_scale(Claim("slope fire minus test-0.99 epoch", P["fire_minus_t99"].source, "≈ +35 epochs",
                               epoch_words(lag, "no run both fired and reached 0.99"), None,
                               "Xu gives no spread" if np.isfinite(lag_med) else ""), scale_h, head_ok, needs_h))
    lg, sg = log_median(hs["late_g"])
    lc, sc = log_median(hs["late_c"])
    ng, nc_ = (n_finite(np.where(hs[k] > 0, hs[k], np.nan)) for k in ("late_g", "late_c"))
    # q of report.median_z: Xu's ≈ 300 taken as exact; his control median from its IQR over 15 runs; the ratio's
    # two medians both over our runs (its published value taken as exact)
    tol_g = median_z(ng, "exact") * sg if ng >= 2 else np.nan
    rows.append(at_scale(Claim("late $\\sigma_2/\\sigma_3$, grok arm", P["late_grok"].source, "≈ 300",
                               fmt(np.exp(lg)), within(lg, np.log(300), tol_g),
                               factor_note(lg, np.log(300), tol_g)),
                         scale_h, head_ok, needs_h))
    c0, c25, c75 = P["late_ctrl"].value
    tol_c = median_z(nc_, 15) * np.hypot(sc, iqr_se(np.log(c25), np.log(c75), 15)) if nc_ >= 2 else np.nan
    rows.append(at_scale(Claim("late $\\sigma_2/\\sigma_3$, control", P["late_ctrl"].source, f"{c0} [{c25}, {c75}]",
                               fmt(np.exp(lc)), within(lc, np.log(c0), tol_c),
                               factor_note(lc, np.log(c0), tol_c)),
                         scale_h, head_ok, needs_h))
    tol_r = median_z(min(ng, nc_), min(ng, nc_)) * np.hypot(sg, sc) if min(ng, nc_) >= 2 else np.nan
    rows.append(at_scale(Claim("late separation grok / control", P["late_ratio"].source, "229×",
                               f"{fmt(np.exp(lg - lc))}×", within(lg - lc, np.log(229), tol_r),
                               factor_note(lg - lc, np.log(229), tol_r)),
                         scale_h, head_ok, needs_h))
    rows.append(at_scale(frac_row("ReLU: slope detector fires", P["relu_fire"], rs["fire_g"], 15), scale_r, relu_ok,
                         needs_r))
    rows.append(at_scale(Claim("ReLU: late separation", P["relu_ratio"].source, "1.4×", f"{fmt(rs['ratio'])}×", None,
                               "Xu does not say over which epochs"), scale_r, relu_ok, needs_r))
    fp_pub = P["window_ctrl_fp"].value
    _, fpos = window_table(H)
    for ws, what in (([w for w in (5, 10) if w in fpos], "$W \\le 10$: false positives in the controls"),
                     ([w for w in (20, 30) if w in fpos], "$W \\ge 20$: false positives in the controls")):
        if not ws:
            continue
        ok = all(fractions_agree(fpos[w], S, fp_pub[w], 3) for w in ws)
        rows.append(at_scale(Claim(what, P["window_ctrl_fp"].source, ", ".join(f"{fp_pub[w]}/3" for w in ws),
                                   ", ".join(f"{fpos[w]}/{S}" for w in ws), ok, "per $W$ = " + ", ".join(map(str, ws))),
                             scale_h, win_ok, "3 seeds per arm, 400 epochs"))
    _, rho_at = rho_table(H)
    rows.append(at_scale(epoch_row("$\\rho_{\\rm tian} \\ge 0.075$: fire epoch", P["rho_fire"], rho_at[0.075]),
                         scale_h, head_ok and hp["gram_every"] == 1, needs_h + ", $\\rho$ every epoch"))
    f = es["fit"]
    a0, _, r2_0 = P["eta_fit"].value
    rows.append(at_scale(Claim("$\\rho$ crossing vs test 0.5: slope", P["eta_fit"].source, f"{a0} ($R^2$ {r2_0})",
                               f"{fmt_pm(f['a'], f['a_se'])} ($R^2$ {fmt(f['r2'])})" if np.isfinite(f["a"])
                               else f"no fit ({f['n']} grokking {'run' if f['n'] == 1 else 'runs'} with both events)",
                               within(f["a"], a0, slope_z(f["n"]) * f["a_se"]) if f["n"] > 2 else None,
                               f"tolerance: {slope_z(f['n']):.2f} standard errors of our slope (t, {f['n'] - 2} d.f.)"
                               if f["n"] > 2 else ""),
                         scale_e, eta_ok, "5 seeds per $\\eta$, 600 epochs"))
    late_e = events(Es, ep["window"])["late"]
    floor_e = late_floor(Es)
    for e_, xv in P["eta_late"].value.items():
        sel = np.isclose(Es["etas"], e_)
        if not sel.any():
            continue
        lm, se = log_median(late_e[sel])
        # Xu's median is over as many seeds as ours, with the same spread (he gives none)
        nq = n_finite(np.where(late_e[sel] > 0, late_e[sel], np.nan))
        tol = median_z(nq, "same") * np.sqrt(2) * se if nq >= 2 else np.nan
        f35 = float(np.nanmedian(floor_e[sel]))
        ps = precision_summary(Es, Pr) if Pr is not None and np.isclose(Pr.meta["params"]["prec_eta"], e_) else None
        if ps is not None and ps["n"] == int(sel.sum()) and ps["E"] == ep["sweep_epochs"]:
            # float64 reruns of every seed: the ratio without the float32 rounding floor
            lm, se = ps["lm_64"], ps["se_64"]
            nq = ps["n"]
            tol = median_z(nq, "same") * np.sqrt(2) * se if nq >= 2 else np.nan
            ok = within(lm, np.log(xv), tol)
            floor = np.nanmedian(ps["s3_64"] / ps["s3_32"]) < 0.5
            note = (f"float64 reruns of all {ps['n']} seeds (float32: {_num(np.exp(ps['lm_32']))}"
                    + (", σ₃ on the rounding floor" if floor else "") + "); "
                    + (factor_note(lm, np.log(xv), tol) + f" ({median_z(nq, 'same'):.1f} × combined s.e. of two "
                       f"{nq}-seed medians)"
                       if np.isfinite(tol) else "one seed: no spread to judge by"))
        elif f35 < FLOOR_RESOLVED:  # σ₃ at the float32 rounding floor: the ratio is a bound, not a measurement
            ok, note = None, (f"not resolved: late $\\sigma_3$ is within ×{f35:.2f} of $\\sigma_5$, the float32 "
                              "rounding floor of our Gram")
            if ps is not None:
                note += f"; float64 reruns of {ps['n']} of {int(sel.sum())} seeds ({ps['E']} epochs) so far"
        else:
            ok = within(lm, np.log(xv), tol)
            note = (factor_note(lm, np.log(xv), tol) + f" ({median_z(nq, 'same'):.1f} × combined s.e. of two "
                       f"{nq}-seed medians)"
                    if np.isfinite(tol) else "one seed: no spread to judge by")
        rows.append(at_scale(Claim(f"$\\eta$ sweep, {_eta_tex(e_)}: late $\\sigma_2/\\sigma_3$ (epochs 300–600)",
                                   P["eta_late"].source, f"{xv:g}", fmt(np.exp(lm)), ok, note),
                             scale_e, eta_ok, "5 seeds per $\\eta$, 600 epochs"))
    one = "one seed: no spread to judge by"
    long_ok = lp["long_epochs"] >= 2000 and at_xu_scale(L, seeds_key=None)
    for key, what, ours in (("long_t_grok", "$\\eta = 10^{-5}$: grokking epoch", ls["t99"]),
                            ("long_t_rho", "$\\eta = 10^{-5}$: $\\rho$ crossing", ls["t_rho"]),
                            ("long_peak", "$\\eta = 10^{-5}$: peak $\\sigma_2/\\sigma_3$", ls["peak"])):
        ours_s = fmt(ours) if np.isfinite(ours) else f"never within {ls['E']} epochs"
        rows.append(at_scale(Claim(what, P[key].source, f"{P[key].value}", ours_s, None, one),
                             f"{scale_label(L, None)} (1 seed, {ls['E']} epochs)",
                             long_ok, "2000 epochs"))
    out = P["grid_outcome"].value
    if grid_ok:
        match = int(((gs["rate"] >= 0.5) == np.array([out[int(m)] for m in gs["gM"]], bool)).sum())
        ours_g, ok_g = f"{match}/12 cells", match == 12
    else:
        ours_g, ok_g = "the grid of this profile has other cells", None
    grid_scale = f"{scale_label(Gd, None)} ({gs['seeds']} {'seed' if gs['seeds'] == 1 else 'seeds'} per cell)"
    rows.append(at_scale(Claim("grid: cells that grok (rate ≥ ½)", P["grid_outcome"].source, "12 cells", ours_g, ok_g,
                               "tolerance: every cell on Xu's side of ½"), grid_scale, grid_ok, "Xu's 12 cells, 5 seeds"))
    k = int(np.isfinite(Gd["rho_fire"]).sum())
    n = int(np.size(Gd["rho_fire"]))
    rows.append(at_scale(Claim("grid: $\\rho \\ge 0.075$ fires in every run", P["grid_rho_fire"].source, "60/60",
                               f"{k}/{n}", fractions_agree(k, n, 60, 60)), grid_scale, grid_ok,
                         "Xu's 12 cells, 5 seeds"))
    bf = gs["bound_fit"]
    rows.append(at_scale(Claim(f"grid: cells on the side of $p_c = {gs['c']:g}\\ln M/M$ that Tian predicts",
                               P["p_crit_c"].source, "–", f"{bf[gs['c']]}/{gs['rate'].size} "
                               f"($\\ln M/M$: {bf[1.0]}/{gs['rate'].size})", None,
                               "Tian publishes the constant, not an outcome to compare"), grid_scale))
    return rows


CH7_ETAS = (1e-05, 5e-05, 0.0001, 0.0002, 0.0005)  # Xu's η sweep
