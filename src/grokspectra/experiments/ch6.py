"""Chapter 6: Tian's modular-addition grokking (Fig. 3) and the repulsion theorem (Theorem 6), brief §1–§3.4.

Experiments (all through the result store):

* :func:`x2runs` — σ = x², seeds 0…S−1 × {η, 0} (paired: each grok run shares split and init with its control),
  Tian's Fig. 3 diagnostics for every run, and the Theorem-6 statistics of the first ``thm6_seeds`` grokking runs
  at ``thm6_epochs`` (weights kept by the engine, so no replay).
* :func:`relu` — the same Theorem-6 statistics for σ = ReLU networks actually trained with ReLU (brief §6.2).
* :func:`identity` — the sign rule as an identity on random matrices (brief §2.3).

``BENCHMARKS["modadd"]`` times 30 runs × 400 epochs with all diagnostics (or extrapolates it from a short run).
"""

from __future__ import annotations

import html
import os
import time

import numpy as np
import torch

from .. import modadd, repulsion
from ..device import device_name, get_device, synchronize
from ..params import Param, Schema
from ..report import Claim, fmt
from .. import sweep
from . import experiment

SECTION = "ch6_repulsion"
SCHEMA = Schema(
    Param("profile", str, help="parameter profile name"),
    Param("device", str, choices=("auto", "cpu", "cuda"), help="where to train"),
    Param("M", int, lo=5, hi=257, help="modulus"),
    Param("K", int, lo=8, hi=8192, help="hidden width"),
    Param("n_train", int, lo=10, hi=66049, help="training pairs"),
    Param("eta", float, lo=1e-7, hi=1.0, help="weight decay of the grokking arm (the control has 0)"),
    Param("seeds", int, lo=1, hi=64, help="seeds 0..seeds-1 for each arm of Fig. 3"),
    Param("epochs", int, lo=10, hi=5000, help="epochs of the x² runs"),
    Param("gram_every", int, lo=1, hi=100, help="Gram diagnostics every this many epochs after gram_dense"),
    Param("gram_dense", int, lo=0, hi=5000, help="Gram diagnostics every epoch up to this epoch"),
    Param("thm6_seeds", int, lo=1, hi=64, help="grokking seeds analysed for Theorem 6 (<= seeds)"),
    Param("thm6_epochs", list, of=int, lo=1, hi=5000, help="checkpoints of the x² Theorem-6 analysis"),
    Param("relu_seeds", int, lo=1, hi=64, help="ReLU seeds (η as above)"),
    Param("relu_epochs", int, lo=10, hi=5000, help="epochs of the ReLU runs"),
    Param("relu_thm6_epochs", list, of=int, lo=1, hi=5000, help="checkpoints of the ReLU Theorem-6 analysis"),
    Param("top_pairs", int, lo=10, hi=5000, help="most similar feature pairs per checkpoint"),
    Param("n_exact", int, lo=0, hi=200, help="pairs checked with the exact leave-two-out projector"),
)

STATS = ("frac_Bneg_pos", "frac_Bneg_neg", "n_pos", "median_abs_sim", "sign_match", "res_rel_err",
         "woodbury_rel_err", "sign_match_xu", "frac_res_xu_sign_is_sim_sign", "exact_sign_rule", "schur_rel_err")
LOGS = ("train_acc", "test_acc", "train_loss", "test_loss", "update_cos", "update_cos_V", "gf_norm_all",
        "gf_norm", "ftf_ratio", "rho_code", "rho_paper")


def _thm6(res: dict, run_idx: list[int], epochs: list[int], u: dict, act: str, device,
          with_pairs: bool) -> dict[str, np.ndarray]:
    """Theorem-6 statistics [len(run_idx), len(epochs)] from the engine's kept weights (and, with
    ``with_pairs``, the most similar pairs of the first of these runs)."""
    out = {f"thm6_{k}": np.full((len(run_idx), len(epochs)), np.nan) for k in STATS}
    if with_pairs:
        out["pairs_sim"] = np.full((len(epochs), u["top_pairs"]), np.nan)
        out["pairs_B"] = np.full((len(epochs), u["top_pairs"]), np.nan)
    for i, r in enumerate(run_idx):
        d = modadd.make_data(u["M"], u["n_train"], int(res["seeds"][r]))
        for e, ep in enumerate(epochs):
            W = res["W_at"][e, r].to(device)
            F = modadd.hidden(W, d["a_tr"], d["b_tr"], act)
            st = repulsion.checkpoint(F, float(res["etas"][r]), top=u["top_pairs"], n_exact=u["n_exact"])
            for k in STATS:
                out[f"thm6_{k}"][i, e] = float(st[k])
            if with_pairs and i == 0:
                out["pairs_sim"][e] = st["sim"].cpu().numpy()
                out["pairs_B"][e] = st["B"].cpu().numpy()
    return out


