"""The batched modular-addition engine against a plain single-run PyTorch implementation (autograd + Adam)."""

import math

import pytest
import torch

from grokspectra import modadd

M, K, N, EPOCHS = 11, 32, 50, 60


class Net(torch.nn.Module):
    """Tian's network as one would write it with torch.nn (the reference)."""

    def __init__(self, M, K, act):
        super().__init__()
        self.M, self.act = M, act
        self.W = torch.nn.Linear(2 * M, K, bias=False)
        self.V = torch.nn.Linear(K, M, bias=False)

    def hidden(self, a, b):
        x = torch.cat([torch.nn.functional.one_hot(a, self.M), torch.nn.functional.one_hot(b, self.M)], 1)
        z = self.W(x.to(self.W.weight.dtype))
        return {"x2": z.square(), "relu": torch.relu(z), "gelu": torch.nn.functional.gelu(z),
                "silu": torch.nn.functional.silu(z)}[self.act]

    def forward(self, a, b):
        return self.V(self.hidden(a, b))


def reference(act, eta, seed, epochs, dtype, keep=()):
    """Train one run alone with torch.optim.Adam(weight_decay=eta) and autograd; log like the engine."""
    d = modadd.make_data(M, N, seed)
    torch.manual_seed(seed)
    net = Net(M, K, act).to(dtype)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, weight_decay=eta)
    logs = {"train_loss": [], "test_acc": [], "train_acc": [], "F": {}, "W": {}, "dW": []}
    for t in range(epochs + 1):
        with torch.no_grad():
            out = net(d["a_tr"], d["b_tr"])
            logs["train_loss"].append(float(modadd.tian_loss(out, d["y_tr"], M)))
            logs["train_acc"].append(float((out.argmax(1) == d["y_tr"]).double().mean()))
            logs["test_acc"].append(float((net(d["a_te"], d["b_te"]).argmax(1) == d["y_te"]).double().mean()))
            logs["F"][t] = net.hidden(d["a_tr"], d["b_tr"]).double()
            logs["W"][t] = net.W.weight.detach().clone()
            logs.setdefault("V", {})[t] = net.V.weight.detach().clone()
        if t == epochs:
            break
        opt.zero_grad()
        modadd.tian_loss(net(d["a_tr"], d["b_tr"]), d["y_tr"], M).backward()
        before = net.W.weight.detach().clone()
        opt.step()
        logs["dW"].append((net.W.weight.detach() - before).flatten().double())
    return d, logs


def test_init_matches_nn_linear_bitwise():
    torch.manual_seed(3)
    w = torch.nn.Linear(2 * M, K, bias=False).weight.detach()
    v = torch.nn.Linear(K, M, bias=False).weight.detach()
    W, V = modadd.init_weights(M, K, 3)
    assert torch.equal(W, w) and torch.equal(V, v)


def test_make_data_is_a_seeded_partition():
    d = modadd.make_data(M, N, 5)
    pairs = torch.cat([d["a_tr"] * M + d["b_tr"], d["a_te"] * M + d["b_te"]])
    assert torch.equal(pairs.sort().values, torch.arange(M * M))
    assert torch.equal(d["y_tr"], (d["a_tr"] + d["b_tr"]) % M)
    assert torch.equal(modadd.make_data(M, N, 5)["a_tr"], d["a_tr"])
    assert not torch.equal(modadd.make_data(M, N, 6)["a_tr"], d["a_tr"])
    with pytest.raises(ValueError, match="n_train"):
        modadd.make_data(M, M * M, 0)


