"""Discrete-time DMFT for O(1) steps of full-batch GD on the first layer (book chapter 1, ``eq-ch1-sample``–``eq-ch1-M``).

Chapter 1 states these equations and validates them against GD ("DMFT against gradient descent"). Its
notation, all kernels m×m, t, s integer steps:

* sample side (Monte Carlo over N paths): u^t = zM_t + w^t + Σ_{s<t} F^s R_θ(t,s)ᵀ, F^t = F(u^t; y),
  w a centred Gaussian process with covariance Q_⊥(t,s); response χ(t,t) = D(u^t; y),
  χ(t,s) = D(u^t; y) Σ_{s≤s'<t} R_θ(t,s') χ(s',s); kernels C_F(t,s) = E F^t F^sᵀ, R_F(t,s) = δ E χ(t,s);
* parameter side (linear, exact): θ^t = A_t θ^0 + Σ_{s<t} B_{t,s} g^s with
  A_{t+1} = (1−ηλ)A_t − (η/δ) Σ_{s≤t} R_F(t,s) A_s,
  B_{t+1,s} = (1−ηλ)B_{t,s} − (η/δ)[1{s=t} I + Σ_{s'≤t} R_F(t,s') B_{s',s}], R_θ = B,
  Q_⊥(t,t') = A_t Q_⊥(0,0) A_{t'}ᵀ + Σ_{s<t,s'<t'} B_{t,s} δC_F(s,s') B_{t',s'}ᵀ;
* signal: M_{t+1} = (1−ηλ)M_t − η E[z F^tᵀ]; Q_t = M_tᵀM_t + Q_⊥(t,t).

``memory=False`` drops the Onsager/reaction terms (R_θ in the sample process and R_F on the parameter side), keeping
the noise propagation through B — the "naive" closure chapter 1 shows to be wrong ("Why the memory terms matter").
"""

from __future__ import annotations

import contextlib

import torch

from . import chi_kernel as ck
from .device import DivergenceError, check_steps
from .multiindex import (fresh_latents, link as make_link, make_generator, per_sample_F_and_loss, per_sample_FLD,
                         risk_from_overlaps)


class DMFTError(DivergenceError, RuntimeError):
    """The DMFT recursion broke down (a covariance lost positive definiteness or a value became non-finite)."""


CHECK_EVERY = 25  # steps between checks of the recorded overlaps and risks for divergence
K_ROWS = 48  # rows of χ per product in the response update (on the 2-core host, 26 GB/s against 19 for one long product)


def _cholesky(C: torch.Tensor, t: int) -> torch.Tensor:
    """Cholesky factor of the covariance of (w^0 … w^t); a relative jitter up to 1e-8 is tried before failing."""
    scale = torch.diagonal(C).abs().max()
    for jit in (0.0, 1e-12, 1e-10, 1e-8):
        L, info = torch.linalg.cholesky_ex(C + jit * scale * torch.eye(C.shape[0], dtype=C.dtype, device=C.device))
        if int(info) == 0:
            return L
    hint = "the step size may be too large for this δ"
    if not torch.isfinite(C).all():
        raise DMFTError(f"covariance of w^0..w^{t} has non-finite entries; {hint}")
    try:
        ev = torch.linalg.eigvalsh(C)
    except torch.linalg.LinAlgError:  # eigh itself fails on a badly conditioned C
        raise DMFTError(f"covariance of w^0..w^{t} is not positive definite (its eigendecomposition fails: "
                        f"diagonal up to {scale.item():.3e}); {hint}") from None
    raise DMFTError(f"covariance of w^0..w^{t} is not positive definite (smallest eigenvalue {ev[0].item():.3e}, "
                    f"largest {ev[-1].item():.3e}); {hint}")


_POOL: dict = {"depth": 0, "buf": None}


@contextlib.contextmanager
def reuse_memory():
    """Within this block, successive :func:`run_dmft` calls share one array for the path responses χ.

    χ is the bulk of a run's memory (N·m²·(T+1)(T+2)/2 values). Fresh memory costs a page fault per 4 KiB page on
    first touch, which on the project's 2-core machines takes about as long as the recursion's own reads at T ≈ 50;
    a sweep of many runs (a bisection, a set of path draws) avoids it by reusing the array. The array is held until
    the outermost block exits, and grows to the largest run inside it.
    """
    _POOL["depth"] += 1
    try:
        yield
    finally:
        _POOL["depth"] -= 1
        if _POOL["depth"] == 0:
            _POOL["buf"] = None


