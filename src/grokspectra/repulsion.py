"""Theorem 6 (repulsion, Tian as restated by Xu) and what its numerical test measures.

Objects, for hidden activations F ∈ ℝ^{n×K} on the training set:

* F̃ = P₁^⊥F (columns centred over samples), f̃_j its column j;
* B = (F̃ᵀF̃ + ηI_K)⁻¹ = (1/η)I_K − (1/η)F̃ᵀ(F̃F̃ᵀ + ηI_n)⁻¹F̃ (Woodbury; Xu's code puts 1/η² in
  front of the second term, see :func:`woodbury_B`);
* P_η = I_n − F̃BF̃ᵀ = η(F̃F̃ᵀ + ηI_n)⁻¹ and the leave-two-out P_{η,−jℓ} = η(F̃_{−jℓ}F̃_{−jℓ}ᵀ + ηI_n)⁻¹.

Theorem 6 says sgn B_jℓ = −sgn(f̃_jᵀP_{η,−jℓ}f̃_ℓ). This is an identity. With U = [f̃_j f̃_ℓ], the
{j, ℓ} block of B is S⁻¹ for the Schur complement S = UᵀP_{η,−jℓ}U + ηI₂ (positive definite), so
B_jℓ = −S_jℓ / det S. And B_jℓ = −(1/η) f̃_jᵀ(F̃F̃ᵀ + ηI)⁻¹f̃_ℓ for j ≠ ℓ, i.e. f̃_jᵀP_ηf̃_ℓ = −η²B_jℓ.

Everything is float64 (the activations are cast from the float32 model, as in Xu's pipeline). All functions take
one checkpoint ``F`` ``[n, K]``; off-diagonal entries of B are computed accurately from a Cholesky factor of the
n×n kernel, and the full K×K Woodbury B only where Xu's own pipeline is being reproduced.
"""

from __future__ import annotations

import torch


def centre(F: torch.Tensor) -> torch.Tensor:
    """F̃ = P₁^⊥F = F − 𝟙(𝟙ᵀF)/n in float64."""
    F = F.double()
    return F - F.mean(0, keepdim=True)


def kernel(Ft: torch.Tensor, eta: float) -> torch.Tensor:
    """The n×n matrix F̃F̃ᵀ + ηI_n (float64)."""
    if not eta > 0:
        raise ValueError(f"Theorem 6 needs weight decay η > 0 (B = (F̃ᵀF̃ + ηI)⁻¹ is singular at η = 0), got {eta}")
    n = Ft.shape[0]
    return Ft @ Ft.T + eta * torch.eye(n, dtype=Ft.dtype, device=Ft.device)


def _cholesky(A: torch.Tensor) -> torch.Tensor:
    """Cholesky factor of one or a batch of n×n matrices; raises with details when one is not positive definite."""
    L, info = torch.linalg.cholesky_ex(A)
    if bool((info != 0).any()):
        bad = int(info.reshape(-1).nonzero()[0])
        raise RuntimeError(f"Cholesky of an {A.shape[-1]}×{A.shape[-1]} kernel (batch entry {bad}) failed at leading "
                           f"minor {int(info.reshape(-1)[bad])}; the matrix is not numerically positive definite "
                           f"(min diagonal {float(A.diagonal(dim1=-2, dim2=-1).min()):.3e})")
    return L


def woodbury_B(Ft: torch.Tensor, eta: float, *, xu_factor: bool = False) -> torch.Tensor:
    """B = (F̃ᵀF̃ + ηI)⁻¹ = (1/η)I − (1/η)F̃ᵀ(F̃F̃ᵀ + ηI)⁻¹F̃ by the Woodbury identity, float64, K×K.

    The inner n×n inverse is taken with ``torch.linalg.inv`` as in Xu's script. Note the factor: Woodbury with
    A = ηI gives (1/η)I − (1/η²)F̃ᵀ(I + F̃F̃ᵀ/η)⁻¹F̃ = (1/η)I − (1/η)F̃ᵀ(F̃F̃ᵀ + ηI)⁻¹F̃. Xu's ``woodbury_B``
    (theorem6_verify.py @1fbaa890) multiplies F̃ᵀ(F̃F̃ᵀ + ηI)⁻¹F̃ by 1/η² instead;
    ``xu_factor=True`` reproduces that matrix, whose off-diagonal entries are the true B_jℓ times 1/η (same signs).
    """
    return _woodbury_from(_ftinvf(Ft.double(), eta), eta, xu_factor)