SEED_BLOCK = 3  # runs per unit: ≈ 1–3 min per unit at paper scale on 2 CPU cores


def _train_thm6(u: dict, device: torch.device) -> dict[str, np.ndarray]:
    """One unit: train a block of runs (one activation, one η) keeping the weights at the Theorem-6 checkpoints,
    log Tian's Fig. 3 diagnostics, and compute Theorem 6 on the runs whose seed is below ``thm6_below``."""
    R = len(u["seeds"])
    eps = u["thm6_epochs"]
    res = modadd.train(u["M"], u["K"], u["n_train"], u["act"], [u["eta"]] * R, u["seeds"], u["epochs"],
                       device=device, gram_every=u["gram_every"], gram_dense=u["gram_dense"],
                       keep_F_epochs=eps if u["thm6_below"] > 0 else [])
    out = {k: res[k].numpy() for k in u["logs"]}
    out.update(gram_epochs=res["gram_epochs"].numpy(), etas=res["etas"].numpy(), seeds=res["seeds"].numpy(),
               train_wall_s=res["wall_s"].numpy().reshape(1))
    idx = [i for i, s in enumerate(u["seeds"]) if s < u["thm6_below"]]
    if idx:
        out.update(_thm6(res, idx, eps, u, u["act"], device, with_pairs=0 in u["seeds"]))
    return out


def _units(p: dict, act: str, arms: list[float], S: int, epochs: int, eps: list[int], thm6_below: list[int],
           gram_every: int, gram_dense: int, logs) -> list[dict]:
    base = {"M": p["M"], "K": p["K"], "n_train": p["n_train"], "act": act, "epochs": epochs, "thm6_epochs": eps,
            "top_pairs": p["top_pairs"], "n_exact": p["n_exact"], "gram_every": gram_every,
            "gram_dense": gram_dense, "logs": list(logs)}
    return [{**base, "eta": eta, "seeds": blk, "thm6_below": below}
            for eta, below in zip(arms, thm6_below) for blk in sweep.blocks(range(S), SEED_BLOCK)]


def _reduce(p: dict, units: list[dict], results: list[dict]) -> dict[str, np.ndarray]:
    """Per-run logs joined in unit order; Theorem-6 rows of the units that have them; the pairs of seed 0."""
    per_run = [{k: v for k, v in r.items() if not k.startswith(("thm6_", "pairs_", "train_wall"))} for r in results]
    out = sweep.concat_runs(per_run, shared=("gram_epochs",))
    thm = [r for r in results if "thm6_sign_match" in r]
    for k in STATS:
        out[f"thm6_{k}"] = np.concatenate([r[f"thm6_{k}"] for r in thm], 0)
    for r in thm:
        if "pairs_sim" in r:
            out["pairs_sim"], out["pairs_B"] = r["pairs_sim"], r["pairs_B"]
    out["thm6_epochs"] = np.array(units[0]["thm6_epochs"])
    out["train_wall_s"] = np.array(sum(float(r["train_wall_s"].sum()) for r in results))
    return out


def _cost(u: dict) -> float:
    return len(u["seeds"]) * u["epochs"] * (1 + 0.5 * (u["thm6_below"] > 0))


def _shrink(u: dict) -> dict:
    return {**u, "seeds": u["seeds"][:1], "epochs": 10, "thm6_epochs": [10], "thm6_below": 0}


def _x2_units(p: dict) -> list[dict]:
    S = p["seeds"]
    if p["thm6_seeds"] > S:
        raise ValueError(f"thm6_seeds={p['thm6_seeds']} exceeds seeds={S}: Theorem 6 reuses the Fig. 3 runs")
    eps = sorted(set(p["thm6_epochs"]))
    if eps[-1] > p["epochs"]:
        raise ValueError(f"thm6_epochs {eps} go beyond epochs={p['epochs']}")
    return _units(p, "x2", [p["eta"], 0.0], S, p["epochs"], eps, [p["thm6_seeds"], 0], p["gram_every"],
                  p["gram_dense"], LOGS)