@pytest.mark.parametrize("act", ["x2", "relu", "gelu", "silu"])
def test_batched_runs_match_single_adam_float64(act):
    """Each run of one batched call (mixed seeds and weight decays, incl. η = 0) equals the same run trained
    alone with autograd + torch.optim.Adam, over 60 epochs. float64: differences are rounding only (1e-9)."""
    seeds, etas = ([0, 1, 2], [2e-4, 0.0, 5e-2]) if act == "x2" else ([1, 2], [0.0, 5e-2])
    keep = [0, 17, EPOCHS]
    res = modadd.train(M, K, N, act, etas, seeds, EPOCHS, device="cpu", dtype=torch.float64, band=4,
                       keep_F_epochs=keep, progress=False, chunk=2)
    for r, (s, e) in enumerate(zip(seeds, etas)):
        d, ref = reference(act, e, s, EPOCHS, torch.float64)
        for i, t in enumerate(keep):
            torch.testing.assert_close(res["W_at"][i, r], ref["W"][t], rtol=0, atol=1e-9)
            torch.testing.assert_close(res["V_at"][i, r], ref["V"][t], rtol=0, atol=1e-9)
        torch.testing.assert_close(res["train_loss"][r], torch.tensor(ref["train_loss"], dtype=torch.float64),
                                   rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(res["test_acc"][r], torch.tensor(ref["test_acc"], dtype=torch.float64))
        torch.testing.assert_close(res["train_acc"][r], torch.tensor(ref["train_acc"], dtype=torch.float64))
        # band and update cosine from the reference's stored updates
        D = torch.stack(ref["dW"])  # row t-1 = ΔW_t
        for t in (1, 2, 3, 30, EPOCHS):
            for k in range(4):
                want = float(D[t - 1] @ D[t - 1 - k]) if t - k >= 1 else float("nan")
                got = float(res["dW_band"][r, t, k])
                assert (math.isnan(want) and math.isnan(got)) or math.isclose(got, want, rel_tol=1e-8, abs_tol=1e-20)
            if t >= 2:
                cos = float(D[t - 1] @ D[t - 2] / (D[t - 1].norm() * D[t - 2].norm()))
                assert math.isclose(float(res["update_cos"][r, t]), 1 - cos, abs_tol=1e-9)
        assert torch.isnan(res["dW_band"][r, 0]).all() and torch.isnan(res["update_cos"][r, :2]).all()


def test_batched_runs_match_single_adam_float32():
    """The same in float32 (the production dtype): weights agree to float tolerance over 60 epochs."""
    res = modadd.train(M, K, N, "x2", [2e-4, 0.0], [4, 4], EPOCHS, device="cpu", keep_F_epochs=[EPOCHS],
                       progress=False)
    for r, e in enumerate([2e-4, 0.0]):
        _, ref = reference("x2", e, 4, EPOCHS, torch.float32)
        torch.testing.assert_close(res["W_at"][0, r], ref["W"][EPOCHS], rtol=0, atol=2e-5)
    assert not torch.equal(res["W_at"][0, 0], res["W_at"][0, 1])  # the weight decay made a difference


def test_gram_diagnostics_match_dense_float64():
    """‖G_F‖, ftf ratio and both ρ versions against direct n×n / K×K float64 formulas."""
    eta, seed, T = 2e-4, 1, 12
    res = modadd.train(M, K, N, "x2", [eta], [seed], T, device="cpu", dtype=torch.float64, gram_every=5,
                       gram_dense=3, progress=False)
    assert res["gram_epochs"].tolist() == [0, 1, 2, 3, 5, 10, 12]
    d, ref = reference("x2", eta, seed, T, torch.float64)
    n = N
    Yzm = torch.nn.functional.one_hot(d["y_tr"], M).double() - 1 / M
    P = torch.eye(n, dtype=torch.float64) - 1 / n
    for j, t in enumerate(res["gram_epochs"].tolist()):
        F, V = ref["F"][t], ref["V"][t]
        gF = P @ (Yzm - F @ V.T) @ V
        Ft = F - F.mean(0)
        C = Ft.T @ Ft
        off = (C.abs().sum() - C.diagonal().abs().sum()) / (K * (K - 1))
        A = F @ F.T
        dbar, obar = A.diagonal().mean(), (A.sum() - A.trace()) / (n * (n - 1))
        rho_code = (A - (dbar - obar) * torch.eye(n) - obar).norm() / A.norm()
        PA = P @ A
        d2, o2 = PA.diagonal().mean(), (PA.sum() - PA.trace()) / (n * (n - 1))
        rho_paper = (PA - (d2 - o2) * torch.eye(n) - o2).norm() / A.norm()
        assert math.isclose(res["gf_norm"][0, j], gF.norm(), rel_tol=1e-9)
        assert math.isclose(res["gf_norm_all"][0, t], gF.norm(), rel_tol=1e-9)
        assert math.isclose(res["ftf_ratio"][0, j], off / C.diagonal().abs().mean(), rel_tol=1e-9)
        assert math.isclose(res["rho_code"][0, j], rho_code, rel_tol=1e-6)
        assert math.isclose(res["rho_paper"][0, j], rho_paper, rel_tol=1e-6)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="activation"):
        modadd.train(M, K, N, "tanh", [0.0], [0], 2, progress=False)
    with pytest.raises(ValueError, match="etas"):
        modadd.train(M, K, N, "x2", [0.0, 1.0], [0], 2, progress=False)
    with pytest.raises(ValueError, match="keep_F_epochs"):
        modadd.train(M, K, N, "x2", [0.0], [0], 2, keep_F_epochs=[3], progress=False)


def _gram_reference(F: torch.Tensor) -> dict[str, float]:
    """ftf_ratio, rho_code and rho_paper of one F [n, K] from the explicit K×K and n×n matrices (float64)."""
    n, K = F.shape
    Ft = F - F.mean(0)
    C = Ft.T @ Ft
    ratio = (C.abs().sum() - C.diagonal().abs().sum()) / (K * (K - 1)) / C.diagonal().abs().mean()
    A = F @ F.T
    d, o = A.diagonal().mean(), (A.sum() - A.diagonal().sum()) / (n * (n - 1))
    rho_code = (A - (d - o) * torch.eye(n, dtype=F.dtype) - o).norm() / A.norm()
    PA = A - A.mean(0, keepdim=True)
    d2, o2 = PA.diagonal().mean(), (PA.sum() - PA.diagonal().sum()) / (n * (n - 1))
    rho_paper = (PA - (d2 - o2) * torch.eye(n, dtype=F.dtype) - o2).norm() / A.norm()
    return {"ftf_ratio": float(ratio), "rho_code": float(rho_code), "rho_paper": float(rho_paper)}


