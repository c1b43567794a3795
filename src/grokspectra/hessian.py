"""The exact Hessian of the empirical risk in the first layer, matrix-free and dense, and its lowest eigenpairs.

Book ``eq-ch2-hessian`` (chapter 2): with vec(Θ) ordered neuron-major, index (j, r) ↦ j·d + r,

    H = ∇²_Θ R̂(Θ) = (1/n) Σ_i D_i ⊗ x_i x_iᵀ + λ I,   D_i = D(Θᵀx_i; y_i) = ∇²_u L   (multiindex.per_sample_D).

A vector v ∈ R^{md} is the matrix V ∈ R^{d×m} with V[r, j] = v[j·d + r] (``V = v.reshape(m, d).T``).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse.linalg as sla
import torch

from .device import DivergenceError
from .multiindex import per_sample_D


class EigenConvergenceError(DivergenceError, RuntimeError):
    """The iterative eigensolver did not reach the requested residual (a ``grokspectra.device.DivergenceError``,
    so an experiment reports it with its name and parameters)."""

    def __init__(self, method: str, iterations: int, residual: float, tol: float):
        self.method, self.iterations, self.residual, self.tol = method, iterations, residual, tol
        super().__init__(f"{method} did not converge: relative residual {residual:.3e} > tol {tol:.1e} after "
                         f"{iterations} iterations (raise maxiter, loosen tol, or use method='dense' when md is small)")


def _finite(what: str, t: torch.Tensor) -> None:
    """Refuse non-finite input to an eigensolver (its output would be meaningless): raise ``DivergenceError``."""
    bad = int((~torch.isfinite(t)).sum())
    if bad:
        raise DivergenceError(f"Hessian eigensolver: {what} holds {bad} non-finite value(s) of {t.numel()} "
                              f"(the run that produced Θ diverged)")


def vec_to_mat(v: torch.Tensor, d: int, m: int) -> torch.Tensor:
    """[..., m·d] (neuron-major) → [..., d, m]."""
    return v.reshape(*v.shape[:-1], m, d).transpose(-1, -2)


def mat_to_vec(V: torch.Tensor) -> torch.Tensor:
    """[..., d, m] → [..., m·d] (neuron-major)."""
    return V.transpose(-1, -2).reshape(*V.shape[:-2], -1)


def hessian_weights(Theta, X, y, act="gelu", a=None, b=None, loss="square") -> torch.Tensor:
    """D_i = ∇²_u L(Θᵀx_i; y_i), [..., n, m, m] (chapter 2: the empirical Hessian weights, whose law → G_t)."""
    return per_sample_D(X @ Theta, y, act, a, b, loss)


def hessian_matvec(Theta, X, y, act, a, b, v, *, lam: float = 0.0, loss="square", D=None) -> torch.Tensor:
    """Matrix-free Hessian-vector product (``eq-ch2-hessian``), H = (1/n) Σ_i D_i ⊗ x_i x_iᵀ + λI, computed as

    HV = (1/n) Xᵀ [ (D_i (XV)_i)_i ] + λV   (two reads of X, no md×md matrix).

    Parameters
    ----------
    Theta : tensor [.., d, m]
    X : tensor [.., n, d]
    y : tensor [.., n]
    act, a, b, loss
        As in ``multiindex.per_sample_F``.
    v : tensor [..., d, m] or [..., m·d]
        Vector(s); the neuron-major flat layout is returned flat, the matrix layout as a matrix.
    lam : float
        Ridge λ.
    D : tensor [.., n, m, m], optional
        Precomputed Hessian weights (:func:`hessian_weights`), reused across products.

    Returns
    -------
    tensor, the shape of ``v``
    """
    d, m = Theta.shape[-2:]
    flat = v.dim() < 2 or tuple(v.shape[-2:]) != (d, m)
    V = vec_to_mat(v, d, m) if flat else v
    if D is None:
        D = hessian_weights(Theta, X, y, act, a, b, loss)
    n = X.shape[-2]
    W = (D @ (X @ V)[..., None]).squeeze(-1)  # [.., n, m]
    HV = X.transpose(-1, -2) @ W / n + lam * V
    return mat_to_vec(HV) if flat else HV


def hessian_dense(Theta, X, y, act="gelu", a=None, b=None, *, lam: float = 0.0, loss="square") -> torch.Tensor:
    """The dense Hessian of ``eq-ch2-hessian``, H = (1/n) Σ_i D_i ⊗ x_i x_iᵀ + λI, with blocks
    H[(j,·),(l,·)] = (1/n) Xᵀ diag(D_i[j,l]) X.

    Parameters are those of :func:`hessian_matvec` (without ``v``). Returns a tensor [.., m·d, m·d] (neuron-major);
    meant for md up to a few thousand (memory n·m²·d for the einsum and (md)² for H).
    """
    d, m = Theta.shape[-2:]
    n = X.shape[-2]
    D = hessian_weights(Theta, X, y, act, a, b, loss)
    H = torch.einsum("...ijl,...ir,...is->...jrls", D, X, X) / n
    H = H.reshape(*H.shape[:-4], m * d, m * d)
    if lam:
        H = H + lam * torch.eye(m * d, device=H.device, dtype=H.dtype)
    return H


def lowest_eigpairs(Theta, X, y, act="gelu", a=None, b=None, *, k: int = 1, method: str = "lobpcg",
                    lam: float = 0.0, loss="square", tol: float = 1e-6, maxiter: int = 2000, seed: int = 0):
    """The k lowest eigenvalues of H and their eigenvectors: ``(evals [k], evecs [md, k])``, ascending.

    ``method="dense"``: ``torch.linalg.eigh`` of :func:`hessian_dense` on Theta's device (batched over leading dims;
    for md up to a few thousand). ``method="lobpcg"`` (block LOBPCG) or ``"lanczos"`` (ARPACK, implicitly restarted
    Lanczos): scipy solvers driving the matrix-free :func:`hessian_matvec` in float64 on Theta's device, for one problem
    (no leading dims). Raises :class:`EigenConvergenceError` when the relative residual ‖Hv − λv‖/‖H‖ exceeds ``tol``.
    """
    _finite("Θ", Theta)
    if method == "dense":
        H = hessian_dense(Theta, X, y, act, a, b, lam=lam, loss=loss)
        _finite("the dense Hessian H", H)
        w, V = torch.linalg.eigh(H)
        return w[..., :k], V[..., :k]
    if method not in ("lobpcg", "lanczos"):
        raise ValueError(f"unknown method {method!r}; use 'lobpcg', 'lanczos' or 'dense'")
    if Theta.dim() != 2:
        raise ValueError("iterative eigensolvers take one problem: Theta [d, m], X [n, d], y [n]")
    d, m = Theta.shape
    dev = Theta.device
    Th, X64, y64 = Theta.double(), X.double(), y.double()
    D = hessian_weights(Th, X64, y64, act, a, b, loss)
    _finite("the Hessian weights D_i", D)

    def mv(V):
        V = np.asarray(V, dtype=np.float64)
        one = V.ndim == 1
        Vt = torch.from_numpy(V.reshape(m * d, -1)).to(dev).T  # [cols, md]
        out = hessian_matvec(Th, X64, y64, act, a, b, Vt, lam=lam, loss=loss, D=D).T.cpu().numpy()
        return out[:, 0] if one else out

    op = sla.LinearOperator((m * d, m * d), matvec=mv, matmat=mv, dtype=np.float64)
    rng = np.random.default_rng(seed)
    # scale of H for the relative residual: a few power steps bound ‖H‖ from below well enough
    q = rng.standard_normal(m * d)
    for _ in range(20):
        q = mv(q)
        nrm = np.linalg.norm(q)
        q /= nrm
    scale = max(nrm, 1e-30)
    it = maxiter
    if method == "lanczos":
        try:
            w, V = sla.eigsh(op, k=k, which="SA", tol=tol * 1e-2, maxiter=maxiter, v0=rng.standard_normal(m * d))
        except sla.ArpackNoConvergence as err:
            raise EigenConvergenceError("ARPACK Lanczos", maxiter, float("nan"), tol) from err
    else:
        bs = max(2 * k, k + 4)
        w, V = sla.lobpcg(op, rng.standard_normal((m * d, bs)), largest=False, tol=tol * scale * 1e-2,
                          maxiter=maxiter)
    order = np.argsort(w)[:k]
    w, V = w[order], V[:, order]
    res = np.linalg.norm(mv(V) - V * w, axis=0).max() / scale
    if not np.isfinite(res) or res > tol:
        raise EigenConvergenceError(method, it, float(res), tol)
    return (torch.from_numpy(w).to(dev, Theta.dtype), torch.from_numpy(np.ascontiguousarray(V)).to(dev, Theta.dtype))


def overlap_with(v: torch.Tensor, Theta_star: torch.Tensor) -> torch.Tensor:
    """‖(P ⊗ I_m) v‖² / ‖v‖² with P the projector on span(Θ_*): the weight of v on span(Θ_*) ⊗ R^m (``eq-ch3-overlap``).

    ``v`` [..., m·d], neuron-major vectors (for the output of :func:`lowest_eigpairs` pass ``evecs.T``);
    ``Theta_star`` [d, k] with orthonormal columns (pass Θ_* U_H for the hard directions). Returns [...].
    """
    d = Theta_star.shape[-2]
    m = v.shape[-1] // d
    if m < 1 or m * d != v.shape[-1]:
        raise ValueError(f"v has last dim {v.shape[-1]}, not a multiple of d={d} (pass vectors [..., m*d])")
    V = vec_to_mat(v, d, m)
    P = Theta_star.transpose(-1, -2) @ V  # [.., k, m]
    return (P ** 2).sum((-1, -2)) / (V ** 2).sum((-1, -2))