@experiment(SECTION, keys=["M", "K", "n_train", "eta", "seeds", "epochs", "gram_every", "gram_dense", "thm6_seeds",
                           "thm6_epochs", "top_pairs", "n_exact"], units=_x2_units, reduce=_reduce, cost=_cost,
            shrink=_shrink)
def x2runs(u: dict, device: torch.device) -> dict[str, np.ndarray]:
    """Fig. 3 of {cite}`tian2025li2` (σ = x², η vs 0, seeds 0…S−1) and Theorem 6 on the first ``thm6_seeds``
    grokking runs; one unit per (arm, block of seeds)."""
    return _train_thm6(u, device)


def _relu_units(p: dict) -> list[dict]:
    eps = sorted(set(p["relu_thm6_epochs"]))
    if eps[-1] > p["relu_epochs"]:
        raise ValueError(f"relu_thm6_epochs {eps} go beyond relu_epochs={p['relu_epochs']}")
    R = p["relu_seeds"]
    return _units(p, "relu", [p["eta"]], R, p["relu_epochs"], eps, [R], 50, 0, ("train_acc", "test_acc", "rho_code"))


@experiment(SECTION, keys=["M", "K", "n_train", "eta", "relu_seeds", "relu_epochs", "relu_thm6_epochs", "top_pairs",
                           "n_exact"], units=_relu_units, reduce=_reduce, cost=_cost, shrink=_shrink)
def relu(u: dict, device: torch.device) -> dict[str, np.ndarray]:
    """σ = ReLU runs (η, seeds 0…R−1), trained with ReLU, and their Theorem-6 statistics; one unit per seed
    block."""
    return _train_thm6(u, device)


@experiment(SECTION, keys=["eta"])
def identity(p: dict, device: torch.device) -> dict[str, np.ndarray]:
    """Brief §2.3 on random x² features (n = 40 < K = 56, so F̃ᵀF̃ is singular), every pair j < ℓ, float64:
    max relative gap between B_jℓ and (S⁻¹)_jℓ (Schur complement with the exact P_{η,−jℓ}), the fraction of pairs
    with sgn B_jℓ = −sgn f̃_jᵀP_{η,−jℓ}f̃_ℓ, and max relative gap between f̃_jᵀP_ηf̃_ℓ and −η²B_jℓ, at the chapter's η
    and at η = 1 (features scaled to unit mean column norm)."""
    g = torch.Generator().manual_seed(0)
    n, K = 40, 56
    F = (torch.randn(n, 10, generator=g, dtype=torch.float64) @ torch.randn(10, K, generator=g, dtype=torch.float64)).square()
    Ft = repulsion.centre(F)
    Ft = Ft / Ft.norm(dim=0).mean()
    j, l = torch.triu_indices(K, K, 1)
    out = {}
    for name, eta in (("eta", p["eta"]), ("one", 1.0)):
        B = torch.linalg.inv(Ft.T @ Ft + eta * torch.eye(K, dtype=torch.float64))
        P = eta * torch.linalg.inv(Ft @ Ft.T + eta * torch.eye(n, dtype=torch.float64))
        S2 = repulsion.leave_two_out(Ft, eta, j, l)  # [pairs, 2, 2], exact leave-two-out, batched
        Binv = torch.linalg.inv(S2 + eta * torch.eye(2, dtype=torch.float64))
        Bjl = B[j, l]
        full = (Ft.T @ P @ Ft)[j, l]
        out[f"schur_max_rel_{name}"] = np.array(float(((Binv[:, 0, 1] - Bjl).abs() / Bjl.abs()).max()))
        out[f"sign_rule_frac_{name}"] = np.array(float((torch.sign(Bjl) == -torch.sign(S2[:, 0, 1])).double().mean()))
        out[f"full_identity_max_rel_{name}"] = np.array(float(((full + eta**2 * Bjl).abs() / (eta**2 * Bjl.abs())).max()))
        out[f"n_pairs_{name}"] = np.array(len(j))
    return out