def _chi_storage(numel: int, device, dtype) -> torch.Tensor:
    """A flat uninitialised array of ``numel`` values for χ: the pooled one inside :func:`reuse_memory`."""
    if _POOL["depth"] == 0:
        return torch.empty(numel, device=device, dtype=dtype)
    buf = _POOL["buf"]
    if buf is None or buf.numel() < numel or buf.device != torch.device(device) or buf.dtype != dtype:
        _POOL["buf"] = None  # free the old one before allocating the new
        _POOL["buf"] = buf = torch.empty(numel, device=device, dtype=dtype)
    return buf[:numel]


def run_dmft(act, link, delta: float, eta: float, T: int, N: int, m: int, k: int | None = None, *, M0=None, Q0=None,
             a=None, b=None, lam: float = 0.0, loss="square", memory: bool = True, antithetic: bool = True,
             keep=(), n_test: int | None = None, device="cpu", dtype=torch.float64, generator=None) -> dict:
    """Run the DMFT recursion of chapter 1 for t = 0 … T with N Monte Carlo paths.

    Parameters
    ----------
    act, link : activation name (``multiindex.ACTIVATIONS``) and link (name, callable or ``Link``).
    delta, eta, lam : sample ratio δ = n/d, GD step η, ridge λ.
    T, N, m, k : steps, paths (even when ``antithetic``), width, latent dimension (default the link's).
    M0 : [k, m] initial overlap (default 0: random init); Q0 : Q_⊥(0,0) (default I_m).
    memory : keep the memory (Onsager) terms. antithetic : pair the paths (z, ξ) and (z with its hard coordinates
        flipped, ξ) (chapter 1, "Easy and hard directions"); with a hard row of M0 equal to 0 the hard overlap then stays exactly 0.
    keep : steps t whose sample-side law is returned.

    Returns
    -------
    dict with ``M`` [T+1,k,m], ``Q`` [T+1,m,m] (= MᵀM + Q_⊥), ``Qperp`` [T+1,m,m], ``train`` [T+1] (mean L(u^t; y)
    over paths, memory included), ``test`` [T+1] (E L(u; y), u = zM_t + N(0, Q_⊥(t,t)), no memory), the kernels
    ``C_F``, ``R_F``, ``R_theta`` [T+1,T+1,m,m] (R_theta[t,s] = B_{t,s}), and for each t in ``keep``:
    ``law[t] = {"z": [N,k], "y": [N], "u": [N,m]}`` (also ``z``, ``y``, ``u[t]``), from which the Hessian weight law
    is G_t = per_sample_D(u, y, act, a, b) and the hard coordinates are ζ = z[:, link.hard] (chapters 2–3).

    Raises :class:`DMFTError` (a ``grokspectra.device.DivergenceError``) naming the step where a covariance lost
    positive definiteness or F became non-finite, and ``DivergenceError`` naming the first step where M or a risk
    became NaN, infinite or larger than 1e30 (checked every :data:`CHECK_EVERY` steps and at the end).
    """
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
    Xi = torch.empty(N, (T + 1) * m, **P)  # [n, (s, b)] = ξ^s_b on path n
    Fs = torch.empty(N, (T + 1) * m, **P)  # [n, (s, b)] = F^s_b on path n
    # Chi[s]: [(p − s, b), (c, n)] = χ(p, s)[b, c] on path n, for s ≤ p (χ(p, s) = 0 for p < s is not stored, and rows
    # p > t are not yet written): Σ_p B_{t,p} χ(p, s) is then one product per s over a contiguous prefix of rows.
    Chi = []
    if memory:
        chi_off = [0]
        for t in range(T + 1):
            chi_off.append(chi_off[-1] + (T + 1 - t) * m * N * m)
        chi_flat = _chi_storage(chi_off[-1], dev, dtype)
    K_buf = torch.empty(m * N * m, **P) if memory else None  # work array of the χ update
    train = torch.zeros(T + 1, **K64)
    test = torch.zeros(T + 1, **K64)
    out_u = {}
    c0 = 0  # first step not yet checked for divergence

    for t in range(T + 1):
        rows_t = slice(t * m, (t + 1) * m)
        # 1. w^t = block-row t of chol(Q_⊥[0..t, 0..t]) applied to (ξ^0 … ξ^t)
        L = _cholesky(Qp[: (t + 1) * m, : (t + 1) * m], t)
        Xi[:, rows_t] = draw(m)
        w = Xi[:, : (t + 1) * m] @ L[rows_t, : (t + 1) * m].T.to(dtype)  # [n, a]
        # 2. u^t with the memory term Σ_{s<t} F^s B_{t,s}ᵀ
        Brow = B[t, :t].permute(1, 0, 2).reshape(m, t * m).to(dtype)  # [a, (s, b)] = B_{t,s}[a, b]
        if memory and t > 0:
            w = w + Fs[:, : t * m] @ Brow.T
        u = z @ M[t].to(dtype) + w
        if memory:
            F, Lval, Jt = per_sample_FLD(u, y, act, a, b, loss, paths_last=True)  # Jt[b, a, n] = D(u^t_n; y_n)[b, a]
        else:
            F, Lval = per_sample_F_and_loss(u, y, act, a, b, loss)
        if not torch.isfinite(F).all():
            raise DMFTError(f"non-finite F at step t={t} (max |u| = {u.abs().max().item():.3e}); reduce eta")
        Fs[:, rows_t] = F
        # 3.–4. responses χ(t, s) and the kernels R_F, C_F
        if memory:
            Chi.append(chi_flat[chi_off[t]:chi_off[t + 1]].view((T + 1 - t) * m, N * m))
            Chi[t][:m] = Jt.view(m, m * N)  # χ(t,t) = J
            RF[t, t] = delta * Jt.mean(2).double()
            if t > 0:
                K = K_buf.view(m, m, N)  # one s at a time, so that K stays in cache
                for s in range(t):
                    # K[a, c, n] = (Σ_{s≤p<t} B_{t,p} χ(p,s))[a, c], then χ(t, s)[b, c] = Σ_a J[b, a] K[a, c]
                    Kf, Cs, Bs = K.view(m, m * N), Chi[s], Brow[:, s * m:]
                    torch.mm(Bs[:, :K_ROWS], Cs[:min(K_ROWS, (t - s) * m)], out=Kf)
                    for r in range(K_ROWS, (t - s) * m, K_ROWS):  # in blocks of rows: one long product streams slower
                        Kf.addmm_(Bs[:, r:r + K_ROWS], Cs[r:min(r + K_ROWS, (t - s) * m)])
                    new = torch.mul(Jt[:, 0, None], K[0], out=Chi[s][(t - s) * m:(t - s + 1) * m].view(m, m, N))
                    for a_ in range(1, m):
                        new.addcmul_(Jt[:, a_, None], K[a_])
                    RF[t, s] = delta * new.mean(2).double()
        cf = (Fs[:, : (t + 1) * m].T @ F).double() / N  # [(s, b), a] = E F^s_b F^t_a
        cf = cf.view(t + 1, m, m).transpose(1, 2)  # [s, a, b] = E F^t_a F^s_b
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


