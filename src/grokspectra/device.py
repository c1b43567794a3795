"""Device selection, dtype policy and seeding.

Every function in the package takes ``device`` and ``dtype`` explicitly; this module turns the user's
strings into torch objects, once, with a clear error when the request cannot be met.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def get_device(name: str | torch.device = "auto") -> torch.device:
    """Resolve a device request.

    ``"auto"`` gives CUDA when available and the CPU otherwise; ``"cpu"``, ``"cuda"`` and ``"cuda:N"`` are taken
    literally, and asking for CUDA on a machine without it raises a ``RuntimeError`` saying so.
    """
    if isinstance(name, torch.device):
        name = str(name)
    if not isinstance(name, str):
        raise TypeError(f"device must be a string such as 'auto', 'cpu' or 'cuda', not {type(name).__name__}")
    name = name.strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"device {name!r} was requested but CUDA is not available on this machine "
                f"(torch {torch.__version__}); use device='cpu' or device='auto'"
            )
        dev = torch.device(name)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise RuntimeError(f"device {name!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist")
        return dev
    raise ValueError(f"unknown device {name!r}; expected 'auto', 'cpu', 'cuda' or 'cuda:N'")


def get_dtype(name: str | torch.dtype = "float32") -> torch.dtype:
    """Resolve a dtype name (``"float32"`` for training, ``"float64"`` for linear algebra that needs it)."""
    if isinstance(name, torch.dtype):
        if name not in DTYPES.values():
            raise ValueError(f"unsupported dtype {name}; expected one of {sorted(DTYPES)}")
        return name
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPES)}") from None


def device_name(device: torch.device) -> str:
    """A human-readable device description for provenance records."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"


def seed_everything(seed: int) -> torch.Generator:
    """Seed python, numpy and torch (all devices); return a CPU ``torch.Generator`` seeded with ``seed``."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels (for timing only; never call this inside a training loop)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class DivergenceError(FloatingPointError):
    """A computation produced non-finite values or diverged. Engines raise it with the step where it happened;
    :meth:`grokspectra.experiments.Experiment.run` adds the experiment's name and parameters, and nothing is
    stored."""


def check_finite(what: str, step: int | str, *tensors: torch.Tensor, bound: float = 1e30) -> None:
    """Raise :class:`DivergenceError` naming ``what`` and ``step`` if any tensor holds a NaN, an infinity or a
    value beyond ``bound`` in magnitude (a diverging iteration). This synchronises with the device, so engines
    call it at a coarse cadence (every few dozen steps and at the end), not on every step."""
    for t in tensors:
        if t.numel() == 0:
            continue
        bad = ~torch.isfinite(t)
        if bool(bad.any()) or bool((t.detach().abs() > bound).any()):
            n_bad = int(bad.sum())
            raise DivergenceError(f"{what} diverged at step {step}: {n_bad} non-finite value(s) of {t.numel()}"
                                  f"{'' if n_bad else f', |x| > {bound:g}'}")
