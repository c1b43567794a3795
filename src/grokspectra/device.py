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


class DeviceUnavailable(RuntimeError):
    """The requested device does not exist on this machine (e.g. ``cuda`` without CUDA)."""


class SettingError(ValueError):
    """An environment setting (e.g. ``$GROKSPECTRA_THREADS``) has a value that is not allowed."""


def get_device(name: str | torch.device = "auto") -> torch.device:
    """Resolve a device request.

    ``"auto"`` gives CUDA when available and the CPU otherwise; ``"cpu"``, ``"cuda"`` and ``"cuda:N"`` are taken
    literally, and asking for CUDA on a machine without it raises :class:`DeviceUnavailable` (a ``RuntimeError``)
    saying so. The first call also sets the CPU thread count (:func:`ensure_threads`).
    """
    if isinstance(name, torch.device):
        name = str(name)
    if not isinstance(name, str):
        raise TypeError(f"device must be a string such as 'auto', 'cpu' or 'cuda', not {type(name).__name__}")
    name = name.strip().lower()
    ensure_threads()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DeviceUnavailable(
                f"device {name!r} was requested but CUDA is not available on this machine "
                f"(torch {torch.__version__}); use device='cpu' or device='auto'"
            )
        dev = torch.device(name)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceUnavailable(f"device {name!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist")
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
    """A human-readable device description for provenance records: a GPU's name, or the CPU's model with its cores
    and torch threads (the model, because its vector instructions decide which BLAS kernels run, and with them both
    the speed and the roundoff of a result)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    n = torch.get_num_threads()
    return f"cpu ({cpu_model()}, {os.cpu_count()} cores, {n} torch thread{'' if n == 1 else 's'})"


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (``/proc/cpuinfo``), else the platform's processor or machine
    name, else ``"unknown model"``."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Processor") and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown model"


def device_memory(device: torch.device) -> tuple[float, str]:
    """The memory one computation on ``device`` can use in all, in bytes, and a description of it: a GPU's total
    memory, or the host's physical memory capped by a cgroup (container) memory limit. A total, not what is free
    now: it is what decides whether a computation can run on this machine at all, whatever else runs beside it."""
    if device.type == "cuda":
        total = float(torch.cuda.get_device_properties(device).total_memory)
        return total, f"the {torch.cuda.get_device_name(device)}'s {total / 2 ** 30:.0f} GiB"
    total = float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    where = "this machine's"
    try:  # cgroup v2: "max" or a number of bytes
        lim = open("/sys/fs/cgroup/memory.max").read().strip()
        if lim != "max" and float(lim) < total:
            total, where = float(lim), "this container's"
    except (OSError, ValueError):
        pass
    return total, f"{where} {total / 2 ** 30:.1f} GiB of memory"


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


# --- CPU threads ----------------------------------------------------------------------------------------------------
_THREADS_SET: int | None = None


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity set, capped by a cgroup (container) CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:  # cgroup v2: "max 100000" or "<quota> <period>"
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def choose_threads(*, apply: bool = True) -> int:
    """The number of torch CPU threads, and (``apply``) set it.

    ``$GROKSPECTRA_THREADS`` (a positive integer) wins; otherwise, when ``$OMP_NUM_THREADS`` is set, torch's own
    choice from it is kept; otherwise the cores actually free: ``max(1, min(cores, round(cores − (load − 1)⁺)))``
    with ``cores`` from :func:`available_cores` and ``load`` the 1-minute load average, less the one runnable
    process that is this job's own pipeline (so a job alone on the machine uses every core). On a busy machine more threads
    than free cores make every thread wait for the others at each parallel region, which can be many times slower
    than one thread. Raises :class:`SettingError` naming the variable when its value is not a positive integer.
    """
    global _THREADS_SET
    raw = os.environ.get("GROKSPECTRA_THREADS")
    if raw is not None and raw.strip() != "":
        try:
            n = int(raw.strip())
        except ValueError:
            n = 0
        if n < 1:
            raise SettingError(f"GROKSPECTRA_THREADS={raw!r} is not allowed: give a positive integer (torch CPU "
                               f"threads; this machine has {available_cores()} cores), or unset it to use the free cores")
    elif os.environ.get("OMP_NUM_THREADS", "").strip():
        n = torch.get_num_threads()
    else:
        cores = available_cores()
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = 0.0
        n = max(1, min(cores, round(cores - max(0.0, load - 1.0))))
    if apply and n != torch.get_num_threads():
        torch.set_num_threads(n)
    if apply:
        limit_blas_threads(n)
        _THREADS_SET = n
    return n


def limit_blas_threads(n: int) -> None:
    """Cap the BLAS libraries of NumPy and SciPy (OpenBLAS, MKL) at ``n`` threads, like torch's: left alone they use
    every core whatever the load, which made SciPy's eigensolvers 20–30× slower beside another job. SciPy's BLAS
    is loaded first, since threadpoolctl only reaches libraries already loaded."""
    import scipy.linalg  # noqa: F401  (loads SciPy's OpenBLAS)
    from threadpoolctl import threadpool_limits
    threadpool_limits(limits=n, user_api="blas")


def ensure_threads() -> None:
    """Apply :func:`choose_threads` once per process. It is tried when this module is first imported (so a
    notebook's own later ``torch.set_num_threads`` wins), and again by :func:`get_device` if that failed, which then
    raises the :class:`SettingError`."""
    if _THREADS_SET is None:
        choose_threads()


try:
    ensure_threads()
except SettingError:
    pass  # reported by the command line at start, and by get_device before any computation


def check_steps(what: str, t0: int, series: dict[str, torch.Tensor], *, dim: int = 0, bound: float = 1e30,
                hint: str = "") -> None:
    """Raise :class:`DivergenceError` at the *first* step where a recorded series went bad.

    ``series`` maps names to tensors whose dimension ``dim`` is the step (all the same length; entry ``i`` is step
    ``t0 + i``). A step is bad when any value is NaN, infinite or beyond ``bound`` in magnitude. One host
    synchronisation per call, so engines record on the device and call this every few dozen steps and at the end.
    """
    flags = None
    for x in series.values():
        x = x.detach().movedim(dim, 0)
        b = (~torch.isfinite(x) | (x.abs() > bound)).reshape(x.shape[0], -1).any(1)
        flags = b if flags is None else flags | b
    if flags is None or not bool(flags.any()):
        return
    i = int(torch.nonzero(flags)[0])
    parts = []
    for name, x in series.items():
        row = x.detach().movedim(dim, 0)[i]
        n_nan, n_inf = int(torch.isnan(row).sum()), int(torch.isinf(row).sum())
        n_big = int((torch.isfinite(row) & (row.abs() > bound)).sum())
        if n_nan or n_inf or n_big:
            parts.append(f"{name}: " + ", ".join(f"{c} {k}" for c, k in ((n_nan, "NaN"), (n_inf, "inf"),
                                                                        (n_big, f"|x| > {bound:g}")) if c)
                         + f" of {row.numel()}")
    raise DivergenceError(f"{what} diverged at step {t0 + i} ({'; '.join(parts)})"
                          + (f"; {hint}" if hint else ""))
