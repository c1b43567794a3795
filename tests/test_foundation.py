"""Tests of the shared ground: device selection, parameter schemas and profiles, the result store, the CLI."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from grokspectra import store as st
from grokspectra.device import get_device, get_dtype, seed_everything
from grokspectra.params import Param, ParamError, Schema, load_profile

REPO = Path(__file__).resolve().parents[1]


# --- device -------------------------------------------------------------------------------------------------
def test_device_auto_and_cpu():
    assert get_device("cpu").type == "cpu"
    assert get_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_request_without_cuda_is_a_clear_error():
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        get_device("cuda")


def test_bad_device_and_dtype():
    with pytest.raises(ValueError, match="unknown device"):
        get_device("tpu")
    with pytest.raises(ValueError, match="unknown dtype"):
        get_dtype("float16")
    assert get_dtype("float64") is torch.float64


def test_seeding_is_reproducible():
    seed_everything(3)
    a = torch.randn(5)
    seed_everything(3)
    assert torch.equal(a, torch.randn(5))


# --- parameters ---------------------------------------------------------------------------------------------
SCHEMA = Schema(Param("seeds", int, lo=1, hi=50), Param("eta", float, lo=0.0), Param("act", str, choices=("x2", "relu")),
                Param("etas", list, of=float, lo=0.0), Param("profile", str))


def test_schema_accepts_and_widens():
    p = SCHEMA.validate({"seeds": 3, "eta": 0, "act": "x2", "etas": [1, 2e-4], "profile": "ci"})
    assert p["eta"] == 0.0 and isinstance(p["eta"], float) and p["etas"] == [1.0, 2e-4]


@pytest.mark.parametrize("bad, match", [
    ({"no_such_param": 1}, "no_such_param"),
    ({"seeds": 0}, "seeds.*out of range"),
    ({"seeds": 2.5}, "seeds.*type float"),
    ({"act": "gelu"}, "act.*not allowed"),
    ({"etas": [1e-4, -1.0]}, r"etas\[1\].*out of range"),
    ({"seeds": True}, "seeds.*type bool"),
])
def test_schema_rejects_with_the_name(bad, match):
    good = {"seeds": 3, "eta": 0.1, "act": "x2", "etas": [1.0], "profile": "ci"}
    with pytest.raises(ParamError, match=match):
        SCHEMA.validate({**good, **bad})


def test_schema_from_namespace_catches_injected_unknowns():
    ns = {"np": np}
    before = set(ns)
    ns.update({"seeds": 2, "eta": 0.1, "act": "relu", "etas": [0.1], "profile": "ci", "typo_param": 5})
    with pytest.raises(ParamError, match="typo_param"):
        SCHEMA.from_namespace(ns, before)
    del ns["typo_param"]
    assert SCHEMA.from_namespace(ns, before)["act"] == "relu"


def test_missing_profile_and_section_are_clear():
    with pytest.raises(ParamError, match="unknown profile 'nope'"):
        load_profile("nope", "x")
    with pytest.raises(ParamError, match="does not exist"):
        load_profile("/tmp/definitely-missing.yaml", "x")
    with pytest.raises(ParamError, match="no section"):
        load_profile("ci", "no_such_notebook")


# --- store --------------------------------------------------------------------------------------------------
def test_store_hit_miss_and_provenance(tmp_path):
    s = st.Store(tmp_path)
    calls = []

    def compute(p):
        calls.append(p)
        return {"x": torch.arange(p["n"]), "y": np.ones(2) * p["n"]}

    r1 = st.load_or_compute("demo", {"n": 3}, compute, code="c1", profile="ci", store=s)
    r2 = st.load_or_compute("demo", {"n": 3}, compute, code="c1", profile="ci", store=s)
    assert len(calls) == 1 and np.array_equal(r2["x"], [0, 1, 2])
    for k in ("params", "commit", "device", "torch", "date", "wall_s", "code"):
        assert k in r2.meta
    st.load_or_compute("demo", {"n": 4}, compute, code="c1", profile="ci", store=s)  # changed parameters: miss
    st.load_or_compute("demo", {"n": 3}, compute, code="c2", profile="ci", store=s)  # changed code: miss
    assert len(calls) == 3
    assert r1.meta["key"] != st.make_key("demo", {"n": 3}, "c2")


def test_store_latest_marks_stale(tmp_path):
    s = st.Store(tmp_path)
    s.save("demo", {"n": 1}, "old", "paper", {"a": np.zeros(1)})
    assert s.latest("demo", "paper", {"n": 1}, "old").stale is False
    r = s.latest("demo", "paper", {"n": 1}, "new")
    assert r.stale and "STALE" in r.provenance()
    assert s.latest("demo", "ci") is None


def test_store_crash_leaves_no_entry(tmp_path):
    s = st.Store(tmp_path)

    class Boom:
        def __array__(self, *a, **k):
            raise KeyboardInterrupt("interrupted while writing")

    with pytest.raises(KeyboardInterrupt):
        s.save("demo", {"n": 1}, "c", "ci", {"a": np.zeros(3), "b": Boom()})
    assert s.load("demo", {"n": 1}, "c", "ci") is None
    assert not list(tmp_path.rglob("*.json")) and not list(tmp_path.rglob("*.tmp"))

    def failing(p):
        raise RuntimeError("solver diverged")

    with pytest.raises(RuntimeError):
        st.load_or_compute("demo", {"n": 2}, failing, code="c", profile="ci", store=s)
    assert not list(tmp_path.rglob("*.json"))


# --- command line -------------------------------------------------------------------------------------------
def _cli(*args):
    return subprocess.run([sys.executable, "-m", "grokspectra", *args], capture_output=True, text=True, cwd=REPO)


def test_cli_errors_are_clear():
    r = _cli("run", "no_such_experiment", "--profile", "ci")
    assert r.returncode != 0 and "unknown experiment" in r.stderr
    r = _cli("params", "nope", "x")
    assert r.returncode != 0 and "unknown profile" in r.stderr


def test_provenance_names_the_commit_of_a_copy_without_git(tmp_path, monkeypatch):
    """A working tree copied without its .git (a borrowed GPU machine) records $GROKSPECTRA_COMMIT as the commit
    of its results; without it, "unknown"; in the repository itself, git's own short commit."""
    from grokspectra import store as st

    real = st.git_commit()
    assert real != "unknown" and real.split("+")[0].isalnum()
    monkeypatch.setattr(st, "REPO", tmp_path)  # not a git checkout
    monkeypatch.delenv("GROKSPECTRA_COMMIT", raising=False)
    assert st.git_commit() == "unknown"
    monkeypatch.setenv("GROKSPECTRA_COMMIT", "1277730dcc")
    assert st.git_commit() == "1277730dcc"