# --- the engine chapters move to: an incremental factor of the history covariance and the fused response pass ------
FACTOR_CUT = 1e-4  # singular values of the factor below this fraction of the largest are dropped from its inverse
PSD_TOL = 1e-8  # a conditional covariance whose eigenvalue is below −PSD_TOL·(largest variance) is an error


def _factor_row(L: torch.Tensor, Q: torch.Tensor, t: int, m: int) -> None:
    """Append block row t to the factor L of the covariance of (w^0 … w^t), in place: L_{≤t} L_{≤t}ᵀ = Q_⊥(≤t, ≤t).

    The rows of earlier steps are kept as they were when those steps' w were drawn, so the law realised by the paths
    is the one the factor states. The new row solves L_t L_{<t}ᵀ = Q_⊥(t, <t) through the pseudo-inverse of L_{<t}
    (singular values below :data:`FACTOR_CUT` of the largest dropped: the history covariance is singular to machine
    precision after some 20 steps), and its new block is the Cholesky factor of the conditional covariance
    Q_⊥(t, t) − L_t,<t L_t,<tᵀ with pivots below FACTOR_CUT² of the largest variance set to 0. While the history
    covariance is well conditioned this is the Cholesky factor :func:`run_dmft` uses, row for row. Refactoring the whole covariance each step instead, as
    :func:`run_dmft` does, leaves which late-step sample a run draws to rounding (chapter 3, *Reproducibility of the
    recursion*). Raises :class:`DMFTError` when Q_⊥ is non-finite or the conditional covariance is negative beyond
    :data:`PSD_TOL`."""
    r = slice(t * m, (t + 1) * m)
    Qrow = Q[r, : (t + 1) * m]
    scale = torch.diagonal(Q[: (t + 1) * m, : (t + 1) * m]).abs().max()
    hint = "the step size may be too large for this δ"
    if not torch.isfinite(Qrow).all():
        raise DMFTError(f"covariance of w^0..w^{t} has non-finite entries; {hint}")
    S = Qrow[:, t * m:]
    if t > 0:
        U, sv, Vh = torch.linalg.svd(L[: t * m, : t * m])
        k = int((sv > FACTOR_CUT * sv[0]).sum())
        X = (Qrow[:, : t * m] @ U[:, :k]) / sv[:k] @ Vh[:k]
        L[r, : t * m] = X
        S = S - X @ X.T
    S, sc = S.cpu().tolist(), scale.item()
    D = [[0.0] * m for _ in range(m)]  # Cholesky of S with its pivots clipped: columns of a pivot ≤ the cut stay 0
    for j in range(m):
        d = S[j][j] - sum(D[j][i] ** 2 for i in range(j))
        if d < -PSD_TOL * sc:
            raise DMFTError(f"covariance of w^0..w^{t} is not positive semidefinite (the conditional variance of "
                            f"w^{t}_{j} is {d:.3e}, variances up to {sc:.3e}); {hint}")
        if d > FACTOR_CUT ** 2 * sc:
            D[j][j] = d ** 0.5
            for i in range(j + 1, m):
                D[i][j] = (S[i][j] - sum(D[i][q] * D[j][q] for q in range(j))) / D[j][j]
    L[r, r] = torch.tensor(D, dtype=L.dtype, device=L.device)


