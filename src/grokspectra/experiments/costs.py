"""Cost models for ``run --dry-run``: about seconds on one CPU thread, measured on the development machine for the
multi-index wing's engines; the dry-run's timed probe unit rescales them to the machine at hand.

Each function states what its cost is proportional to. They are used by the chapters' ``cost=`` functions only and
never by a computation, so they do not enter any code version. The ``*_bytes`` functions estimate peak memory
(bytes) for the experiments' ``peak_memory`` models, which let a sweep refuse a unit that cannot fit on the device
before it starts (:func:`grokspectra.sweep.run_units`).
"""
from __future__ import annotations


def gd_s(n: int, d: int, m: int, T: int, trials: int = 1, n_test: int = 0) -> float:
    """GD: T steps of two passes over X per trial, ∝ trials·n·d·T (a little more for m > 1), and the test risk on
    ``n_test`` fresh samples, ∝ trials·n_test·T."""
    return 2.2e-9 * trials * n * d * T * (1 + m) / 2 + 3.5e-8 * trials * n_test * T


def eigh_s(n: int, d: int, m: int) -> float:
    """One dense Hessian, ∝ n·(md)², and its full eigendecomposition, ∝ (md)³."""
    return 1e-10 * n * (m * d) ** 2 + 3.2e-10 * (m * d) ** 3


def dmft_s(N: float, T: int, m: int) -> float:
    """One DMFT run with its memory terms, ∝ N·m²·T²·(1 + T/40)."""
    return 4e-8 * N * m * m * T * T * (1 + T / 40)


def law_s(N: float, m: int) -> float:
    """Outlier equation, criterion or bulk edge of a law of N samples (a march on the real axis),
    ∝ (1 + N/20000)·m·(1 + m⁴/32): its per-sample m × m solves and their iterations grow fast with the width
    (chapter 3's criterion on 20 000 samples, measured on 4 December on 2 threads: 0.15, 0.45 and 7 s at
    m = 1, 2, 4 — ratios 3 and 15, which this model puts at 2.9 and 12; the earlier ∝ m put them at 2 and 2)."""
    return (0.3 + 1.5e-5 * N) * m * (1 + m ** 4 / 32)


def curves_s(N: float, m: int, n_x: int) -> float:
    """The density edge and the density curve of a law of N samples, ∝ N·m²·(1 + n_x/150)."""
    return 2.5e-4 * N * m * m + 1.7e-6 * N * n_x * m * m


def density_edge_s(N: float, m: int) -> float:
    """The density-fit edge alone of a law of N samples, ∝ N·m² (0.37 ms per sample at m = 2, measured on 6
    December on 2 threads for 4500–15 000 samples)."""
    return 9e-5 * N * m * m


def dmft_bytes(N: float, T: int, m: int, memory: bool = True, itemsize: int = 8) -> float:
    """Peak memory of one DMFT run (:func:`grokspectra.dmft.run_dmft`, float64 paths) above what the process held
    before it: the path responses χ(t, s), s ≤ t, N·m²·(T+1)(T+2)/2 values (``memory``), the per-step fields and
    noises, 2·N·m·(T+1), and the work arrays of one step (the response update and D), about 17·N·m², plus 24 values
    per path for the labels, latents and test samples. The peak resident memory of actual runs lies between 85 % and
    105 % of this (``tests/test_sweep.py::test_dmft_bytes_bounds_the_measured_peak``; measured 97–100 %)."""
    chi = m * m * ((T + 1) * (T + 2) / 2 + 17) if memory else 6 * m * m
    return float(itemsize) * N * (chi + 2 * m * (T + 1) + 24)


def gd_hessian_bytes(n: int, d: int, m: int, trials: int) -> float:
    """Peak memory of a block of chapter 3's GD-and-Hessian runs (``ch3.outliers``: ``trials`` float64 problems of
    n samples in dimension d, GD, then per run the dense Hessian of the md weights and the law of its weights):
    ≈ 8·n·d·(1.5·trials + 4·(m − 1)) + 32·(md)² bytes — the data, GD's work arrays and, for m > 1, the per-run
    Hessian products. Measured peaks of the unit lie 85–100 % of this (``tests/test_sweep.py``)."""
    return 8.0 * n * d * (1.5 * trials + 4 * (m - 1)) + 32.0 * (m * d) ** 2