# --- analysis helpers for the notebook ---------------------------------------------------------------------------
def html_table(header: list[str], rows: list[list]) -> str:
    """An HTML table (the book renders glued markdown as CommonMark, which has no pipe tables)."""
    esc = lambda c: html.escape(str(c))
    head = "".join(f"<th>{esc(c)}</th>" for c in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table class='table'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def claims_html(rows: list[Claim]) -> str:
    """The closing claim table as HTML (same columns as :func:`grokspectra.report.table_md`)."""
    return html_table(["claim", "source", "claimed", "ours", "agreement"],
                      [[r.claim, r.source, r.claimed, r.ours, r.mark() + (f" {r.note}" if r.note else "")] for r in rows])


def first_epoch(series: np.ndarray, thr: float, x: np.ndarray | None = None) -> np.ndarray:
    """First epoch (``x[i]``, default i) at which each run's series reaches ``thr``; NaN where it never does."""
    series = np.atleast_2d(np.asarray(series, dtype=float))
    x = np.arange(series.shape[1]) if x is None else np.asarray(x)
    hit = np.nan_to_num(series, nan=-np.inf) >= thr
    return np.where(hit.any(1), x[hit.argmax(1)].astype(float), np.nan)


def _near(ours: float, claimed: float, *, ep: float | None = None, rel: float | None = None, ab: float | None = None):
    """Agreement within an absolute epoch window, a relative or an absolute tolerance; None when ours is NaN."""
    if ours is None or not np.isfinite(ours):
        return None
    if ep is not None:
        return bool(abs(ours - claimed) <= ep)
    if rel is not None:
        return bool(abs(ours - claimed) <= rel * abs(claimed))
    return bool(abs(ours - claimed) <= ab)


def _series_claim(claim, source, table: dict, epochs, values, tol=0.03, note="", min_seeds=1, seeds=1):
    """A claim about a series at checkpoints: compared (±tol) at the checkpoints both have; not compared when
    none is shared or when ours has fewer than ``min_seeds`` seeds (e.g. a 5-seed median)."""
    common = [i for i, e in enumerate(epochs) if int(e) in table]
    claimed = " / ".join(f"{table[k]:g}" for k in table) + " at epochs " + "/".join(str(k) for k in table)
    if not common:
        return Claim(claim, source, claimed, "no common checkpoint in this profile", None, note)
    ours = " / ".join(f"{values[i]:.3f}" for i in common) + " at " + "/".join(str(int(epochs[i])) for i in common)
    if seeds < min_seeds:
        return Claim(claim, source, claimed, ours + f" ({seeds} seed{'s' if seeds > 1 else ''})", None,
                     f"needs ≥ {min_seeds} seeds (paper profile)")
    ok = all(abs(values[i] - table[int(epochs[i])]) <= tol for i in common)
    return Claim(claim, source, claimed, ours, ok, note)


def claims(x2, rl, ident) -> list[Claim]:
    """The closing table: each Tian/Xu number this chapter addresses, ours, and agreement decided here
    (epochs ±5, accuracies and fractions ±0.03, magnitudes ±15%)."""
    S = int(x2.meta["params"]["seeds"])
    T = int(x2.meta["params"]["epochs"])
    g, c = slice(0, S), slice(S, 2 * S)
    gep = x2["gram_epochs"]
    tr1 = first_epoch(x2["train_acc"][g], 1.0)
    tr1p = first_epoch(x2["train_acc"][g], 0.9995)
    te05 = first_epoch(x2["test_acc"][g], 0.5)
    te99 = first_epoch(x2["test_acc"][g], 0.99)
    rho_g = first_epoch(x2["rho_code"][g], 0.075, gep)
    rho_c = first_epoch(x2["rho_code"][c], 0.075, gep)
    gf = x2["gf_norm_all"]
    ctrl_final = float(np.median(x2["test_acc"][c, -1]))
    nseed = f"({S} seed{'s' if S > 1 else ''})"
    rows = [
        Claim("train accuracy reaches 1.0 (η = 2e-4, seed 0)", "Xu findings", "epoch 25",
              f"{fmt(tr1p[0])} (≥ 0.9995, i.e. 1.000 to 3 decimals); exactly 1 at {fmt(tr1[0])}",
              _near(tr1p[0], 25, ep=5) or _near(tr1[0], 25, ep=5),
              f"one training pair stays misclassified from epoch {fmt(tr1p[0])} to {fmt(tr1[0] - 1)}; Xu's 25 falls "
              f"in between; every later milestone below agrees to the epoch"),
        Claim("test accuracy ≥ 0.5 (seed 0)", "Xu findings", "epoch 101", fmt(te05[0]), _near(te05[0], 101, ep=5)),
        Claim("test accuracy ≥ 0.5 across seeds", "Xu findings", "median 102 [99, 102] (15 seeds)",
              f"median {fmt(np.nanmedian(te05))} [{fmt(np.nanpercentile(te05, 25))}, {fmt(np.nanpercentile(te05, 75))}] {nseed}",
              _near(float(np.nanmedian(te05)), 102, ep=5)),
        Claim("test accuracy ≥ 0.99 (seed 0)", "Xu findings", "epoch 139",
              fmt(te99[0]) if np.isfinite(te99[0]) else f"not reached by epoch {T}", _near(te99[0], 139, ep=5)),
        Claim("control (η = 0) stays near chance", "Xu findings", "test ≈ 0.03", f"{ctrl_final:.3f} (median final)",
              _near(ctrl_final, 0.03, ab=0.03)),
        Claim("‖G_F‖ peak, η = 2e-4 (seed 0)", "Xu findings", "71.2 at epoch 57",
              f"{gf[0].max():.1f} at epoch {int(gf[0].argmax())}",
              bool(_near(gf[0].max(), 71.2, rel=0.15) and _near(gf[0].argmax(), 57, ep=5))),
        Claim("‖G_F‖ peak, η = 0 (seed 0)", "Xu findings", "63.6 at epoch 49",
              f"{gf[S].max():.1f} at epoch {int(gf[S].argmax())}",
              bool(_near(gf[S].max(), 63.6, rel=0.15) and _near(gf[S].argmax(), 49, ep=5))),
        Claim("F̃ᵀF̃ off/diag maximum, grok / control (seed 0)", "Xu findings", "0.033 / 0.028",
              f"{np.nanmax(x2['ftf_ratio'][0]):.3f} / {np.nanmax(x2['ftf_ratio'][S]):.3f}",
              bool(_near(np.nanmax(x2["ftf_ratio"][0]), 0.033, rel=0.15) and _near(np.nanmax(x2["ftf_ratio"][S]), 0.028, rel=0.15))),
        Claim("ρ_tian (code) ≥ 0.075: grok fires, control does not", "Xu findings",
              "15/15 at 17 [17, 18]; control 0/15 (max 0.065)",
              f"{int(np.isfinite(rho_g).sum())}/{S} at median {fmt(np.nanmedian(rho_g))}; control "
              f"{int(np.isfinite(rho_c).sum())}/{S} (max {np.nanmax(x2['rho_code'][c]):.3f})",
              bool(np.isfinite(rho_g).all() and _near(float(np.nanmedian(rho_g)), 17, ep=5) and not np.isfinite(rho_c).any())),
    ]
    e6 = x2["thm6_epochs"]
    rows += [
        _series_claim("Thm-6 sign-match, x² seed 0 (Xu's pipeline)", "Xu note", XU_SEED0, e6, x2["thm6_sign_match_xu"][0]),
        _series_claim("Thm-6 sign-match, x² median over seeds", "Xu note / arXiv abstract", XU_MED5, e6,
                      np.median(x2["thm6_sign_match_xu"], 0), min_seeds=5, seeds=x2["thm6_sign_match_xu"].shape[0]),
        _series_claim("frac(B < 0 | cos > 0), x² seed 0", "Xu findings", XU_FRAC0, e6, x2["thm6_frac_Bneg_pos"][0]),
        _series_claim("median |cos| of the top-200 pairs, x² seed 0", "Xu findings", XU_SIM0, e6,
                      x2["thm6_median_abs_sim"][0]),
        Claim("exact P_{η,−jℓ}: sign rule on the most similar pairs", "Xu (verify_proj_approx)", "10/10 (top 10, epoch 175)",
              f"fraction {np.nanmin(x2['thm6_exact_sign_rule']):.3f} (top {int(x2.meta['params']['n_exact'])}, every checkpoint)",
              bool(np.nanmin(x2["thm6_exact_sign_rule"]) == 1.0)),
        Claim("sign-match rises and 'saturates' at lock-in (the theorem becomes true)", "Xu note",
              "0.865 → 0.985 (5 seeds)", f"correct B: {x2['thm6_sign_match'].min():.3f} at every checkpoint",
              False, "an identity: Xu's rise comes from a 1/η² Woodbury factor"),
        Claim("the rise of Xu's x² sign-match is floating-point cancellation", "brief §2.3",
              "cancellation in f̃ − F̃BF̃ᵀf̃",
              f"x², correct B: residual rel. error ≤ {np.nanmax(x2['thm6_res_rel_err']):.1e}, sign-match "
              f"{x2['thm6_sign_match'].min():.3f}", bool(x2["thm6_sign_match"].min() < 1.0),
              f"float64 keeps every x² sign, the 1/η² factor explains the rise; for ReLU cancellation is real "
              f"(correct-B sign-match down to {np.nanmin(rl['thm6_sign_match']):.3f})"),
        Claim("sign rule is an identity (Schur complement; f̃ᵀP_ηf̃ = −η²B)", "brief §2.3 (derived)", "exact",
              f"max rel. error {max(ident.scalar('schur_max_rel_eta'), ident.scalar('full_identity_max_rel_eta')):.1e}, "
              f"sign rule {ident.scalar('sign_rule_frac_eta'):.3f} of pairs",
              bool(ident.scalar("sign_rule_frac_eta") == 1.0 and ident.scalar("schur_max_rel_eta") < 1e-6)),
        _series_claim("Thm-6 sign-match, ReLU seed 0", "Xu note (replay without the activation)", XU_RELU,
                      rl["thm6_epochs"], rl["thm6_sign_match_xu"][0],
                      note="ours trained with ReLU; Xu's 0.91/0.995 equal his x² seed-0 values"),
        Claim("ReLU: ρ_tian fires at epoch 0", "Xu note", "ρ ≥ 0.075 at epoch 0",
              f"ρ(0) = {np.median(rl['rho_code'][:, 0]):.3f} (median)", bool(np.median(rl["rho_code"][:, 0]) >= 0.075)),
    ]
    return rows


XU_SEED0 = {50: 0.83, 100: 0.91, 175: 0.975, 250: 0.975, 300: 0.995}
XU_MED5 = {50: 0.865, 100: 0.895, 175: 0.955, 250: 0.970, 300: 0.985}
XU_FRAC0 = {50: 0.83, 100: 0.91, 175: 0.97, 250: 0.97, 300: 0.99}
XU_SIM0 = {50: 0.20, 100: 0.22, 175: 0.40, 250: 0.59, 300: 0.64}
XU_RELU = {100: 0.91, 300: 0.995, 500: 1.000}


# --- benchmark -------------------------------------------------------------------------------------------------
def modadd_floor(R: int, M: int, K: int, n: int, device: torch.device, reps: int = 3) -> dict[str, float]:
    """The floor of one training epoch of R runs, measured here with plain torch calls of the engine's sizes:
    the FLOP-bound products (forward on all M² pairs, [M²,K]·[K,M]; the three backward products of n×K) and the
    memory-bound pass that builds the M²×K pre-activation grid; and, separately, one Gram diagnostic (FᵀF, n×K,
    of which a symmetric product needs only half: timed as the full product / 2). Seconds per run-epoch (best of
    ``reps``)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    mk = lambda *shape: torch.randn(*shape, generator=g).to(device)  # noqa: E731
    Wt, V = mk(R, 2 * M, K), mk(R, M, K)
    grid = torch.empty(R, M, M, K, device=device)
    H = grid.view(R, M * M, K)
    F, dO, XT = mk(R, n, K), mk(R, n, M), mk(R, 2 * M, n)

    def best(fn) -> float:
        fn()
        out = float("inf")
        for _ in range(reps):
            synchronize(device)
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            out = min(out, time.perf_counter() - t0)
        return out / R

    t_grid = best(lambda: torch.add(Wt[:, :M, None, :], Wt[:, None, M:, :], out=grid))
    t_fwd = best(lambda: torch.bmm(H, V.transpose(1, 2)))
    t_bwd = best(lambda: (torch.bmm(dO.transpose(1, 2), F), torch.bmm(XT, torch.bmm(dO, V))))
    t_gram = best(lambda: torch.bmm(F.transpose(1, 2), F)) / 2
    return {"grid_s": t_grid, "forward_s": t_fwd, "backward_s": t_bwd, "epoch_floor_s": t_grid + t_fwd + t_bwd,
            "gram_floor_s": t_gram}


def bench_modadd(device: str = "auto", quick: bool = False) -> dict:
    """30 runs × 400 epochs of the Fig. 3 configuration with every diagnostic and the width-20 update band of
    chapter 7: losses, accuracies, ‖G_F‖ and update cosines every epoch, the Gram diagnostics every epoch up to
    epoch 60 (where ρ_tian can fire) and every 10 epochs after.

    ``quick``: 2 runs × 8 epochs, once with the Gram diagnostics on every epoch and once with none; the two
    per-run-epoch costs are combined with the Gram schedule of the full benchmark to extrapolate its time.
    """
    dev = get_device(device)
    M, K, n, E, runs = 71, 2048, 2016, 400, 30
    GE, GD = 10, 60
    n_gram = len(modadd.gram_schedule(E, GE, GD))
    c0 = time.process_time()
    extra: dict = {}
    if quick:
        R, T = 2, 8

        def timed(**kw):
            synchronize(dev)
            t0, c0_ = time.perf_counter(), time.process_time()
            modadd.train(M, K, n, "x2", [2e-4, 0.0], [0, 0], kw.pop("T", T), device=dev, band=20, progress=False, **kw)
            synchronize(dev)
            return np.array([time.perf_counter() - t0, time.process_time() - c0_])

        timed(T=1, gram_every=1, gram_dense=1)  # warm-up
        plain = timed(gram_every=10**6, gram_dense=0) / (R * (T + 1))  # Grams only at epochs 0 and T
        full = timed(gram_every=1, gram_dense=T) / (R * (T + 1))
        gram = (full - plain) * (T + 1) / (T + 1 - 2)
        est = runs * ((E + 1) * plain + (n_gram - 2) * gram)  # [wall, process CPU]
        total = float(est[0])
        threads = torch.get_num_threads() if dev.type == "cpu" else 1
        extra["cpu_time_estimate_s"] = round(float(est[1]) / threads, 1)
        extra["cpu_time_estimate_note"] = (f"process CPU time / {threads} threads: the wall time on {threads} "
                                           "otherwise idle cores if the work parallelised perfectly")
        measured = (f"extrapolated from {R} runs x {T} epochs (wall {plain[0] * 1e3:.0f} ms per run-epoch, "
                    f"{gram[0] * 1e3:.0f} ms per Gram; CPU {plain[1] * 1e3:.0f} ms and {gram[1] * 1e3:.0f} ms)")
    else:
        seeds = list(range(15)) * 2
        etas = [2e-4] * 15 + [0.0] * 15
        synchronize(dev)
        t0 = time.perf_counter()
        modadd.train(M, K, n, "x2", etas, seeds, E, device=dev, gram_every=GE, gram_dense=GD, band=20, progress=False)
        synchronize(dev)
        total = time.perf_counter() - t0
        measured = "measured"
    per = total / (runs * E)
    cpu = time.process_time() - c0
    fl = modadd_floor(2 if quick else runs, M, K, n, dev)
    floor_total = runs * ((E + 1) * fl["epoch_floor_s"] + n_gram * fl["gram_floor_s"])
    extra.update({"floor_s_per_run_epoch": round(fl["epoch_floor_s"], 5), "floor_s_per_gram": round(fl["gram_floor_s"], 5),
                  "floor_total_s": round(floor_total, 2), "ratio_to_floor": round(total / floor_total, 2),
                  "floor_note": "plain torch products and grid pass of the engine's sizes, measured in this run"})
    return {
        "benchmark": "modadd: 30 runs x 400 epochs (M=71, K=2048, n=2016, x2) with all diagnostics",
        "device": device_name(dev), "how": measured, "gram_epochs_per_run": n_gram,
        "total_s": round(total, 2), "process_cpu_s_of_this_command": round(cpu, 2),
        "gram_schedule": f"every epoch to {GD}, then every {GE}", "s_per_run_epoch": round(per, 5), "s_per_400_epoch_run": round(per * E, 3),
        "target_s": 1200 if dev.type == "cpu" else 10,
        "load_avg_1min": round(os.getloadavg()[0], 2),  # > core count: other processes shared the CPU
        **extra,
    }


BENCHMARKS = {"modadd": bench_modadd}