def _ftinvf(Ft: torch.Tensor, eta: float, Kn: torch.Tensor | None = None) -> torch.Tensor:
    """C = F̃ᵀ(F̃F̃ᵀ + ηI)⁻¹F̃ (K×K), with Xu's ``torch.linalg.inv`` of the n×n kernel (``Kn`` if given)."""
    return Ft.T @ (torch.linalg.inv(kernel(Ft, eta) if Kn is None else Kn) @ Ft)


def _woodbury_from(C: torch.Tensor, eta: float, xu_factor: bool) -> torch.Tensor:
    B = C / (-(eta**2) if xu_factor else -eta)
    B.diagonal().add_(1 / eta)
    return B


def B_entries(Ft: torch.Tensor, eta: float, j: torch.Tensor, l: torch.Tensor, L: torch.Tensor | None = None) -> torch.Tensor:
    """Off-diagonal entries B_jℓ = −(1/η) f̃_jᵀ(F̃F̃ᵀ + ηI)⁻¹f̃_ℓ (j ≠ ℓ), from a Cholesky solve: no K×K matrix and
    no cancellation against the (1/η)I term. ``L`` is an optional Cholesky factor of :func:`kernel`."""
    if bool((j == l).any()):
        raise ValueError("B_entries computes off-diagonal entries only (j ≠ ℓ)")
    L = _cholesky(kernel(Ft, eta)) if L is None else L
    X = torch.cholesky_solve(Ft[:, l], L)  # (F̃F̃ᵀ + ηI)⁻¹ f̃_ℓ, one column per pair
    return -(Ft[:, j] * X).sum(0) / eta


def cosine_matrix(Ft: torch.Tensor) -> torch.Tensor:
    """Cosine similarities of the columns of F̃ (K×K, float64); a zero column (a dead unit) has similarity 0."""
    norm = Ft.norm(dim=0)
    Fh = Ft / torch.where(norm > 0, norm, torch.ones_like(norm))
    return Fh.T @ Fh


