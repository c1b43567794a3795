"""Multi-index data, two-layer networks and batched full-batch gradient descent.

Conventions of the book's chapter 1 (equations ``eq-ch1-data`` and ``eq-ch1-gd``):

* data x ~ N(0, I_d), latent z = Θ_*ᵀx ∈ R^k with Θ_*ᵀΘ_* = I_k, label y = φ(z) (+ noise) (``eq-ch1-data``);
* network f(x) = (1/m) Σ_j a_j σ(θ_jᵀx + b_j), first layer Θ = [θ_1 … θ_m] ∈ R^{d×m} trained, a, b fixed (``eq-ch1-gd``);
* per-sample loss L(u; y) = ℓ(y, f(u)) of the pre-activations u = Θᵀx; F = ∇_u L, D = ∇²_u L;
* GD Θ ← (1 − ηλ) Θ − η (1/n) Xᵀ F(XΘ; y) (``eq-ch1-gd``); observables M = Θ_*ᵀΘ, Q = ΘᵀΘ, train and test risk.

Everything is batched: a leading ``trials`` dimension, and groups of different sample sizes n (one per δ).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import torch

from .device import DivergenceError, check_finite, check_steps

SQRT2 = math.sqrt(2.0)
INV_SQRT2PI = 1.0 / math.sqrt(2.0 * math.pi)


# --- activations ------------------------------------------------------------------------------------------------
def _gelu(u):
    return u * 0.5 * (1.0 + torch.erf(u / SQRT2))


def _gelu1(u):
    return 0.5 * (1.0 + torch.erf(u / SQRT2)) + u * INV_SQRT2PI * torch.exp(-0.5 * u * u)


def _gelu2(u):
    return INV_SQRT2PI * torch.exp(-0.5 * u * u) * (2.0 - u * u)


def _tanh1(u):
    return 1.0 - torch.tanh(u) ** 2


def _tanh2(u):
    t = torch.tanh(u)
    return -2.0 * t * (1.0 - t * t)


ACTIVATIONS: dict[str, tuple[Callable, Callable, Callable]] = {
    # GeLU σ = uΦ(u), σ' = Φ + uϕ, σ'' = ϕ(2 − u²)  (Hendrycks–Gimpel, arXiv:1606.08415)
    "gelu": (_gelu, _gelu1, _gelu2),
    # Quad σ = u²
    "quad": (lambda u: u * u, lambda u: 2.0 * u, lambda u: torch.full_like(u, 2.0)),
    # ReLU; σ'' = 0 away from the kink (a.e.)
    "relu": (torch.relu, lambda u: (u > 0).to(u.dtype), torch.zeros_like),
    "tanh": (torch.tanh, _tanh1, _tanh2),
}


def activation(name) -> tuple[Callable, Callable, Callable]:
    """(σ, σ', σ'') for ``name`` in :data:`ACTIVATIONS`; a 3-tuple of callables is returned as it is."""
    if isinstance(name, tuple) and len(name) == 3 and all(callable(f) for f in name):
        return name
    try:
        return ACTIVATIONS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown activation {name!r}; known: {sorted(ACTIVATIONS)} or a tuple (σ, σ', σ'')") from None


# --- losses -----------------------------------------------------------------------------------------------------
def _logcosh(r):
    a = r.abs()
    return a + torch.log1p(torch.exp(-2.0 * a)) - math.log(2.0)


LOSSES: dict[str, tuple[Callable, Callable, Callable]] = {
    # ℓ(r), ℓ'(r), ℓ''(r) of the residual r = f − y
    "square": (lambda r: 0.5 * r * r, lambda r: r, torch.ones_like),
    # bounded ℓ' (avoids the unbounded Hessian weights of chapter 2, "The caveat of unbounded labels")
    "logcosh": (_logcosh, torch.tanh, lambda r: 1.0 - torch.tanh(r) ** 2),
}


def _loss(name):
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; known: {sorted(LOSSES)}") from None


# --- links ------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Link:
    """A link y = φ(z) + noise·ε on the latent z ∈ R^k.

    ``hard`` lists the latent coordinates the label is even in given the others (chapter 1, "Easy and hard directions": E[z_H | y, z_E] = 0);
    the DMFT flips exactly these for antithetic sampling.
    """

    name: str
    fn: Callable[[torch.Tensor], torch.Tensor]
    k: int
    hard: tuple[int, ...]
    noise: float = 0.0

    def __call__(self, z: torch.Tensor, eps: torch.Tensor | None = None) -> torch.Tensor:
        if z.shape[-1] != self.k:
            raise ValueError(f"link {self.name!r} needs latent dimension k={self.k}, got z of shape {tuple(z.shape)}")
        y = self.fn(z)
        if self.noise:
            if eps is None:
                raise ValueError(f"link {self.name!r} has noise {self.noise}: pass eps (standard normal, shape {tuple(y.shape)})")
            y = y + self.noise * eps
        return y


LINKS = {
    "pr": lambda c=None: (lambda z: z[..., 0] ** 2, 1, (0,)),
    "pr_clip": lambda c=6.0: (lambda z: torch.clamp(z[..., 0] ** 2, max=c), 1, (0,)),
    "pr_tanh": lambda c=None: (lambda z: torch.tanh(z[..., 0] ** 2), 1, (0,)),
    "staircase": lambda c=None: (lambda z: z[..., 0] + z[..., 1] ** 2, 2, (1,)),
}


def link(name, *, c: float | None = None, k: int | None = None, hard: Sequence[int] | None = None,
         noise: float = 0.0) -> Link:
    """A :class:`Link`: ``"pr"`` y = z², ``"pr_clip"`` y = min(z², c) (c = 6 by default), ``"pr_tanh"``
    y = tanh(z²), ``"staircase"`` y = z₁ + z₂² (z₁ easy, z₂ hard), or a callable ``fn(z[..., k]) -> y[...]``
    (then ``k`` is required and ``hard`` defaults to every coordinate). A :class:`Link` is returned unchanged."""
    if isinstance(name, Link):
        return name
    if callable(name):
        if k is None:
            raise ValueError("a callable link needs its latent dimension k")
        return Link(getattr(name, "__name__", "custom"), name, int(k), tuple(range(k)) if hard is None else tuple(hard), noise)
    if name not in LINKS:
        raise ValueError(f"unknown link {name!r}; known: {sorted(LINKS)} or a callable")
    fn, kk, hh = LINKS[name]() if c is None else LINKS[name](c)
    if k is not None and k != kk:
        raise ValueError(f"link {name!r} has k={kk}, not {k}")
    return Link(name, fn, kk, hh if hard is None else tuple(hard), noise)


# --- per-sample loss, F = ∇_u L and D = ∇²_u L (eq-ch1-gd) ---------------------------------------------------------
def _parts(u, y, act, a, b, loss):
    s0, s1, s2 = activation(act)
    m = u.shape[-1]
    a = torch.ones(m, device=u.device, dtype=u.dtype) if a is None else torch.as_tensor(a, device=u.device, dtype=u.dtype)
    pre = u if b is None else u + torch.as_tensor(b, device=u.device, dtype=u.dtype)
    f = (a * s0(pre)).sum(-1) / m
    r = f - y
    l0, l1, l2 = _loss(loss)
    return pre, a, m, r, (l0, l1, l2), (s1, s2)


def per_sample_loss(u, y, act="gelu", a=None, b=None, loss="square") -> torch.Tensor:
    """L(u; y) = ℓ(f(u) − y) with f(u) = (1/m) Σ_j a_j σ(u_j + b_j) (``eq-ch1-gd``). ``u`` [..., m], ``y`` [...]."""
    _, _, _, r, (l0, _, _), _ = _parts(u, y, act, a, b, loss)
    return l0(r)


def per_sample_F(u, y, act="gelu", a=None, b=None, loss="square") -> torch.Tensor:
    """Per-sample gradient in the pre-activations, F(u; y) = ∇_u L = ℓ'(f − y) g with g_j = a_j σ'(u_j + b_j)/m
    (``eq-ch1-gd``; for the square loss ℓ' = f − y).

    Parameters
    ----------
    u : tensor [..., m]
        Pre-activations Θᵀx (any leading dims).
    y : tensor [...]
        Labels.
    act : str or (σ, σ', σ'')
        Activation (:data:`ACTIVATIONS`).
    a, b : tensor [m] or None
        Fixed second layer (default 1) and biases (default 0).
    loss : str
        ``"square"`` ½(f − y)² or ``"logcosh"`` (:data:`LOSSES`).

    Returns
    -------
    tensor [..., m]
    """
    pre, a, m, r, (_, l1, _), (s1, _) = _parts(u, y, act, a, b, loss)
    return l1(r)[..., None] * (a * s1(pre) / m)


def per_sample_F_and_loss(u, y, act="gelu", a=None, b=None, loss="square"):
    """(F, L) in one pass (the GD hot loop)."""
    pre, a, m, r, (l0, l1, _), (s1, _) = _parts(u, y, act, a, b, loss)
    return l1(r)[..., None] * (a * s1(pre) / m), l0(r)


def per_sample_FLD(u, y, act="gelu", a=None, b=None, loss="square", paths_last: bool = False):
    """(F, L, D) in one pass (the DMFT inner loop); see :func:`per_sample_F`, :func:`per_sample_D`. With
    ``paths_last`` (``u`` [N, m]), D is returned as [m, m, N], the layout of the DMFT's response arrays."""
    pre, a, m, r, (l0, l1, l2), (s1, s2) = _parts(u, y, act, a, b, loss)
    g = a * s1(pre) / m
    lr = l1(r)
    if paths_last:
        gT = g.T.contiguous()
        D = (l2(r) * gT)[:, None, :] * gT[None, :, :]
        D.diagonal(dim1=0, dim2=1).add_((lr[..., None] * (a * s2(pre) / m)))
        return lr[..., None] * g, l0(r), D
    D = l2(r)[..., None, None] * g[..., :, None] * g[..., None, :] + torch.diag_embed(lr[..., None] * (a * s2(pre) / m))
    return lr[..., None] * g, l0(r), D


def per_sample_D(u, y, act="gelu", a=None, b=None, loss="square") -> torch.Tensor:
    """Per-sample Hessian in the pre-activations (the Hessian weight of ``eq-ch2-hessian``),

    D(u; y) = ∇²_u L = ℓ''(f − y) g gᵀ + ℓ'(f − y) diag(a_j σ''(u_j + b_j)/m),  g_j = a_j σ'(u_j + b_j)/m.

    Parameters are those of :func:`per_sample_F`. Returns a tensor [..., m, m] (symmetric).
    """
    pre, a, m, r, (_, l1, l2), (s1, s2) = _parts(u, y, act, a, b, loss)
    g = a * s1(pre) / m
    D = l2(r)[..., None, None] * g[..., :, None] * g[..., None, :]
    return D + torch.diag_embed(l1(r)[..., None] * (a * s2(pre) / m))


# --- data ---------------------------------------------------------------------------------------------------------
def make_generator(generator, device) -> torch.Generator:
    """A generator on ``device``: an int seeds a new one; a generator on another device seeds a new one from it."""
    device = torch.device(device)
    if isinstance(generator, torch.Generator):
        if generator.device.type == device.type:
            return generator
        seed = int(torch.randint(0, 2**62, (1,), generator=generator).item())
    elif generator is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    else:
        seed = int(generator)
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


@dataclasses.dataclass
class Problem:
    """Training data for ``trials`` independent problems at each sample size ``n[g]`` (group g ↔ δ_g = n_g/d).

    ``X[g]`` [trials, n_g, d], ``y[g]`` [trials, n_g], ``Theta_star[g]`` [trials, d, k] (orthonormal columns).
    ``single`` is True when one n (not a list) was asked for; results then have no group dimension.
    """

    d: int
    n: list[int]
    k: int
    link: Link
    X: list[torch.Tensor]
    y: list[torch.Tensor]
    Theta_star: list[torch.Tensor]
    single: bool

    @property
    def trials(self) -> int:
        return self.X[0].shape[0]

    @property
    def delta(self) -> list[float]:
        return [n / self.d for n in self.n]


def random_orthonormal(trials, d, k, *, device, dtype, generator) -> torch.Tensor:
    """Θ_* [trials, d, k] uniformly distributed with Θ_*ᵀΘ_* = I_k (QR of a Gaussian matrix, signs fixed)."""
    G = torch.randn(trials, d, k, device=device, dtype=dtype, generator=generator)
    Qm, R = torch.linalg.qr(G)
    return Qm * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)


def sample_problem(d: int, n, k: int, link_, *, trials: int = 1, device="cpu", dtype=torch.float32,
                   generator=None) -> Problem:
    """Draw the training data of ``eq-ch1-data``: x_i ~ N(0, I_d), Θ_* uniform with orthonormal columns, y_i = φ(Θ_*ᵀx_i).

    Parameters
    ----------
    d, k : int
        Input and latent dimension (k must equal the link's).
    n : int or list of int
        Sample size(s); one group per entry, δ_g = n_g/d.
    link_ : str, callable or Link
        See :func:`link`.
    trials : int
        Independent problems per group (their own Θ_*, X, y).
    device, dtype, generator
        Placement, precision and randomness (an int seed or a ``torch.Generator``; see :func:`make_generator`).

    Returns
    -------
    Problem
    """
    lk = link(link_)
    if lk.k != k:
        raise ValueError(f"link {lk.name!r} has latent dimension {lk.k}, but k={k} was given")
    single = isinstance(n, int)
    ns = [int(n)] if single else [int(v) for v in n]
    if d < k or min(ns) < 1 or trials < 1:
        raise ValueError(f"need d >= k, n >= 1 and trials >= 1; got d={d}, k={k}, n={ns}, trials={trials}")
    g = make_generator(generator, device)
    Xs, ys, Ts = [], [], []
    for nn in ns:
        Ts.append(random_orthonormal(trials, d, k, device=device, dtype=dtype, generator=g))
        X = torch.randn(trials, nn, d, device=device, dtype=dtype, generator=g)
        eps = torch.randn(trials, nn, device=device, dtype=dtype, generator=g) if lk.noise else None
        Xs.append(X)
        ys.append(lk(torch.bmm(X, Ts[-1]), eps))
    return Problem(d, ns, k, lk, Xs, ys, Ts, single)


def init_theta(Theta_star, m: int, *, M0=None, Q0=None, generator=None) -> torch.Tensor:
    """Initial first layer [trials, d, m] (chapter 1: random or warm start).

    Random (``M0`` None): θ_j ~ N(0, I_d/d). Warm: Θ = Θ_* M0 + Θ_⊥ with Θ_⊥ ⟂ span Θ_*, Θ_⊥ᵀΘ_⊥ ≈ Q0 (default I_m),
    i.e. the DMFT initial condition (M_0, Q_⊥(0,0)).
    """
    trials, d, k = Theta_star.shape
    dev, dt = Theta_star.device, Theta_star.dtype
    generator = make_generator(generator, dev)
    W = torch.randn(trials, d, m, device=dev, dtype=dt, generator=generator) / math.sqrt(d)
    if M0 is None and Q0 is None:
        return W
    W = (W - Theta_star @ (Theta_star.transpose(1, 2) @ W)) * math.sqrt(d / (d - k))
    if Q0 is not None:
        W = W @ torch.linalg.cholesky(torch.as_tensor(Q0, device=dev, dtype=dt)).T
    if M0 is not None:
        M0 = torch.as_tensor(M0, device=dev, dtype=dt)
        if M0.shape != (k, m):
            raise ValueError(f"M0 must have shape (k, m) = {(k, m)}, got {tuple(M0.shape)}")
        W = W + Theta_star @ M0
    return W


def spectral_direction(Theta_star, link_, n_spec: int, preprocess: Callable, *, iters: int = 300,
                       generator=None) -> torch.Tensor:
    """Leading eigenvector [trials, d] of (1/n) Σ T(y_i) x_i x_iᵀ on an *independent* sample of size ``n_spec``
    (sample splitting, as for the spectral initialisations of chapter 4), by shifted power iteration (matrix-free, two reads of X per iteration)."""
    lk = link(link_)
    trials, d, k = Theta_star.shape
    dev, dt = Theta_star.device, Theta_star.dtype
    generator = make_generator(generator, dev)
    X = torch.randn(trials, n_spec, d, device=dev, dtype=dt, generator=generator)
    eps = torch.randn(trials, n_spec, device=dev, dtype=dt, generator=generator) if lk.noise else None
    Tn = preprocess(lk(X @ Theta_star, eps))
    shift = Tn.abs().amax(-1, keepdim=True) * (1 + math.sqrt(d / n_spec)) ** 2  # makes the matrix PSD
    v = torch.randn(trials, d, device=dev, dtype=dt, generator=generator)
    v = v / v.norm(dim=-1, keepdim=True)
    for _ in range(iters):
        w = ((X @ v[..., None]).squeeze(-1) * Tn)[..., None]
        v = (X.transpose(1, 2) @ w).squeeze(-1) / n_spec + shift * v
        v = v / v.norm(dim=-1, keepdim=True)
    check_finite("spectral initialisation (power iteration)", iters, v)
    return v


# --- gradient descent ---------------------------------------------------------------------------------------------
CHECK_EVERY = 50  # steps between divergence checks (each is one host synchronisation)


def fresh_latents(k: int, m: int, n_test: int, link_, *, device, dtype, generator, batch: tuple = ()):
    """Fresh test samples in the (k + m)-dimensional latent space: (z [*batch, n_test, k], ξ [*batch, n_test, m],
    y [*batch, n_test]). For x ~ N(0, I_d) the pair (Θ_*ᵀx, Θᵀx) is exactly Gaussian with covariance
    [[I, M], [Mᵀ, Q]], so u = zM + ξ chol(Q − MᵀM)ᵀ has the law of the test pre-activations: the test risk on fresh
    data needs no d-dimensional test set."""
    lk = link(link_)
    z = torch.randn(*batch, n_test, k, device=device, dtype=dtype, generator=generator)
    xi = torch.randn(*batch, n_test, m, device=device, dtype=dtype, generator=generator)
    eps = torch.randn(*batch, n_test, device=device, dtype=dtype, generator=generator) if lk.noise else None
    return z, xi, lk(z, eps)


def risk_from_overlaps(M, Q, z, xi, y, act="gelu", a=None, b=None, loss="square") -> torch.Tensor:
    """Test risk E L(u; y) with u = zM + ξ Sᵀ, S Sᵀ = Q − MᵀM, batched over the leading dims of M [.., k, m] and
    Q [.., m, m]. S = V diag(√max(w, 0)) from the float64 eigendecomposition of Q − MᵀM, so rounding that makes
    Q − MᵀM slightly indefinite (well-aligned Θ in float32) cannot produce NaNs; no host synchronisation."""
    Qp = (Q - M.transpose(-1, -2) @ M).double()
    w, V = torch.linalg.eigh(0.5 * (Qp + Qp.transpose(-1, -2)))
    S = (V * w.clamp(min=0.0).sqrt().unsqueeze(-2)).to(Q.dtype)
    u = z @ M + xi @ S.transpose(-1, -2)  # [.., n_test, m]
    return per_sample_loss(u, y, act, a, b, loss).mean(-1)


def run_gd(prob: Problem, m: int, eta: float, T: int, *, act="gelu", a=None, b=None, lam: float = 0.0,
           loss="square", M0=None, Q0=None, Theta0=None, keep: Sequence[int] = (), n_test: int = 8192,
           return_theta: bool = False, diverged: str = "raise", generator=None) -> dict:
    """Full-batch GD on the first layer (``eq-ch1-gd``), batched over trials, for every group (sample size) of ``prob``:

    Θ^{t+1} = (1 − ηλ) Θ^t − η (1/n) Xᵀ F(XΘ^t; y).

    Each step reads X twice (XΘ and XᵀF) and records on the device, without host synchronisation, the observables of
    chapter 1. Groups run one after the other, each batched over its trials.

    Parameters
    ----------
    prob : Problem
        From :func:`sample_problem`.
    m, eta, T : int, float, int
        Width, step size, number of steps.
    act, a, b, loss
        As in :func:`per_sample_F`.
    lam : float
        Ridge λ (``eq-ch1-gd``).
    M0, Q0 : array [k, m], array [m, m], optional
        Warm start (:func:`init_theta`); random init θ_j ~ N(0, I_d/d) when both are None.
    Theta0 : tensor [trials, d, m] or list of them (one per group), optional
        Explicit initialisation (e.g. a spectral init on an independent sample); overrides M0/Q0.
    keep : sequence of int
        Steps whose Θ is returned in ``out["theta"][t]``; ``return_theta`` adds the final one.
    n_test : int
        Fresh test samples per trial (:func:`fresh_latents`).
    diverged : ``"raise"`` or ``"mark"``
        What a trial whose train risk or ΘᵀΘ becomes NaN, infinite or larger than 1e30 does: ``"raise"`` stops with
        :class:`~grokspectra.device.DivergenceError` naming the first such step; ``"mark"`` (for experiments that
        count a blown-up run as a failure of GD, e.g. success rates) keeps its values as they are and records the
        step in ``out["diverged_at"]``.
    generator
        Seed or generator for the initialisation and the test samples.

    Returns
    -------
    dict
        ``M`` [.., T+1, k, m] = Θ_*ᵀΘ^t, ``Q`` [.., T+1, m, m] = Θ^tᵀΘ^t, ``train`` [.., T+1] = (1/n) Σ_i L(u_i^t; y_i)
        (without the ridge term), ``test`` [.., T+1] (fresh data), ``theta`` {t: Θ^t}. Leading dims are [trials] for a
        single n, else [groups, trials] (and ``theta[t]`` is then a list over groups). With ``diverged="mark"`` also
        ``diverged_at`` [..] (int64): the first step at which the trial diverged, −1 when it did not.

    Raises
    ------
    grokspectra.device.DivergenceError
        (``diverged="raise"``) When the train risk or ΘᵀΘ of a trial becomes NaN, infinite or larger than 1e30,
        naming the first such step (checked every :data:`CHECK_EVERY` steps and at the end).
    """
    if diverged not in ("raise", "mark"):
        raise ValueError(f"diverged must be 'raise' or 'mark', not {diverged!r}")
    if T < 0 or eta <= 0:
        raise ValueError(f"need T >= 0 and eta > 0; got T={T}, eta={eta}")
    keep = sorted(set(int(t) for t in keep) | ({T} if return_theta else set()))
    if any(t < 0 or t > T for t in keep):
        raise ValueError(f"keep steps must lie in [0, T={T}]; got {keep}")
    X0 = prob.X[0]
    dev, dt = X0.device, X0.dtype
    gen = make_generator(generator, dev)
    shrink = 1.0 - eta * lam
    outs = []
    for gi, (X, y, Ts) in enumerate(zip(prob.X, prob.y, prob.Theta_star)):
        B, n, d = X.shape
        # an independent test set per trial (so the spread over trials includes the test-set noise)
        z_te, xi_te, y_te = fresh_latents(prob.k, m, n_test, prob.link, device=dev, dtype=dt, generator=gen, batch=(B, 1))
        if Theta0 is None:
            Th = init_theta(Ts, m, M0=M0, Q0=Q0, generator=gen)
        else:
            Th = Theta0[gi] if isinstance(Theta0, (list, tuple)) else Theta0
            Th = Th.to(device=dev, dtype=dt).clone()
        Ms = torch.empty(B, T + 1, prob.k, m, device=dev, dtype=dt)
        Qs = torch.empty(B, T + 1, m, m, device=dev, dtype=dt)
        tr = torch.empty(B, T + 1, device=dev, dtype=dt)
        Tt = Ts.transpose(1, 2)
        kept = {}
        c0 = 0  # first step not yet checked for divergence
        bad_at = torch.full((B,), -1, device=dev, dtype=torch.int64)
        for t in range(T + 1):
            Ms[:, t] = Tt @ Th
            Qs[:, t] = Th.transpose(1, 2) @ Th
            if t in keep:
                kept[t] = Th.clone()
            U = torch.bmm(X, Th)
            F, L = per_sample_F_and_loss(U, y, act, a, b, loss)
            tr[:, t] = L.mean(-1)
            if (t % CHECK_EVERY == CHECK_EVERY - 1 or t == T) and diverged == "raise":  # one host sync per check
                check_steps(f"GD (n = {n}, d = {d}, m = {m}, η = {eta:g})", c0,
                            {"train risk": tr[:, c0:t + 1], "ΘᵀΘ": Qs[:, c0:t + 1]}, dim=1,
                            hint="the step size is too large for this problem (reduce eta)")
                c0 = t + 1
            elif t % CHECK_EVERY == CHECK_EVERY - 1 or t == T:  # "mark": on the device, no synchronisation
                w = slice(c0, t + 1)
                flag = (~torch.isfinite(tr[:, w]) | (tr[:, w].abs() > 1e30)
                        | (~torch.isfinite(Qs[:, w]) | (Qs[:, w].abs() > 1e30)).flatten(2).any(-1))  # [B, steps]
                first = torch.where(flag.any(1), c0 + flag.to(torch.int8).argmax(1), -1)
                bad_at = torch.where(bad_at >= 0, bad_at, first)
                c0 = t + 1
            if t < T:  # Θ ← (1 − ηλ)Θ − (η/n) XᵀF, with XᵀF formed as (FᵀX)ᵀ: X is read row-major (≈10× faster
                # on CPU for small m than a product with the transposed view)
                Th = torch.add(Th * shrink, torch.bmm(F.transpose(1, 2), X).transpose(1, 2), alpha=-eta / n)
        te = torch.cat([risk_from_overlaps(Ms[:, s:s + 32], Qs[:, s:s + 32], z_te, xi_te, y_te, act, a, b, loss)
                        for s in range(0, T + 1, 32)], dim=1)
        outs.append({"M": Ms, "Q": Qs, "train": tr, "test": te, "theta": kept})
        if diverged == "mark":
            outs[-1]["diverged_at"] = bad_at
    if prob.single:
        return outs[0]
    res = {key: torch.stack([o[key] for o in outs]) for key in ("M", "Q", "train", "test")
           + (("diverged_at",) if diverged == "mark" else ())}
    res["theta"] = {t: [o["theta"][t] for o in outs] for t in keep}
    return res


# --- gradient descent on shared data: nested sample sizes, several students -------------------------------------
def _value_and_slope(act: str):
    """u ↦ (σ(u), σ'(u)) in few passes over u (GeLU: one erf and one exp for both, in place on fresh buffers)."""
    if act == "gelu":
        def f(u):
            Phi = torch.mul(u, 1.0 / SQRT2).erf_().add_(1.0).mul_(0.5)  # Φ(u)
            slope = torch.mul(u, u).mul_(-0.5).exp_().mul_(u)  # √(2π) u φ(u)
            slope = slope.mul_(INV_SQRT2PI).add_(Phi)  # Φ(u) + u φ(u)
            return Phi.mul_(u), slope
        return f
    if act == "quad":
        return lambda u: (u * u, 2.0 * u)
    s0, s1, _ = activation(act)
    return lambda u: (s0(u), s1(u))


def run_gd_shared(prob: Problem, ns: Sequence[int], students: Sequence[tuple], T: int, *, lam: float = 0.0,
                  n_test: int = 8192, test_at: Sequence[int] | None = None,
                  Theta0: Sequence[torch.Tensor] | None = None, diverged: str = "raise",
                  generator=None) -> list[dict]:
    """Full-batch GD (``eq-ch1-gd``) for several students and several sample sizes on *shared* data: the problem
    with sample size n_g uses the first n_g rows of each trial's X (nested data sets, common random numbers), and
    every student trains on every n_g from its own random start θ_j ~ N(0, I_d/d) (the same start for every n_g).

    For each student s = (σ_s, m_s, η_s) and size n_g this is exactly :func:`run_gd` on the rows X[:n_g]:
    Θ^{t+1} = (1 − η_sλ) Θ^t − (η_s/n_g) X[:n_g]ᵀ F_s(X[:n_g]Θ^t; y[:n_g]). All the Θ's of a trial are the
    columns of one d × C matrix (C = Σ_g Σ_s m_s), so each step is two skinny matrix products over the rows of
    X, split where the sample sizes end (rows past n_g skip the columns of size g): X is read twice per step for
    all students and sizes together, instead of once per (student, size) pair and product.

    Parameters
    ----------
    prob : Problem
        One group (a single n ≥ max ``ns``), from :func:`sample_problem`.
    ns : sequence of int
        Sample sizes n_g ≤ prob.n[0] (distinct).
    students : sequence of (activation, m, eta)
        The networks (second layer a = 1, no biases, square loss).
    T, lam, n_test
        Steps, ridge λ, fresh test samples per trial (as :func:`run_gd`).
    test_at : sequence of int, optional
        The steps at which the test risk is evaluated (default: every step). With T = 1000 and 16384 test
        samples, evaluating it at every step costs as much as a few hundred GD steps.
    Theta0 : list of tensors [trials, d, m_s], optional
        Explicit starts, one per student (default: drawn from ``generator`` after the test samples).
    diverged : ``"raise"`` or ``"mark"``
        As :func:`run_gd`; a diverged (student, size, trial) does not affect the others (its own columns only).
    generator
        Seed or generator for the starts and the test samples.

    Returns
    -------
    list of dict, one per student
        ``M`` [G, trials, T+1, k, m], ``Q`` [G, trials, T+1, m, m], ``train`` [G, trials, T+1], ``test``
        [G, trials, len(test_at)] (every step by default) and, with
        ``diverged="mark"``, ``diverged_at`` [G, trials] (−1 when not diverged); G follows the order of ``ns``.
    """
    if diverged not in ("raise", "mark"):
        raise ValueError(f"diverged must be 'raise' or 'mark', not {diverged!r}")
    if len(prob.n) != 1:
        raise ValueError("run_gd_shared needs a problem with one sample size (the largest); the sizes go in ns")
    ns = [int(v) for v in ns]
    n_max = prob.n[0]
    if len(set(ns)) != len(ns) or min(ns) < 1 or max(ns) > n_max:
        raise ValueError(f"ns must be distinct sizes in [1, {n_max}]; got {ns}")
    if T < 0 or lam < 0:
        raise ValueError(f"need T >= 0 and lam >= 0; got T={T}, lam={lam}")
    studs = []
    for st in students:
        act, m, eta = st
        activation(act)
        if int(m) < 1 or not float(eta) > 0:
            raise ValueError(f"student {st!r}: need m >= 1 and eta > 0")
        studs.append((act, int(m), float(eta)))
    X, y, Ts = prob.X[0], prob.y[0], prob.Theta_star[0]
    B, _, d = X.shape
    k, dev, dt = prob.k, X.device, X.dtype
    gen = make_generator(generator, dev)
    G, S = len(ns), len(studs)
    order = sorted(range(G), key=lambda g: -ns[g])  # column blocks by decreasing n: active columns are a prefix
    n_desc = [ns[g] for g in order]
    ms = [m for _, m, _ in studs]
    Cg = sum(ms)
    C = G * Cg
    off = [sum(ms[:s]) for s in range(S)]
    # per-column step η_s/n_g and shrink 1 − η_s λ, in the column order (block of size order[j], student s)
    scale = torch.tensor([studs[s][2] / n_desc[j] for j in range(G) for s in range(S) for _ in range(ms[s])],
                         device=dev, dtype=dt)
    shrink = torch.tensor([1.0 - studs[s][2] * lam for j in range(G) for s in range(S) for _ in range(ms[s])],
                          device=dev, dtype=dt)
    # row segments: rows [n_desc[a], n_desc[a-1]) are used by the first a blocks (n_desc[G] := 0)
    bounds = n_desc + [0]
    segs = [(bounds[a], bounds[a - 1], a * Cg) for a in range(G, 0, -1) if bounds[a - 1] > bounds[a]]
    tests = [fresh_latents(k, m, n_test, prob.link, device=dev, dtype=dt, generator=gen, batch=(B, 1))
             for _, m, _ in studs]
    starts = ([init_theta(Ts, m, generator=gen) for _, m, _ in studs] if Theta0 is None
              else [th.to(device=dev, dtype=dt) for th in Theta0])  # [B, d, m_s] each
    if [tuple(th.shape) for th in starts] != [(B, d, m) for m in ms]:
        raise ValueError(f"Theta0 must hold one [trials, d, m] tensor per student: {[(B, d, m) for m in ms]}")
    Mrec = torch.empty(B, T + 1, C, k, device=dev, dtype=dt)
    Qrec = torch.empty(B, T + 1, C, C, device=dev, dtype=dt)
    Lrec = torch.zeros(B, T + 1, G, S, device=dev, dtype=dt)  # blocks in column order (decreasing n)
    fns = [_value_and_slope(act) for act, _, _ in studs]
    t_test = list(range(T + 1)) if test_at is None else sorted(set(int(v) for v in test_at))
    if not t_test or t_test[0] < 0 or t_test[-1] > T:
        raise ValueError(f"test_at must be steps in [0, T={T}]; got {test_at}")
    for b in range(B):
        Xb, yb, Tb = X[b], y[b], Ts[b]
        Wt = torch.cat([starts[s][b].T for _ in range(G) for s in range(S)], dim=0).contiguous()  # [C, d]
        # pre-activations and gradients kept transposed, [C, n_max]: each (block, student) is an [m, n] slab with
        # the samples contiguous. Only a block's own rows [0, n_g) are ever computed or read, so the products write
        # straight into them (row segments) and the elementwise work touches Σ_g n_g rows, not G·n_max.
        Ut = torch.empty(C, n_max, device=dev, dtype=dt)
        Ft = torch.empty(C, n_max, device=dev, dtype=dt)
        Gr = torch.empty(C, d, device=dev, dtype=dt)
        L = torch.empty(G, S, device=dev, dtype=dt)
        for t in range(T + 1):
            torch.mm(Wt, Tb, out=Mrec[b, t])
            torch.mm(Wt, Wt.T, out=Qrec[b, t])
            for lo, hi, c in segs:
                torch.mm(Wt[:c], Xb[lo:hi].T, out=Ut[:c, lo:hi])
            for j, n in enumerate(n_desc):
                for s, fn in enumerate(fns):
                    c0, m = j * Cg + off[s], ms[s]
                    v, slope = fn(Ut[c0:c0 + m, :n])  # [m, n]
                    r = (v.sum(0) if m > 1 else v[0]).mul_(1.0 / m).sub_(yb[:n])  # residual [n]
                    torch.mul(slope, r.mul(1.0 / m), out=Ft[c0:c0 + m, :n])
                    L[j, s] = torch.dot(r, r) * (0.5 / n)  # ½ mean of r² over the block's rows
            Lrec[b, t] = L
            if t == T:
                break
            for lo, hi, c in segs:
                if lo == 0:
                    torch.mm(Ft[:c, lo:hi], Xb[lo:hi], out=Gr[:c])
                else:
                    Gr[:c].addmm_(Ft[:c, lo:hi], Xb[lo:hi])
            Wt = Wt.mul_(shrink[:, None]).addcmul_(scale[:, None], Gr, value=-1.0)
    # back to one dict per student, in the order of ns
    inv = {g: j for j, g in enumerate(order)}
    outs = []
    for s, (act, m, _) in enumerate(studs):
        cols = [[inv[g] * Cg + off[s] + i for i in range(m)] for g in range(G)]
        idx = torch.tensor(cols, device=dev)  # [G, m]
        M = Mrec[:, :, idx].permute(2, 0, 1, 4, 3)  # [G, B, T+1, k, m]
        Q = Qrec[:, :, idx[:, :, None], idx[:, None, :]].permute(2, 0, 1, 3, 4)  # [G, B, T+1, m, m]
        train = Lrec[:, :, [inv[g] for g in range(G)], s].permute(2, 0, 1)
        z, xi, yt = tests[s]
        tt = torch.tensor(t_test, device=dev)
        test = torch.cat([risk_from_overlaps(M[:, :, tt[a:a + 32]], Q[:, :, tt[a:a + 32]], z, xi, yt, act)
                          for a in range(0, len(t_test), 32)], dim=-1)
        o = {"M": M.contiguous(), "Q": Q.contiguous(), "train": train.contiguous(), "test": test}
        flag = (~torch.isfinite(train) | (train.abs() > 1e30)
                | (~torch.isfinite(Q) | (Q.abs() > 1e30)).flatten(3).any(-1))  # [G, B, T+1]
        first = torch.where(flag.any(-1), flag.to(torch.int8).argmax(-1), -1)
        if diverged == "raise" and bool((first >= 0).any()):
            g, bb = [int(v) for v in torch.nonzero(first >= 0)[0]]
            raise DivergenceError(f"GD (student {act}:{m}:{studs[s][2]:g}, n = {ns[g]}, d = {d}) diverged at step "
                                  f"{int(first[g, bb])} in trial {bb}: the step size is too large for this problem "
                                  "(reduce eta)")
        if diverged == "mark":
            o["diverged_at"] = first
        outs.append(o)
    return outs