@pytest.mark.parametrize("signed", [False, True])
def test_gram_stats_from_upper_triangle_equals_dense(signed):
    """The diagnostics from the upper triangle of FᵀF (BLAS syrk, with the mask-free sum of |G − ssᵀ/n|) equal
    those of the explicit matrices, for F ≥ 0 (x², ReLU) and for F of both signs (GELU, SiLU), in float64; and in
    float32 within float32 rounding."""
    F = torch.randn(2, 30, 41, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    F = F if signed else F.square()
    got = modadd.gram_stats(F)
    got32 = modadd.gram_stats(F.float())
    for r in range(2):
        ref = _gram_reference(F[r])
        for k, v in ref.items():
            assert math.isclose(float(got[k][r]), v, rel_tol=1e-11), (k, r)
            assert math.isclose(float(got32[k][r]), v, rel_tol=2e-5), (k, r)


def test_gram_upper_is_the_upper_triangle():
    F = torch.randn(50, 33, generator=torch.Generator().manual_seed(1))
    U = modadd.gram_upper(F)
    torch.testing.assert_close(U, torch.triu(F.T @ F), rtol=1e-5, atol=1e-4)
    assert bool((torch.tril(U, -1) == 0).all())


@pytest.mark.parametrize("act", ["x2", "relu", "gelu"])
def test_logits_blocked_equals_whole_grid(act):
    """The CPU path (blocks of a, one run at a time) and the GPU path (whole grid, one batched product) give the
    same outputs, and both equal σ(XWᵀ)Vᵀ formed from explicit one-hot inputs (float64)."""
    R, M, K = 2, 7, 5
    g = torch.Generator().manual_seed(3)
    Wt = torch.randn(R, 2 * M, K, generator=g, dtype=torch.float64)
    V = torch.randn(R, M, K, generator=g, dtype=torch.float64)
    whole = modadd.logits_all(Wt, V, act, torch.empty(R, M * M, M, dtype=torch.float64),
                              torch.empty(R, M, M, K, dtype=torch.float64))
    blocked = modadd.logits_all(Wt, V, act, torch.empty(R, M * M, M, dtype=torch.float64),
                                torch.empty(3, M, K, dtype=torch.float64))  # 3 does not divide 7: a short last block
    a = torch.arange(M).repeat_interleave(M)
    b = torch.arange(M).repeat(M)
    X = torch.cat([torch.nn.functional.one_hot(a, M), torch.nn.functional.one_hot(b, M)], -1).double()
    ref = modadd.act_fn(act, X @ Wt) @ V.transpose(1, 2)
    torch.testing.assert_close(whole, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(blocked, ref, rtol=1e-12, atol=1e-12)


def test_column_sums_sparse_equals_dense():
    """XᵀdZ by the block-diagonal sparse product equals the dense product with explicit one-hot Xᵀ, bit for bit
    in float64 (each entry is a sum of the same few terms)."""
    R, M, n, K = 3, 5, 11, 4
    g = torch.Generator().manual_seed(0)
    a, b = torch.randint(0, M, (R, n), generator=g), torch.randint(0, M, (R, n), generator=g)
    dZ = torch.randn(R, n, K, generator=g, dtype=torch.float64)
    X = torch.cat([torch.nn.functional.one_hot(a, M), torch.nn.functional.one_hot(b, M)], -1).double()
    ref = X.transpose(1, 2) @ dZ
    for sparse in (True, False):
        torch.testing.assert_close(modadd.column_sums(a, b, M, torch.float64, sparse=sparse)(dZ), ref,
                                   rtol=1e-14, atol=1e-14)


def test_gram_stats_float32_accurate_when_the_mean_dominates():
    """At initialisation the x² activations are dominated by their mean over samples (‖s‖²/n ≫ ‖F̃‖²), where forming
    F̃ᵀF̃ as FᵀF − ssᵀ/n in float32 loses most digits. The float32 diagnostics agree with the explicit float64 ones
    to 1e-3 (float32 rounding of 2016-term sums), and the float64 ones to 1e-10."""
    M, K, n = 71, 256, 2016
    W, _ = modadd.init_weights(M, K, 0)
    d = modadd.make_data(M, n, 0)
    F = modadd.hidden(W.unsqueeze(0), d["a_tr"], d["b_tr"], "x2")
    s = F[0].double().sum(0)
    Ft = F[0].double() - s / n
    assert float(s.abs().sum() ** 2 / n) > 10 * float((Ft.T @ Ft).abs().sum())  # Σ|ssᵀ/n| ≫ Σ|F̃ᵀF̃|: the hard case
    ref = _gram_reference(F[0].double())
    got32, got64 = modadd.gram_stats(F), modadd.gram_stats(F.double())
    for k, v in ref.items():
        assert math.isclose(float(got32[k][0]), v, rel_tol=1e-3), (k, float(got32[k][0]), v)
        assert math.isclose(float(got64[k][0]), v, rel_tol=1e-10), k
