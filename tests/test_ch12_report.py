"""The analysis helpers of chapters 1 and 2 (observables, z-scores, claims tables) on small synthetic results."""

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

from grokspectra.experiments import ch1, ch2
from grokspectra.store import Result


def _traj(rng, T=8, ds=(100, 400), seeds=6, reps=4, noise=0.05):
    arrays = {}
    base_M = np.linspace(0.5, 1.2, T + 1)[:, None, None] * np.ones((1, 1, 2))
    base_Q = np.linspace(1, 4, T + 1)[:, None, None] * np.eye(2)
    base_r = np.linspace(1, 0.5, T + 1)

    def block(prefix, n, scale):
        arrays[f"{prefix}_M"] = base_M + scale * rng.normal(size=(n, T + 1, 1, 2))
        arrays[f"{prefix}_Q"] = base_Q + scale * rng.normal(size=(n, T + 1, 2, 2))
        arrays[f"{prefix}_train"] = base_r + scale * rng.normal(size=(n, T + 1))
        arrays[f"{prefix}_test"] = base_r + 0.1 + scale * rng.normal(size=(n, T + 1))

    block("dm", reps, 0.001)
    block("nm", reps, 0.001)
    arrays["nm_Q"] = arrays["nm_Q"] * 5  # memory off: far away
    arrays["nm_train"] = arrays["nm_train"] * 5
    for d in ds:
        block(f"gd{d}", seeds, noise * (100 / d) ** 0.5)
    meta = {"profile": "ci", "params": {"T": T, "ds": list(ds), "seeds": seeds, "N": 1000, "reps": reps}}
    return Result(arrays, meta)


def _eh(rng, T=5, ds=(100, 400), seeds=6):
    arrays = {"pr_dm_M": np.zeros((T + 1, 1, 2)), "pr_plain_M": 0.01 * rng.normal(size=(T + 1, 1, 2)),
              "st_dm_M": np.stack([np.linspace(0, 1, T + 1)[:, None] * np.ones((1, 2)), np.zeros((T + 1, 2))], 1),
              "st_dm_train": np.linspace(1, 0.5, T + 1), "st_dm_test": np.linspace(1, 0.8, T + 1)}
    for d in ds:
        arrays[f"pr_gd{d}_M"] = rng.normal(size=(seeds, T + 1, 1, 2)) / np.sqrt(d)
        st = rng.normal(size=(seeds, T + 1, 2, 2)) / np.sqrt(d)
        st[:, :, 0, :] += np.linspace(0, 1, T + 1)[None, :, None]
        arrays[f"st_gd{d}_M"] = st
        arrays[f"st_gd{d}_train"] = np.tile(np.linspace(1, 0.5, T + 1), (seeds, 1))
        arrays[f"st_gd{d}_test"] = np.tile(np.linspace(1, 0.8, T + 1), (seeds, 1))
    return Result(arrays, {"profile": "ci", "params": {"T_eh": T, "ds_eh": list(ds), "N_eh": 1000}})


def test_obs_and_z_score():
    rng = np.random.default_rng(0)
    M, Q = rng.normal(size=(3, 5, 1, 2)), rng.normal(size=(3, 5, 2, 2))
    o = ch1.obs(M, Q, np.zeros((3, 5)), np.ones((3, 5)))
    assert o.shape == (3, 5, 6) and np.allclose(o[..., 5], 1)
    a, b = rng.normal(size=(400, 2)), rng.normal(size=(400, 2)) + [0, 1]
    z = ch1.z_score(a, b)
    assert z[0] < 4 and z[1] > 5


def test_ch1_claims_on_synthetic_results():
    rng = np.random.default_rng(1)
    traj, eh = _traj(rng), _eh(rng)
    ts = ch1.traj_summary(traj)
    assert ts["dmax"] == 400 and ts["gaps"].shape == (2, 2)
    rows = ch1.claims(traj, eh)
    assert len(rows) == 8
    assert all(r.scale.startswith("CI: $d$") for r in rows)
    assert all("bri" "ef" not in (r.source + r.note).lower() for r in rows)
    by = {r.claim: r for r in rows}
    assert by["memory terms are needed"].agree is True
    assert by["phase retrieval: DMFT $M_t \\equiv 0$ (antithetic)"].agree is True
    for f in (ch1.fig_traj(ts), ch1.fig_gap(ts), ch1.fig_memory(ts), ch1.fig_easy_hard(eh)):
        assert f.get_size_inches()[0] <= 7.2
        matplotlib.pyplot.close(f)


