"""The result store: expensive computations keyed by (experiment, parameters, code version), with provenance.

Layout: ``<root>/<profile>/<experiment>/<key>.npz`` (arrays) and ``<key>.json`` (metadata). The JSON file is
written last, atomically, so an entry exists exactly when its JSON exists; a crash mid-write leaves only a
temporary file, which is ignored and cleaned up. ``root`` defaults to ``results/`` in the repository (override
with ``$GROKSPECTRA_STORE``); ``results/paper`` is committed so the published book can show paper-scale results
computed on a GPU, every other profile is a local cache.

The key hashes the experiment name, the canonical JSON of the parameters and the *code version* (a hash of the
syntax trees of the functions the experiment runs, :mod:`grokspectra.version`). Changing that code changes the key,
so a result made by older code is never found as current; :func:`latest` still finds it and marks it ``stale``.

Each JSON record holds a SHA-256 of the arrays (names, dtypes, shapes and bytes), verified on every load. A
damaged entry (truncated ``.npz``, unreadable or foreign JSON, arrays of another key copied over) is reported on
stderr with its path and treated as absent, so it is recomputed by a run and skipped by :func:`latest`; it is
never used and never fatal.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
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


class StoreError(OSError):
    """The store cannot be written (message names the directory)."""


class DamagedEntry(ValueError):
    """A store entry that cannot be trusted (message names the file and what is wrong)."""


def arrays_hash(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 of named arrays: names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(f"{k}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def make_key(experiment: str, params: Mapping, code: str) -> str:
    blob = json.dumps({"experiment": experiment, "params": canonical(params), "code": code}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def git_commit() -> str:
    """Short commit of the repository, with ``+dirty`` when tracked source files differ from it. A copy of the
    working tree without its ``.git`` (a borrowed GPU machine) names the commit it was copied from in
    ``$GROKSPECTRA_COMMIT``; without either, "unknown"."""
    fallback = os.environ.get("GROKSPECTRA_COMMIT", "").strip() or "unknown"
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        if not sha:
            return fallback
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "src"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return fallback


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


def to_numpy(v: Any) -> np.ndarray:
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
        arrays = {k: to_numpy(v) for k, v in arrays.items()}
        dev = device_name(device) if isinstance(device, torch.device) else str(device)
        meta = {
            "experiment": experiment, "key": key, "profile": profile, "params": canonical(params), "code": code,
            "commit": git_commit(), "device": dev, "torch": torch.__version__,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "wall_s": float(wall_s),
            "arrays": sorted(arrays), "sha256": arrays_hash(arrays),
        }
        if extra:
            meta.update(canonical(dict(extra)))
        d = self._dir(profile, experiment)
        _atomic_write_bytes(d / f"{key}.npz", lambda f: np.savez_compressed(f, **arrays))
        _atomic_write_bytes(d / f"{key}.json", lambda f: f.write(json.dumps(meta, indent=1, sort_keys=True)), mode="w")
        return Result(arrays, meta)

    def _read(self, json_path: Path, key: str | None = None) -> Result:
        """Read and verify one entry; raise :class:`DamagedEntry` naming the file when it cannot be trusted."""
        npz = json_path.with_suffix(".npz")
        try:
            meta = json.loads(json_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise DamagedEntry(f"{json_path}: unreadable record ({err})") from None
        if not isinstance(meta, dict) or not isinstance(meta.get("key"), str) or "sha256" not in meta:
            raise DamagedEntry(f"{json_path}: not a result record (no key or no array hash)")
        if meta["key"] != json_path.stem or (key is not None and meta["key"] != key):
            raise DamagedEntry(f"{json_path}: record of key {meta['key']} stored under {json_path.stem}")
        if not npz.exists():
            raise DamagedEntry(f"{npz}: arrays missing")
        try:
            with np.load(npz, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as err:
            raise DamagedEntry(f"{npz}: unreadable arrays ({type(err).__name__}: {err})") from None
        if arrays_hash(arrays) != meta["sha256"]:
            raise DamagedEntry(f"{npz}: arrays do not match the hash in {json_path.name} (damaged or swapped)")
        return Result(arrays, meta)

    def _read_or_warn(self, json_path: Path, key: str | None = None) -> Result | None:
        try:
            return self._read(json_path, key)
        except DamagedEntry as err:
            print(f"warning: damaged result ignored (it will be recomputed): {err}", file=sys.stderr, flush=True)
            return None

    def load(self, experiment: str, params: Mapping, code: str, profile: str) -> Result | None:
        """The intact entry for exactly these parameters and this code, or ``None`` (a damaged one is reported)."""
        key = make_key(experiment, params, code)
        p = self._dir(profile, experiment) / f"{key}.json"
        return self._read_or_warn(p, key) if p.exists() else None

    def metas(self, experiment: str, profile: str | None = None) -> list[dict]:
        """The readable JSON records of ``experiment`` (in ``profile``, or every profile), unverified."""
        dirs = [self._dir(profile, experiment)] if profile else sorted(self.root.glob(f"*/{experiment}"))
        out = []
        for d in dirs:
            for p in sorted(d.glob("*.json")) if d.is_dir() else []:
                try:
                    m = json.loads(p.read_text())
                except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                    continue
                if isinstance(m, dict) and m.get("key") == p.stem:
                    out.append(m)
        return out

    def latest(self, experiment: str, profile: str, params: Mapping | None = None, code: str | None = None) -> Result | None:
        """The current entry if there is one; otherwise the newest intact entry of this experiment and profile,
        marked ``stale`` (it was made with other parameters or code). ``None`` when there is none."""
        if params is not None and code is not None:
            hit = self.load(experiment, params, code, profile)
            if hit is not None:
                return hit
        metas = sorted(self.metas(experiment, profile), key=lambda m: str(m.get("date", "")))
        for m in reversed(metas):
            r = self._read_or_warn(self._dir(profile, experiment) / f"{m['key']}.json")
            if r is not None:
                r.stale = True
                return r
        return None

    def check_writable(self, profile: str, experiment: str) -> None:
        """Raise :class:`StoreError` now, before any computation, when results could not be saved."""
        d = self._dir(profile, experiment)
        try:
            d.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=d, prefix=".write-check.", suffix=".tmp")
            os.close(fd)
            os.unlink(tmp)
        except OSError as err:
            raise StoreError(f"result store {d} is not writable ({err.strerror or err}); set --store or "
                             f"GROKSPECTRA_STORE to a writable directory") from None

    def clean_partial(self, profile: str | None = None, experiment: str | None = None, min_age_s: float = 60.0) -> int:
        """Remove temporary files left by interrupted writes (older than ``min_age_s``, so a write in progress in
        another process is left alone); return how many."""
        n = 0
        base = self.root / profile / experiment if profile and experiment else self.root
        now = time.time()
        for p in base.rglob(".*.tmp") if base.is_dir() else []:
            try:
                if now - p.stat().st_mtime < min_age_s:
                    continue
            except FileNotFoundError:
                continue
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
    store.check_writable(profile, experiment)
    t0 = time.perf_counter()
    arrays = compute(dict(params))
    wall = time.perf_counter() - t0
    return store.save(experiment, params, code, profile, arrays, device=device, wall_s=wall)
