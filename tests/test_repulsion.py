"""Theorem 6 machinery: Woodbury B against a direct inverse, and the sign rule as an exact identity."""

import itertools

import pytest
import torch

from grokspectra import repulsion


def features(n=40, K=56, seed=0, act="x2"):
    """Random x² (or ReLU) features of one-hot pairs, like the network's F (n < K, so F̃ᵀF̃ is singular)."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 12, generator=g, dtype=torch.float64)
    W = torch.randn(12, K, generator=g, dtype=torch.float64)
    Z = X @ W
    return Z.square() if act == "x2" else Z.relu()


@pytest.mark.parametrize("eta", [1e-2, 1.0, 30.0])
def test_woodbury_matches_direct_inverse(eta):
    Ft = repulsion.centre(features())
    K = Ft.shape[1]
    direct = torch.linalg.inv(Ft.T @ Ft + eta * torch.eye(K, dtype=torch.float64))
    B = repulsion.woodbury_B(Ft, eta)
    # relative to the largest entry 1/η; the kernel's condition number is ‖F̃‖²/η ≤ 1e6 here, so 1e-8 is ample
    assert (B - direct).abs().max() / direct.abs().max() < 1e-8
    j, l = torch.tensor([0, 3, 7]), torch.tensor([1, 9, 2])
    torch.testing.assert_close(repulsion.B_entries(Ft, eta, j, l), direct[j, l], rtol=1e-7, atol=1e-12 / eta)
    # Xu's 1/η² factor: off-diagonal entries are the true ones divided by η (so the same signs), diagonal differs
    Bx = repulsion.woodbury_B(Ft, eta, xu_factor=True)
    off = ~torch.eye(K, dtype=torch.bool)
    torch.testing.assert_close(Bx[off] * eta, direct[off], rtol=1e-6, atol=1e-9 * float(direct.abs().max()))


def test_sign_rule_is_an_identity_on_random_matrices():
    """For every pair: B block = S⁻¹ (2×2 Schur complement with the exact leave-two-out projector), hence
    sgn B_jℓ = −sgn f̃_jᵀP_{η,−jℓ}f̃_ℓ; and f̃_jᵀP_ηf̃_ℓ = −η²B_jℓ with P_η from its own formula η(F̃F̃ᵀ+ηI)⁻¹."""
    for seed, act, eta in [(1, "x2", 0.3), (2, "relu", 0.05), (3, "x2", 5.0)]:
        Ft = repulsion.centre(features(n=30, K=24, seed=seed, act=act))
        n, K = Ft.shape
        B = torch.linalg.inv(Ft.T @ Ft + eta * torch.eye(K, dtype=torch.float64))
        P = eta * torch.linalg.inv(Ft @ Ft.T + eta * torch.eye(n, dtype=torch.float64))
        for j, l in itertools.combinations(range(K), 2):
            keep = [c for c in range(K) if c not in (j, l)]
            Fm = Ft[:, keep]
            Pm = torch.eye(n, dtype=torch.float64) - Fm @ torch.linalg.inv(Fm.T @ Fm + eta * torch.eye(K - 2, dtype=torch.float64)) @ Fm.T
            s_jl = Ft[:, j] @ Pm @ Ft[:, l]
            torch.testing.assert_close(repulsion.leave_two_out(Ft, eta, j, l)[0, 1], s_jl, rtol=1e-7, atol=1e-10)
            block = repulsion.schur_B_block(Ft, eta, j, l)
            torch.testing.assert_close(block, B[[j, l]][:, [j, l]], rtol=1e-7, atol=1e-12)
            assert torch.sign(B[j, l]) == -torch.sign(s_jl)
            torch.testing.assert_close(Ft[:, j] @ P @ Ft[:, l], -eta**2 * B[j, l], rtol=1e-7, atol=1e-12)


def test_top_pairs_match_brute_force():
    Ft = repulsion.centre(features(seed=4))
    j, l, sim = repulsion.top_pairs(Ft, 15)
    K = Ft.shape[1]
    cos = {(a, b): float(Ft[:, a] @ Ft[:, b] / (Ft[:, a].norm() * Ft[:, b].norm()))
           for a, b in itertools.combinations(range(K), 2)}
    best = sorted(cos, key=lambda p: -abs(cos[p]))[:15]
    assert list(zip(j.tolist(), l.tolist())) == best
    torch.testing.assert_close(sim, torch.tensor([cos[p] for p in best], dtype=torch.float64))


def test_checkpoint_statistics():
    """On random x² features: the exact leave-two-out rule holds for every checked pair; Woodbury and Cholesky
    B entries agree; Xu's residual is dominated by rounding at small η (its relative error is not small)."""
    F = features(n=60, K=90, seed=5).float()
    out = repulsion.checkpoint(F, 2e-4, top=40, n_exact=6)
    assert out["exact_sign_rule"] == 1.0
    assert out["schur_rel_err"] < 1e-6
    assert out["woodbury_rel_err"] < 1e-6
    assert 0 <= out["frac_Bneg_pos"] <= 1 and 0 <= out["sign_match"] <= 1
    assert out["sim"].shape == (40,) and (out["sim"][:-1].abs() >= out["sim"][1:].abs()).all()


def test_bad_input():
    Ft = repulsion.centre(features())
    with pytest.raises(ValueError, match="η > 0"):
        repulsion.woodbury_B(Ft, 0.0)
    with pytest.raises(ValueError, match="off-diagonal"):
        repulsion.B_entries(Ft, 1.0, torch.tensor([1]), torch.tensor([1]))
    with pytest.raises(ValueError, match="top"):
        repulsion.top_pairs(Ft, 10**6)