def _bulk():
    nd, nt, nx = 2, 2, 20
    xs = np.tile(np.linspace(-0.1, 1, nx), (nd, nt, 1))
    edge = np.array([[-0.09, -0.05], [-0.08, -0.04]])
    arrays = {"deltas": np.array([3.0, 6.0]), "times": np.array([8, 20]), "xs": xs,
              "rho_emp": np.ones((nd, nt, nx)), "rho_dmft": np.ones((nd, nt, nx)),
              "eigs": np.concatenate([edge[..., None] - 0.005, np.ones((nd, nt, 9))], -1),
              "edge_dens_emp": edge * 1.02, "edge_dens_dmft": edge, "edge_emp": edge * 1.1, "edge_dmft": edge * 1.1,
              "hard": np.zeros((nd, nt, 3)), "phi_dmft": np.ones((nd, nt)), "dmft_hard": np.zeros(3),
              "out_dmft": np.full((nd, nt), np.nan), "ov_dmft": np.full((nd, nt), np.nan)}
    # ten DMFT sub-laws per panel around the empirical edge, relative spread 2 %
    spread = np.linspace(-1.5, 1.5, 10) / np.std(np.linspace(-1.5, 1.5, 10), ddof=1)
    arrays["sub_edges"] = np.concatenate([(edge * 1.02)[..., None] * (1 + 0.02 * spread), np.full((nd, nt, 2), np.nan)], -1)
    return Result(arrays, {"profile": "ci", "params": {"d": 500, "N": 30000}})


def _caveat(profile="ci", d=500):
    return Result({"loc": np.array([0.8, 0.6]), "loc_bounded": np.array([0.1, 0.1])},
                  {"profile": profile, "params": {"d": d}})


def test_ch2_table_and_claims():
    B, C = _bulk(), _caveat()
    t = ch2.edge_table(B)
    assert t.splitlines()[1].startswith("|---") and len(t.splitlines()) == 6
    lt = ch2.lowest_table(B)
    assert lt.splitlines()[1].startswith("|---") and len(lt.splitlines()) == 6 and "nan" not in lt
    rows = ch2.claims(B, C)
    assert [r.agree for r in rows] == [True, True, True]
    assert all(r.scale == "CI: $d$ = 500" for r in rows)
    e = ch2.edge_summary(B)
    assert e["rel"].max() == pytest.approx(0.02)
    assert "every panel" in ch2.outlier_sentence(B) and "nan" not in ch2.gap_sentence(B)
    assert ch2.claims(B, _caveat("paper", 1500))[-1].scale == "paper: $d$ = 1500"  # the caveat's own scale


def test_ch2_edge_test_is_a_prediction_interval_over_the_panels():
    """The empirical edge is compared with K DMFT sub-laws of its size: t = (e − μ)/(s·√(1 + 1/K)) against the
    Student quantile at 5 %/(2·panels); a panel 5 s.d. away fails, and panels with fewer than 3 sub-laws leave
    the row unscored rather than judged."""
    from scipy.stats import t as student

    B = _bulk()
    et = ch2.edge_test(B)
    assert (et["K"] == 10).all() and np.allclose(et["t"], 0, atol=1e-12)
    assert np.allclose(et["sd"], 0.02 * np.abs(B["edge_dens_emp"]))
    assert et["bound"][0, 0] == pytest.approx(student.ppf(1 - 0.05 / 8, 9))
    assert ch2.claims(B, _caveat())[0].agree is True
    B.arrays["edge_dens_emp"][1, 1] *= 1 + 5 * 0.02 * np.sqrt(1.1)  # 5 s.d. of a new draw beyond the mean
    assert abs(ch2.edge_test(B)["t"][1, 1]) == pytest.approx(5, rel=1e-9)
    row = ch2.claims(B, _caveat())[0]
    assert row.agree is False and "δ = 6, $t$ = 20" in row.ours
    B.arrays["sub_edges"][0, 0, 2:] = np.nan  # two sub-laws only: no test
    row = ch2.claims(B, _caveat())[0]
    assert row.agree is None and "fewer than 3" in row.note
    assert "–" in ch2.edge_table(B).splitlines()[2]


