"""The result store: expensive computations keyed by (experiment, parameters, code version), with provenance.

Layout: ``<root>/<profile>/<experiment>/<key>.npz`` (arrays) and ``<key>.json`` (metadata). The JSON file is
written last, atomically, so an entry exists exactly when its JSON exists; a crash mid-write leaves only a
temporary file, which is ignored and cleaned up. ``root`` defaults to ``results/`` in the repository (override
with ``$GROKSPECTRA_STORE``); ``results/paper`` is committed so the published book can show paper-scale results
computed on a GPU, every other profile is a local cache.

The key hashes the experiment name, the canonical JSON of the parameters and the *code version*: a hash of the
source files of the modules the experiment depends on. Editing any of them changes the key, so a result made by
older code is never found as current; :func:`latest` still finds it and marks it ``stale``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import importlib
import inspect
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch

from .device import device_name

REPO = Path(__file__).resolve().parents[2]


def default_root() -> Path:
    return Path(os.environ.get("GROKSPECTRA_STORE", REPO / "results"))


def canonical(obj: Any) -> Any:
    """Parameters as plain JSON types (tuples → lists, numpy scalars → python), for hashing and metadata."""
    if isinstance(obj, Mapping):
        return {str(k): canonical(v) for k, v in sorted(obj.items())}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def code_version(*modules: str) -> str:
    """Hash of the source of the named modules (e.g. ``"grokspectra.modadd"``): changes whenever their code does."""
    h = hashlib.sha256()
    for name in sorted(modules):
        mod = importlib.import_module(name)
        h.update(name.encode())
        h.update(inspect.getsource(mod).encode())
    return h.hexdigest()[:12]


def make_key(experiment: str, params: Mapping, code: str) -> str:
    blob = json.dumps({"experiment": experiment, "params": canonical(params), "code": code}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def git_commit() -> str:
    """Short commit of the repository, with ``+dirty`` when tracked source files differ from it."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        if not sha:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "src"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@dataclasses.dataclass
class Result:
    """A stored result: ``arrays`` (name → numpy array) and ``meta`` (provenance). ``stale`` is True when the
    entry was made with other parameters or other code than the ones asked for."""

    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]
    stale: bool = False

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def scalar(self, name: str) -> float:
        return float(np.asarray(self.arrays[name]).reshape(()))

    def provenance(self) -> str:
        """One line saying what this result is: profile, device, commit, date, wall time (and staleness)."""
        m = self.meta
        line = (f"profile **{m.get('profile', '?')}**, computed on {m.get('device', '?')}, commit "
                f"`{m.get('commit', '?')}`, {m.get('date', '?')[:10]}, wall time {m.get('wall_s', float('nan')):.1f} s")
        if self.stale:
            line = "STALE (code or parameters changed since): " + line
        if m.get("note"):
            line += f"; {m['note']}"
        return line


def _atomic_write_bytes(path: Path, write: Callable[[Any], None], mode: str = "wb") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _to_numpy(v: Any) -> np.ndarray:
    if isinstance(v, torch.Tensor):
        v = v.detach().cpu().numpy()
    return np.asarray(v)


class Store:
    """A directory of results. ``Store()`` uses :func:`default_root`."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_root()

    def _dir(self, profile: str, experiment: str) -> Path:
        return self.root / profile / experiment

    def save(self, experiment: str, params: Mapping, code: str, profile: str, arrays: Mapping[str, Any],
             *, device: torch.device | str = "cpu", wall_s: float = float("nan"), extra: Mapping | None = None) -> Result:
        """Write one entry atomically (arrays first, metadata last) and return it."""
        key = make_key(experiment, params, code)
        arrays = {k: _to_numpy(v) for k, v in arrays.items()}
        dev = device_name(device) if isinstance(device, torch.device) else str(device)
        meta = {
            "experiment": experiment, "key": key, "profile": profile, "params": canonical(params), "code": code,
            "commit": git_commit(), "device": dev, "torch": torch.__version__,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "wall_s": float(wall_s),
            "arrays": sorted(arrays),
        }
        if extra:
            meta.update(canonical(dict(extra)))
        d = self._dir(profile, experiment)
        _atomic_write_bytes(d / f"{key}.npz", lambda f: np.savez_compressed(f, **arrays))
        _atomic_write_bytes(d / f"{key}.json", lambda f: f.write(json.dumps(meta, indent=1, sort_keys=True)), mode="w")
        return Result(arrays, meta)

    def _read(self, json_path: Path) -> Result | None:
        npz = json_path.with_suffix(".npz")
        if not npz.exists():
            return None
        meta = json.loads(json_path.read_text())
        with np.load(npz, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        return Result(arrays, meta)

    def load(self, experiment: str, params: Mapping, code: str, profile: str) -> Result | None:
        """The entry for exactly these parameters and this code, or ``None``."""
        key = make_key(experiment, params, code)
        p = self._dir(profile, experiment) / f"{key}.json"
        return self._read(p) if p.exists() else None

    def latest(self, experiment: str, profile: str, params: Mapping | None = None, code: str | None = None) -> Result | None:
        """The current entry if there is one; otherwise the newest entry of this experiment and profile, marked
        ``stale`` (it was made with other parameters or code). ``None`` when there is no entry at all."""
        if params is not None and code is not None:
            hit = self.load(experiment, params, code, profile)
            if hit is not None:
                return hit
        d = self._dir(profile, experiment)
        if not d.is_dir():
            return None
        entries = sorted(d.glob("*.json"), key=lambda p: json.loads(p.read_text()).get("date", ""))
        for p in reversed(entries):
            r = self._read(p)
            if r is not None:
                r.stale = True
                return r
        return None

    def clean_partial(self) -> int:
        """Remove temporary files left by interrupted writes; return how many."""
        n = 0
        for p in self.root.rglob(".*.tmp"):
            p.unlink(missing_ok=True)
            n += 1
        return n


def load_or_compute(experiment: str, params: Mapping, compute: Callable[[dict], Mapping[str, Any]], *,
                    code: str, profile: str, device: torch.device | str = "cpu", store: Store | None = None,
                    force: bool = False) -> Result:
    """Return the stored result for (experiment, params, code) or compute, store and return it.

    ``compute(params)`` returns a mapping of array-likes (torch tensors are moved to the CPU). Its wall time,
    the device, the commit and the date are recorded. With ``force`` the entry is recomputed and replaced.
    """
    store = store or Store()
    if not force:
        hit = store.load(experiment, params, code, profile)
        if hit is not None:
            return hit
    t0 = time.perf_counter()
    arrays = compute(dict(params))
    wall = time.perf_counter() - t0
    return store.save(experiment, params, code, profile, arrays, device=device, wall_s=wall)