def run_dmft_factored(act, link, delta: float, eta: float, T: int, N: int, m: int, k: int | None = None, *, M0=None,
                      Q0=None, a=None, b=None, lam: float = 0.0, loss="square", memory: bool = True,
                      antithetic: bool = True, keep=(), n_test: int | None = None, device="cpu",
                      dtype=torch.float64, generator=None) -> dict:
    """The DMFT recursion of chapter 1, as :func:`run_dmft` (same arguments, same returns), with two changes.

    * The Gaussian field w^t is drawn from an incremental factor of the history covariance
      (:func:`_factor_row`), not from a Cholesky factor of the whole history refactored each step: late steps no
      longer depend on the order in which sums are rounded (two orders agree to 10⁻⁷ at T = 60 where
      :func:`run_dmft` differs by 10⁻²), and the law the paths realise is the stated one.
    * The response update is one fused pass per step over χ stored in tiles of paths
      (:mod:`grokspectra.chi_kernel`).

    Book chapters move to this engine one by one; :func:`run_dmft` stays until none uses it. Raises as
    :func:`run_dmft` (a conditional covariance that is not positive semidefinite is a :class:`DMFTError`).
    """
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
    K64 = dict(device=dev, dtype=torch.float64)
    P = dict(device=dev, dtype=dtype)
    gen = make_generator(generator, dev)
    I = torch.eye(m, **K64)
    shrink = 1.0 - eta * lam
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
    Lf = torch.zeros((T + 1) * m, (T + 1) * m, **K64)  # its factor, one block row per step (_factor_row)
    A = torch.zeros(T + 2, m, m, **K64)
    A[0] = I
    B = torch.zeros(T + 2, T + 1, m, m, **K64)  # B[t, s] = R_θ(t, s), zero for s ≥ t
    RF = torch.zeros(T + 1, T + 1, m, m, **K64)
    CF = torch.zeros(T + 1, T + 1, m, m, **K64)
    Xi = torch.empty(N, (T + 1) * m, **P)  # [n, (s, b)] = ξ^s_b on path n
    Fs = torch.empty(N, (T + 1) * m, **P)  # [n, (s, b)] = F^s_b on path n
    if memory:
        off = ck.offsets(T, N, m)
        chi = _chi_storage(off[-1], dev, dtype)
        off_t = torch.tensor(off, dtype=torch.int64)
    train = torch.zeros(T + 1, **K64)
    test = torch.zeros(T + 1, **K64)
    out_u = {}
    c0 = 0

    for t in range(T + 1):
        rows_t = slice(t * m, (t + 1) * m)
        # 1. w^t = block row t of the factor applied to (ξ^0 … ξ^t)
        _factor_row(Lf, Qp, t, m)
        Xi[:, rows_t] = draw(m)
        w = Xi[:, : (t + 1) * m] @ Lf[rows_t, : (t + 1) * m].T.to(dtype)
        # 2. u^t with the memory term Σ_{s<t} F^s B_{t,s}ᵀ
        Brow = B[t, :t].permute(1, 0, 2).reshape(m, t * m).to(dtype)  # [a, (s, b)] = B_{t,s}[a, b]
        if memory and t > 0:
            w = w + Fs[:, : t * m] @ Brow.T
        u = z @ M[t].to(dtype) + w
        if memory:
            F, Lval, Jt = per_sample_FLD(u, y, act, a, b, loss, paths_last=True)  # Jt[b, a, n] = D(u^t_n; y_n)[b, a]
        else:
            F, Lval = per_sample_F_and_loss(u, y, act, a, b, loss)
        if not torch.isfinite(F).all():
            raise DMFTError(f"non-finite F at step t={t} (max |u| = {u.abs().max().item():.3e}); reduce eta")
        Fs[:, rows_t] = F
        # 3.–4. responses χ(t, s) (fused pass) and the kernels R_F, C_F
        if memory:
            RF[t, t] = delta * Jt.mean(2).double()
            RF[t, :t] = delta * ck.step(chi, off, off_t, Brow, Jt, t, T).double()
        cf = (Fs[:, : (t + 1) * m].T @ F).double() / N
        cf = cf.view(t + 1, m, m).transpose(1, 2)
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
            zF = zF[:half] + zF[half:]
        M[t + 1] = shrink * M[t] - eta * zF.double().sum(0) / N
        RFt = RF[t, : t + 1] if memory else torch.zeros(t + 1, m, m, **K64)
        A[t + 1] = shrink * A[t] - (eta / delta) * (RFt @ A[: t + 1]).sum(0)
        B[t + 1, : t + 1] = shrink * B[t, : t + 1] - (eta / delta) * torch.einsum("pab,psbc->sac", RFt, B[: t + 1, : t + 1])
        B[t + 1, t] -= (eta / delta) * I
        Bbig = B[: t + 2, : t + 1].permute(0, 2, 1, 3).reshape((t + 2) * m, (t + 1) * m)
        Abig = A[: t + 2].reshape((t + 2) * m, m)
        CFbig = CF[: t + 1, : t + 1].permute(0, 2, 1, 3).reshape((t + 1) * m, (t + 1) * m)
        rows = slice((t + 1) * m, (t + 2) * m)
        new = Abig[rows] @ Q00 @ Abig.T + Bbig[rows] @ (delta * CFbig) @ Bbig.T
        Qp[rows, : (t + 2) * m] = new
        Qp[: (t + 2) * m, rows] = new.T
        Qp[rows, rows] = 0.5 * (new[:, rows] + new[:, rows].T)

    idx = torch.arange(T + 1, device=dev)
    Qpd = Qp.reshape(T + 1, m, T + 1, m)[idx, :, idx, :]
    return {"M": M, "Q": M.transpose(1, 2) @ M + Qpd, "Qperp": Qpd, "train": train, "test": test,
            "C_F": CF, "R_F": RF, "R_theta": B[: T + 1], "z": z, "y": y, "u": out_u,
            "law": {t: {"z": z, "y": y, "u": out_u[t]} for t in keep}, "hard": lk.hard, "factor": Lf, "Qperp_all": Qp}