def top_pairs(Ft: torch.Tensor, top: int = 200) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Xu's pair selection: the ``top`` pairs j < ℓ with the largest |cos(f̃_j, f̃_ℓ)|.

    Returns ``(j, l, sim)`` with the signed similarity, ordered by decreasing |sim|.
    """
    K = Ft.shape[1]
    if not 1 <= top <= K * (K - 1) // 2:
        raise ValueError(f"top must be in [1, K(K-1)/2 = {K * (K - 1) // 2}], got {top}")
    S = cosine_matrix(Ft)
    S = torch.triu(S, diagonal=1)
    val, idx = S.abs().flatten().topk(top)
    j, l = idx // K, idx % K
    return j, l, S[j, l]


def leave_two_out(Ft: torch.Tensor, eta: float, j, l, Kn: torch.Tensor | None = None) -> torch.Tensor:
    """The 2×2 matrix UᵀP_{η,−jℓ}U, U = [f̃_j f̃_ℓ], with the exact leave-two-out projector
    P_{η,−jℓ} = η(F̃_{−jℓ}F̃_{−jℓ}ᵀ + ηI)⁻¹, by a Cholesky solve of that n×n matrix.

    ``j`` and ``l`` are ints (returns ``[2, 2]``) or equal-length index tensors (returns ``[P, 2, 2]``, one
    n×n factorisation per pair, batched). ``Kn`` is an optional precomputed :func:`kernel`; the two columns are
    subtracted from it (F̃_{−jℓ}F̃_{−jℓ}ᵀ = F̃F̃ᵀ − f̃_jf̃_jᵀ − f̃_ℓf̃_ℓᵀ)."""
    Kn = kernel(Ft, eta) if Kn is None else Kn
    j, l = torch.as_tensor(j), torch.as_tensor(l)
    single = j.ndim == 0
    U = torch.stack([Ft[:, j.reshape(-1)], Ft[:, l.reshape(-1)]], -1).permute(1, 0, 2)  # [P, n, 2]
    L = _cholesky(Kn - U @ U.transpose(1, 2))
    out = eta * (U.transpose(1, 2) @ torch.cholesky_solve(U, L))
    return out[0] if single else out


def schur_B_block(Ft: torch.Tensor, eta: float, j: int, l: int, Kn: torch.Tensor | None = None) -> torch.Tensor:
    """The {j, ℓ} block of B from the Schur complement: S⁻¹ with S = UᵀP_{η,−jℓ}U + ηI₂."""
    S = leave_two_out(Ft, eta, j, l, Kn)
    S = S + eta * torch.eye(2, dtype=S.dtype, device=S.device)
    return torch.linalg.inv(S)


def xu_residuals(Ft: torch.Tensor, B: torch.Tensor, j: torch.Tensor, l: torch.Tensor) -> torch.Tensor:
    """Xu's residual similarity f̃_jᵀ(f̃_ℓ − F̃(BF̃ᵀf̃_ℓ)), the full P_η standing in for P_{η,−jℓ}.

    In exact arithmetic it equals −η²B_jℓ; in floating point the subtraction cancels almost all of f̃_ℓ."""
    Fl = Ft[:, l]
    return (Ft[:, j] * (Fl - Ft @ (B @ (Ft.T @ Fl)))).sum(0)


def checkpoint(F: torch.Tensor, eta: float, *, top: int = 200, n_exact: int = 10, xu: bool = True) -> dict[str, torch.Tensor]:
    """Theorem-6 statistics of one checkpoint, all float64.

    Parameters
    ----------
    F : Tensor ``[n, K]``
        Hidden activations on the training set (as produced by the float32 model).
    xu : bool
        Also build the full K×K Woodbury B and Xu's sign-match (costly: four n·K² products).

    Returns
    -------
    dict of scalars: ``frac_Bneg_pos`` = frac(B_jℓ < 0 | top pairs with cos > 0) (the content of the theorem),
    ``frac_Bneg_neg`` = frac(B_jℓ < 0 | cos < 0), ``n_pos``, ``median_abs_sim``; with ``xu``: ``sign_match``
    (Xu's metric with the correct Woodbury B), ``res_rel_err`` (median |residual + η²B_jℓ| / |η²B_jℓ|: the
    rounding error of f̃_ℓ − F̃BF̃ᵀf̃_ℓ), ``woodbury_rel_err`` (max relative difference of the Woodbury B_jℓ from
    the Cholesky ones), ``sign_match_xu`` (the same metric with Xu's 1/η² Woodbury factor, i.e. his published
    pipeline) and ``frac_res_xu_sign_is_sim_sign`` (how often that residual has the sign of cos); and for the ``n_exact`` most similar pairs with the exact
    leave-two-out projector: ``exact_sign_rule`` (fraction obeying sgn B = −sgn f̃_jᵀP_{η,−jℓ}f̃_ℓ) and
    ``schur_rel_err`` (max |B_jℓ − (S⁻¹)_jℓ| / |B_jℓ|). Plus per-pair arrays ``sim`` and ``B``.
    """
    Ft = centre(F)
    j, l, sim = top_pairs(Ft, top)
    Kn = kernel(Ft, eta)
    L = _cholesky(Kn)
    Bjl = B_entries(Ft, eta, j, l, L)
    pos, neg = sim > 0, sim < 0
    d = lambda x: torch.as_tensor(x, dtype=torch.float64)
    out = {
        "frac_Bneg_pos": d((Bjl[pos] < 0).double().mean() if pos.any() else float("nan")),
        "frac_Bneg_neg": d((Bjl[neg] < 0).double().mean() if neg.any() else float("nan")),
        "n_pos": d(pos.sum()), "median_abs_sim": d(sim.abs().median()),
        "sim": sim, "B": Bjl,
    }
    if xu:
        C = _ftinvf(Ft, eta, Kn)  # shared by the correct and Xu's Woodbury B
        B = _woodbury_from(C, eta, xu_factor=False)
        res = xu_residuals(Ft, B, j, l)
        out["sign_match"] = (torch.sign(B[j, l]) == -torch.sign(res)).double().mean()
        out["res_rel_err"] = ((res + eta**2 * Bjl).abs() / (eta**2 * Bjl.abs())).median()
        out["woodbury_rel_err"] = ((B[j, l] - Bjl).abs() / Bjl.abs()).max()
        B = _woodbury_from(C, eta, xu_factor=True)
        del C
        res = xu_residuals(Ft, B, j, l)
        out["sign_match_xu"] = (torch.sign(B[j, l]) == -torch.sign(res)).double().mean()
        out["frac_res_xu_sign_is_sim_sign"] = (torch.sign(res) == torch.sign(sim)).double().mean()
        del B
    if n_exact:
        m = min(n_exact, top)
        ok, err = [], []
        for i in range(m):
            S2 = leave_two_out(Ft, eta, int(j[i]), int(l[i]), Kn)
            ok.append(bool(torch.sign(Bjl[i]) == -torch.sign(S2[0, 1])))
            Sfull = S2 + eta * torch.eye(2, dtype=S2.dtype, device=S2.device)
            err.append(float((Bjl[i] - torch.linalg.inv(Sfull)[0, 1]).abs() / Bjl[i].abs()))
        out["exact_sign_rule"] = d(sum(ok) / m)
        out["schur_rel_err"] = d(max(err))
    return out