def test_ch2_predicted_outliers_are_compared_with_gd():
    """A panel where the outlier function is negative at the edge is taken out of the edge comparison and compared
    with its predicted outlier instead: eigenvalue and hard overlap within d^(-1/2)-scaled tolerances (✓), and a
    miss by more than that is ✗; the edge tolerance shrinks like d^(-2/3)."""
    B = _bulk()
    B.arrays["eigs"][1, 0, 0] = -0.2  # far below the edge -0.08 ...
    B.arrays["out_dmft"][1, 0] = -0.201  # ... where an outlier is predicted
    B.arrays["ov_dmft"][1, 0] = 0.40
    B.arrays["hard"][1, 0, 0] = 0.42
    B.arrays["phi_dmft"][1, 0] = -0.05
    rows = ch2.claims(B, _caveat())
    assert [r.agree for r in rows] == [True, True, True, True]
    assert "1 of the 4 panels" in ch2.outlier_sentence(B) and "δ = 6, t = 8" in ch2.outlier_sentence(B)
    B.arrays["hard"][1, 0, 0] = 0.40 + 2.5 / np.sqrt(500)  # the overlap misses by more than 2/√d
    assert ch2.claims(B, _caveat())[2].agree is False
    assert ch2.tol_gap(4000) == pytest.approx(0.02 / 4) and ch2.tol_outlier(2000)[1] == pytest.approx(2 / np.sqrt(2000))


def test_compact_claims_table():
    from grokspectra import report

    r = report.at_scale(report.Claim("a|b", "src", "1", "2", None), "CI", comparable=False, needs="15 seeds")
    t = report.table_md_compact([r]).splitlines()
    assert t[1] == "|---|---|---|---|" and "a\\|b (src)" in t[2] and "not comparable at CI" in t[2]


def test_claims_block_is_a_myst_table_of_class_claims():
    """The stylesheet widens `table.claims` on phones; the block must carry the class and the table unchanged."""
    from grokspectra import report

    t = report.table_md_compact([report.Claim("c", "src", "1", "1", True)])
    lines = report.claims_block(t).splitlines()
    assert lines[:3] == ["```{table}", ":class: claims", ""] and lines[-1] == "```"
    assert "\n".join(lines[3:-1]) == t


def test_fmt_pm_rounds_the_value_at_the_second_digit_of_its_error():
    from grokspectra.report import fmt_pm
    assert fmt_pm(0.570, 0.0045) == "0.5700 ± 0.0045"
    assert fmt_pm(1.2113, 0.0128) == "1.211 ± 0.013"
    assert fmt_pm(-0.5103, 0.057) == "-0.510 ± 0.057"
    assert fmt_pm(1234.5, 12.3) == "1234 ± 12"
    assert fmt_pm(0.5, 0.0996) == "0.50 ± 0.10"  # the error rounds up to a new digit
    assert fmt_pm(3.7, float("nan")) == "3.7 ± –"  # no error: the value as fmt gives it
    assert fmt_pm(1e-5, 1e-6) == "1.00e-05 ± 1.0e-06"


def test_caveat_law_keeps_only_the_distinct_half_of_the_antithetic_paths():
    """Phase retrieval from random init: path n + N/2 of the DMFT carries the same weight D as path n (its mirror),
    so a law of N antithetic paths has N/2 distinct samples; ch2.caveat's law sizes count distinct samples."""
    import torch
    from grokspectra import dmft, multiindex as mi
    from grokspectra.experiments import ch2
    r = dmft.run_dmft("gelu", "pr", 6.0, 2.0, 5, 400, 2, keep=[5], generator=0)
    law = r["law"][5]
    G = mi.per_sample_D(law["u"], law["y"], "gelu")
    assert torch.equal(G[:200], G[200:])  # the mirrors duplicate the weights exactly
    Gd = ch2.distinct_half(G)
    assert Gd.shape[0] == 200 and torch.unique(Gd.reshape(200, -1), dim=0).shape[0] == 200
