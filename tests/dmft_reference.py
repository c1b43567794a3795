"""The DMFT engine as it stood until 4 December 2026 (full square χ layout), kept as an independent reference for
``test_dmft.py::test_engine_matches_the_square_layout_reference``. Not used by the package."""

import torch

from grokspectra.device import check_steps
from grokspectra.dmft import DMFTError, CHECK_EVERY, _cholesky
from grokspectra.multiindex import (fresh_latents, link as make_link, make_generator, per_sample_F_and_loss,
                                    per_sample_FLD, risk_from_overlaps)


def run_dmft_reference(act, link, delta: float, eta: float, T: int, N: int, m: int, k: int | None = None, *, M0=None, Q0=None,
             a=None, b=None, lam: float = 0.0, loss="square", memory: bool = True, antithetic: bool = True,
             keep=(), n_test: int | None = None, device="cpu", dtype=torch.float64, generator=None) -> dict:
    """The square-layout version of :func:`grokspectra.dmft.run_dmft`: the same signature, parameters, returns and
    errors (see its docstring); the paths' χ(p, s) are kept for all p, s in one [T+1, N, m, (T+1)m] array."""
    lk = make_link(link)
    k = lk.k if k is None else k
    if k != lk.k:
        raise ValueError(f"link {lk.name!r} has latent dimension {lk.k}, but k={k} was given")
    if T < 0 or N < 2 or m < 1 or delta <= 0 or eta <= 0:
        raise ValueError(f"need T >= 0, N >= 2, m >= 1, delta > 0, eta > 0; got T={T}, N={N}, m={m}, delta={delta}, eta={eta}")
    if antithetic and N % 2:
        raise ValueError(f"antithetic sampling needs an even number of paths, got N={N}")
    keep = sorted(set(int(t) for t in keep))
    if any(t < 0 or t > T for t in keep):
        raise ValueError(f"keep steps must lie in [0, T={T}]; got {keep}")
    dev = torch.device(device)
    K64 = dict(device=dev, dtype=torch.float64)  # kernels: small, always float64
    P = dict(device=dev, dtype=dtype)            # paths
    gen = make_generator(generator, dev)
    I = torch.eye(m, **K64)
    shrink = 1.0 - eta * lam

    # --- paths: z, y and the Gaussian increments ξ (antithetic pairs share ξ and the label noise) -------------------
    half = N // 2 if antithetic else N

    def draw(*shape):
        x = torch.randn(half, *shape, **P, generator=gen)
        return torch.cat([x, x]) if antithetic else x

    z = torch.randn(half, k, **P, generator=gen)
    if antithetic:
        z2 = z.clone()
        z2[:, list(lk.hard)] *= -1
        z = torch.cat([z, z2])
    eps = draw() if lk.noise else None
    y = lk(z, eps)
    z_te, xi_te, y_te = fresh_latents(k, m, n_test or N, lk, device=dev, dtype=dtype, generator=gen)

    M = torch.zeros(T + 1, k, m, **K64)
    if M0 is not None:
        M0 = torch.as_tensor(M0, **K64)
        if M0.shape != (k, m):
            raise ValueError(f"M0 must have shape (k, m) = {(k, m)}, got {tuple(M0.shape)}")
        M[0] = M0
    Q00 = I.clone() if Q0 is None else torch.as_tensor(Q0, **K64)
    Qp = torch.zeros((T + 1) * m, (T + 1) * m, **K64)  # Q_⊥(t,s) blocks
    Qp[:m, :m] = Q00
    A = torch.zeros(T + 2, m, m, **K64)
    A[0] = I
    B = torch.zeros(T + 2, T + 1, m, m, **K64)  # B[t, s] = R_θ(t, s), zero for s ≥ t
    RF = torch.zeros(T + 1, T + 1, m, m, **K64)
    CF = torch.zeros(T + 1, T + 1, m, m, **K64)
    Xi = torch.zeros(T + 1, N, m, **P)
    Fs = torch.zeros(T + 1, N, m, **P)
    # Chi[s, n, c, p, b] = χ(p, s)[b, c] on path n: the layout turns Σ_p B_{t,p} χ(p,s) into one matmul
    Chi = torch.zeros(T + 1, N, m, (T + 1) * m, **P) if memory else None
    train = torch.zeros(T + 1, **K64)
    test = torch.zeros(T + 1, **K64)
    out_u = {}
    c0 = 0  # first step not yet checked for divergence

    for t in range(T + 1):
        # 1. w^t = block-row t of chol(Q_⊥[0..t, 0..t]) applied to (ξ^0 … ξ^t)
        L = _cholesky(Qp[: (t + 1) * m, : (t + 1) * m], t)
        Lrow = L[t * m:(t + 1) * m].reshape(m, t + 1, m).permute(1, 2, 0)  # [s, b, a] = L[t,s][a,b]
        Xi[t] = draw(m)
        w = torch.einsum("snb,sba->na", Xi[: t + 1], Lrow.to(dtype))
        # 2. u^t with the memory term Σ_{s<t} F^s B_{t,s}ᵀ
        u = z @ M[t].to(dtype) + w
        if memory and t > 0:
            u = u + torch.einsum("snb,sab->na", Fs[:t], B[t, :t].to(dtype))
        if memory:
            F, Lval, J = per_sample_FLD(u, y, act, a, b, loss)
        else:
            F, Lval = per_sample_F_and_loss(u, y, act, a, b, loss)
        if not torch.isfinite(F).all():
            raise DMFTError(f"non-finite F at step t={t} (max |u| = {u.abs().max().item():.3e}); reduce eta")
        Fs[t] = F
        # 3.–4. responses χ(t, s) and the kernels R_F, C_F
        if memory:
            Chi[t, :, :, t * m:(t + 1) * m] = J  # χ(t,t) = J (symmetric)
            if t > 0:
                Bflat = B[t].transpose(1, 2).reshape((T + 1) * m, m).to(dtype)  # [(p,b), a] = B_{t,p}[a,b]
                K = Chi[:t] @ Bflat  # [s, n, c, a] = (Σ_p B_{t,p} χ(p,s))[a, c]
                Chi[:t, :, :, t * m:(t + 1) * m] = K @ J  # χ(t,s)ᵀ = (J K)ᵀ = Kᵀ J
            RF[t, : t + 1] = delta * Chi[: t + 1, :, :, t * m:(t + 1) * m].mean(1).transpose(1, 2).double()
        cf = torch.einsum("na,snb->sab", F, Fs[: t + 1]).double() / N
        CF[t, : t + 1] = cf
        CF[: t + 1, t] = cf.transpose(1, 2)
        # 5. observables
        Qtt = Qp[t * m:(t + 1) * m, t * m:(t + 1) * m]
        train[t] = Lval.double().mean()
        test[t] = risk_from_overlaps(M[t].to(dtype), (M[t].T @ M[t] + Qtt).to(dtype), z_te, xi_te, y_te,
                                     act, a, b, loss).double()
        if t % CHECK_EVERY == CHECK_EVERY - 1 or t == T:
            check_steps(f"DMFT (δ = {delta:g}, η = {eta:g}, N = {N}, memory = {memory})", c0,
                        {"M": M[c0:t + 1], "train risk": train[c0:t + 1], "test risk": test[c0:t + 1]},
                        hint="the step size is too large for this δ (reduce eta)")
            c0 = t + 1
        if t in keep:
            out_u[t] = u
        if t == T:
            break
        # 6. signal, parameter-side responses and the new row of Q_⊥
        zF = z[:, :, None] * F[:, None, :]
        if antithetic:
            zF = zF[:half] + zF[half:]  # exact cancellation in the hard rows
        M[t + 1] = shrink * M[t] - eta * zF.double().sum(0) / N
        RFt = RF[t, : t + 1] if memory else torch.zeros(t + 1, m, m, **K64)
        A[t + 1] = shrink * A[t] - (eta / delta) * (RFt @ A[: t + 1]).sum(0)
        B[t + 1, : t + 1] = shrink * B[t, : t + 1] - (eta / delta) * torch.einsum("pab,psbc->sac", RFt, B[: t + 1, : t + 1])
        B[t + 1, t] -= (eta / delta) * I
        Bbig = B[: t + 2, : t + 1].permute(0, 2, 1, 3).reshape((t + 2) * m, (t + 1) * m)
        Abig = A[: t + 2].reshape((t + 2) * m, m)
        CFbig = CF[: t + 1, : t + 1].permute(0, 2, 1, 3).reshape((t + 1) * m, (t + 1) * m)
        rows = slice((t + 1) * m, (t + 2) * m)
        new = Abig[rows] @ Q00 @ Abig.T + Bbig[rows] @ (delta * CFbig) @ Bbig.T  # [m, (t+2)m]
        Qp[rows, : (t + 2) * m] = new
        Qp[: (t + 2) * m, rows] = new.T
        Qp[rows, rows] = 0.5 * (new[:, rows] + new[:, rows].T)

    idx = torch.arange(T + 1, device=dev)
    Qpd = Qp.reshape(T + 1, m, T + 1, m)[idx, :, idx, :]  # diagonal blocks Q_⊥(t,t)
    out = {"M": M, "Q": M.transpose(1, 2) @ M + Qpd, "Qperp": Qpd, "train": train, "test": test,
           "C_F": CF, "R_F": RF, "R_theta": B[: T + 1], "z": z, "y": y, "u": out_u,
           "law": {t: {"z": z, "y": y, "u": out_u[t]} for t in keep}, "hard": lk.hard}
    return out
