"""Sweeps of separately stored units (grokspectra.sweep): executors agree, a killed sweep resumes where it
stopped, code versions follow the code, overrides never land under a profile's name, status counts units, and
damaged store entries are detected and recomputed."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from grokspectra import experiments as ex
from grokspectra import store as st
from grokspectra import sweep, version
from grokspectra.params import load_profile

REPO = Path(__file__).resolve().parents[1]
ex.load_chapters()
HEAD = ex.find("ch7.headline")
# a tiny headline: 4 seeds per arm → units of 3 + 1 seeds, 4 units; a few seconds in all
TINY = {**load_profile("ci", "ch7_lockin"), "M": 11, "K": 32, "seeds": 4, "epochs": 31, "band": 10,
        "windows": [5, 10], "window": 5, "gram_every": 10, "gram_dense": 0, "device": "cpu"}
ENV = {**os.environ, "GROKSPECTRA_THREADS": "1", "OMP_NUM_THREADS": "1", "GROKSPECTRA_PROGRESS": "0"}


def _same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


def test_units_cover_the_runs_in_order(tmp_path):
    units = HEAD.units(HEAD.params(TINY))
    assert [u["seeds"] for u in units] == [[0, 1, 2], [3], [0, 1, 2], [3]]
    assert [u["eta"] for u in units] == [TINY["eta"]] * 2 + [0.0] * 2
    r = HEAD.run(TINY, store=st.Store(tmp_path), show=False)
    assert r["test_acc"].shape == (8, 32) and list(r["seeds"]) == [0, 1, 2, 3] * 2
    assert r.meta["units"] == 4 and len(list(tmp_path.rglob("*.json"))) == 4


def test_local_cluster_gives_identical_arrays(tmp_path):
    """Bitwise, with the same torch thread count per unit (reductions split across threads round differently):
    the local cluster's workers have one thread each, so the in-process run here does too."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = HEAD.run(TINY, store=st.Store(tmp_path / "a"), show=False)
    finally:
        torch.set_num_threads(before)
    exe = sweep.make_executor(workers=2)
    try:
        b = HEAD.run(TINY, store=st.Store(tmp_path / "b"), executor=exe, show=False)
    finally:
        exe.close()
    _same(a.arrays, b.arrays)


def test_killed_sweep_resumes_and_matches(tmp_path):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as the command line below (GROKSPECTRA_THREADS=1)
    try:
        ref = HEAD.run(TINY, store=st.Store(tmp_path / "ref"), show=False)
    finally:
        torch.set_num_threads(before)
    store = tmp_path / "killed"
    args = [sys.executable, "-m", "grokspectra", "run", "ch7.headline", "--profile", "ci", "--store", str(store),
            "--device", "cpu", "-y", json.dumps({k: TINY[k] for k in ("M", "K", "seeds", "epochs", "band",
                                                                        "windows", "window", "gram_every",
                                                                        "gram_dense")})]
    proc = subprocess.Popen(args, env=ENV, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while not list(store.rglob("*.json")) and time.time() - t0 < 50:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = {p.name: p.stat().st_mtime_ns for p in store.rglob("*.json")}
    assert 1 <= len(done) < 4, "the kill should land part-way through the sweep"
    r = subprocess.run(args, env=ENV, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    after = {p.name: p.stat().st_mtime_ns for p in store.rglob("*.json")}
    assert len(after) == 4 and all(after[k] == v for k, v in done.items()), "stored units were recomputed"
    profile = HEAD.profile_for(TINY)
    got, n, total = HEAD.load(TINY, profile, st.Store(store))
    assert (n, total) == (4, 4)
    _same(ref.arrays, got.arrays)


def _module(tmp_path, name: str, body: str):
    import importlib.util

    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    spec = importlib.util.spec_from_file_location(f"grokspectra._{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


BASE = '''
SCALE = 2.0

def helper(x):
    """Doubles x."""
    return SCALE * x

def unrelated(x):
    return x - 1

def unit(u, device):
    """One unit."""
    return {"y": helper(u["x"])}
'''


def test_code_version_follows_code_not_text(tmp_path):
    docs = BASE.replace('"""Doubles x."""', '"""Multiplies x by two,\n    reworded."""').replace("return SCALE * x",
                                                                                        "return SCALE  *  x  # c")
    # modules of different names: compare the hashed texts, not the names
    a = version.dependencies([_module(tmp_path, "v2", BASE).unit])
    b = version.dependencies([_module(tmp_path, "v3", docs).unit])
    assert list(a.values()) == list(b.values()), "docstrings, comments and spacing changed the version"
    c = version.dependencies([_module(tmp_path, "v4", BASE.replace("SCALE = 2.0", "SCALE = 3.0")).unit])
    assert sorted(c.values()) != sorted(a.values()), "a changed constant kept the version"
    d = version.dependencies([_module(tmp_path, "v5", BASE.replace("return SCALE * x", "return SCALE * x + 0")).unit])
    assert sorted(d.values()) != sorted(a.values()), "a changed expression kept the version"
    e = version.dependencies([_module(tmp_path, "v6", BASE.replace("return x - 1", "return x - 2")).unit])
    assert sorted(e.values()) == sorted(a.values()), "an edit to a function the unit never calls changed it"


def test_real_experiment_version_ignores_its_docstring():
    deps = version.dependencies(HEAD.roots())
    assert "grokspectra.modadd.train" in deps and "grokspectra.experiments.ch7.runs_table" not in deps
    assert "Train R = len(seeds) runs" not in deps["grokspectra.modadd.train"]


def test_overrides_never_land_under_the_profile(tmp_path):
    ident = ex.find("ch6.identity")
    P = ident.schema.validate(load_profile("paper", "ch6_repulsion"))
    assert ident.profile_for(P) == "paper"
    P2 = {**P, "eta": 0.5}
    assert ident.profile_for(P2) == "paper+eta=0.5"
    r = ident.run(P2, store=st.Store(tmp_path), show=False)
    assert r.meta["profile"] == "paper+eta=0.5"
    assert not (tmp_path / "paper").exists() and (tmp_path / "paper+eta=0.5").is_dir()
    live = ident.run({**P, "profile": "ci"}, store=st.Store(tmp_path), show=False)
    assert ident.best(live, store=st.Store(tmp_path)) is live  # nothing of 'paper' proper is stored
    r = subprocess.run([sys.executable, "-m", "grokspectra", "run", "ch6.identity", "--profile", "ci", "--set",
                        "profile=paper", "--store", str(tmp_path)], env=ENV, cwd=REPO, capture_output=True, text=True)
    assert r.returncode != 0 and "cannot be overridden" in r.stderr and not (tmp_path / "paper").exists()


def test_status_reports_a_partial_sweep(tmp_path, monkeypatch):
    ci = {**TINY, "profile": "ci"}
    HEAD.run(ci, store=st.Store(tmp_path), show=False)
    name = HEAD.profile_for(ci)
    # drop one unit: the sweep is now 3/4 stored, and best() shows the live result, saying so
    victim = sorted((tmp_path / name / "ch7.headline").glob("*.json"))[0]
    victim.unlink()
    victim.with_suffix(".npz").unlink()
    _, n, total = HEAD.load(ci, name, st.Store(tmp_path))
    assert (n, total) == (3, 4)
    # a profile given as a YAML file named like the stored profile
    prof = tmp_path / f"{name}.yaml"
    prof.write_text(yaml.safe_dump({"ch7_lockin": {k: v for k, v in TINY.items() if k != "profile"}}))
    live = st.Result({}, {"profile": "other"})
    assert HEAD.best(live, store=st.Store(tmp_path), profile=str(prof)) is live
    assert "3 of 4 units" in live.meta["note"]
    r = subprocess.run([sys.executable, "-m", "grokspectra", "status", "--profile", str(prof), "--store",
                        str(tmp_path)], env=ENV, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("ch7.headline"))
    assert "3/4" in line and "partial" in line
    # a missing unit too large for this machine is counted apart, with its time, and not in the time left here
    s0 = ex.profile_status(HEAD, str(prof), st.Store(tmp_path))
    assert s0["too_big"] == 0 and s0["left_s"] > 0 and s0["memory"] == ""
    # the wall time the three stored units took, read from their own records, and the chapter's total
    walls = [json.loads(p.read_text())["wall_s"] for p in (tmp_path / name / "ch7.headline").glob("*.json")]
    assert len(walls) == 3 and s0["stored_s"] == pytest.approx(sum(walls)) and s0["stored_s"] > 0
    assert len(s0["threads"]) == 1 and s0["threads"][0] >= 1
    assert any(x.split()[:1] == ["ch7"] for x in r.stdout.splitlines())
    monkeypatch.setattr(HEAD, "_memory", lambda u: 1e18)
    s1 = ex.profile_status(HEAD, str(prof), st.Store(tmp_path))
    assert s1["too_big"] == 1 and s1["left_s"] == 0 and s1["too_big_s"] == pytest.approx(s0["left_s"])
    assert "GiB" in s1["memory"]


# --- damaged entries (a damaged entry is reported with its path and recomputed, never used) -----------------
def _entry(tmp_path):
    s = st.Store(tmp_path)
    calls = []

    def compute(p):
        calls.append(1)
        return {"x": np.arange(5.0) * p["n"]}

    st.load_or_compute("demo", {"n": 2}, compute, code="c", profile="ci", store=s)
    key = st.make_key("demo", {"n": 2}, "c")
    return s, compute, calls, tmp_path / "ci" / "demo" / key


def test_truncated_npz_is_reported_and_recomputed(tmp_path, capsys):
    s, compute, calls, base = _entry(tmp_path)
    data = base.with_suffix(".npz").read_bytes()
    base.with_suffix(".npz").write_bytes(data[: len(data) // 2])
    r = st.load_or_compute("demo", {"n": 2}, compute, code="c", profile="ci", store=s)
    assert len(calls) == 2 and np.array_equal(r["x"], np.arange(5.0) * 2)
    err = capsys.readouterr().err
    assert str(base.with_suffix(".npz")) in err and "damaged" in err
    assert s.load("demo", {"n": 2}, "c", "ci") is not None  # the rewrite is intact


def test_swapped_npz_is_detected(tmp_path, capsys):
    s, compute, calls, base = _entry(tmp_path)
    st.load_or_compute("demo", {"n": 3}, compute, code="c", profile="ci", store=s)
    other = tmp_path / "ci" / "demo" / (st.make_key("demo", {"n": 3}, "c") + ".npz")
    base.with_suffix(".npz").write_bytes(other.read_bytes())
    assert s.load("demo", {"n": 2}, "c", "ci") is None
    assert "do not match" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["{not json", "{}", "[]", '{"key": "abc", "sha256": "0"}'])
def test_broken_json_never_takes_best_down(tmp_path, text, capsys):
    s, compute, calls, base = _entry(tmp_path)
    (tmp_path / "ci" / "demo" / "deadbeefdeadbeef.json").write_text(text)
    base.with_suffix(".json").write_text(text)
    assert s.load("demo", {"n": 2}, "c", "ci") is None
    assert s.latest("demo", "ci") is None  # nothing intact: no crash, no result
    ident = ex.find("ch6.identity")
    P = ident.schema.validate({**load_profile("ci", "ch6_repulsion"), "device": "cpu"})
    live = ident.run(P, store=st.Store(tmp_path / "live"), show=False)
    bad = tmp_path / "paper" / "ch6.identity"
    bad.mkdir(parents=True)
    (bad / "0123456789abcdef.json").write_text(text)
    assert ident.best(live, store=st.Store(tmp_path)) is live


def test_unwritable_store_fails_before_computing(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    if os.access(ro, os.W_OK):  # root ignores permission bits: use a path under a regular file instead
        ro = tmp_path / "file"
        ro.write_text("")
    calls = []
    with pytest.raises(st.StoreError, match=str(ro)):
        st.load_or_compute("demo", {"n": 1}, lambda p: calls.append(1) or {"x": np.zeros(1)}, code="c",
                           profile="ci", store=st.Store(ro))
    assert not calls
    r = subprocess.run([sys.executable, "-m", "grokspectra", "run", "ch6.identity", "--profile", "ci", "--store",
                        str(ro)], env=ENV, cwd=REPO, capture_output=True, text=True)
    assert r.returncode != 0 and "not writable" in r.stderr and "Traceback" not in r.stderr


def test_leftover_tmp_files_are_cleaned(tmp_path):
    s, compute, calls, base = _entry(tmp_path)
    tmp = base.parent / ".x.npz.abc.tmp"
    tmp.write_bytes(b"half")
    old = time.time() - 3600
    os.utime(tmp, (old, old))
    fresh = base.parent / ".y.npz.abc.tmp"
    fresh.write_bytes(b"in progress elsewhere")
    assert s.clean_partial("ci", "demo") == 1 and not tmp.exists() and fresh.exists()


def test_zip_is_really_damaged_in_the_truncation_test(tmp_path):
    s, compute, calls, base = _entry(tmp_path)
    data = base.with_suffix(".npz").read_bytes()
    base.with_suffix(".npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(zipfile.BadZipFile):
        np.load(base.with_suffix(".npz"))["x"]


def test_scheduler_that_does_not_answer_is_a_clear_error():
    t0 = time.time()
    with pytest.raises(sweep.SweepError, match="127.0.0.1:9"):
        sweep.make_executor(scheduler="tcp://127.0.0.1:9", timeout_s=3)
    assert time.time() - t0 < 30


def test_two_processes_on_one_sweep_leave_intact_entries(tmp_path):
    """Two runs of the same sweep at once: at worst duplicated work, never a corrupt or missing entry."""
    args = [sys.executable, "-m", "grokspectra", "run", "ch7.headline", "--profile", "ci", "--store", str(tmp_path),
            "--device", "cpu", "-y", json.dumps({k: TINY[k] for k in ("M", "K", "seeds", "epochs", "band",
                                                                        "windows", "window", "gram_every",
                                                                        "gram_dense")})]
    procs = [subprocess.Popen(args, env=ENV, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for p in procs:
        assert p.wait() == 0, p.stderr.read()
    name = HEAD.profile_for(TINY)
    got, n, total = HEAD.load(TINY, name, st.Store(tmp_path))
    assert (n, total) == (4, 4) and got is not None
    assert not list(tmp_path.rglob("*.tmp"))


def test_chapters_are_found_without_a_list_and_import_no_other_chapter():
    import ast

    names = ex.chapter_names()
    assert names == sorted(names, key=lambda n: int(n[2:])) and {"ch1", "ch7"} <= set(names)
    assert {n.split(".")[0] for n in ex.REGISTRY} == set(names)  # every chapter registers experiments
    for n in names:
        tree = ast.parse((REPO / "src" / "grokspectra" / "experiments" / f"{n}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level >= 1:
                mods = [node.module or ""] + [a.name for a in node.names]
                assert not any(m.startswith("ch") and m[2:3].isdigit() for m in mods), f"{n} imports {mods}"


def test_code_version_does_not_depend_on_what_has_run():
    """Running an engine (which may set up caches) leaves the code version of its experiments unchanged: a worker
    that has not run anything yet computes the client's version."""
    import torch
    from grokspectra import experiments as ex
    from grokspectra import modadd
    exp = ex.find("ch7.headline")
    before = exp.code()
    modadd.gram_stats(torch.rand(1, 6, 5))
    modadd.train(5, 4, 10, "x2", [1e-3], [0], 2, gram_every=1, band=2, progress=False)
    assert exp.code() == before


def test_stored_units_are_timed_by_the_current_cost_model(tmp_path):
    """A stored unit's seconds are divided by its cost under today's model (from its parameters), not by the cost
    recorded with it, which may come from an older model or from none."""
    e = ex.find("ch4.sweep")
    u = min(e.units(e.params(e.schema.validate(load_profile("ci", e.section)))), key=e.cost_of)
    store = st.Store(tmp_path)
    store.save(e.name, u, e.code(), "ci", {"x": np.zeros(1)}, wall_s=2.0 * e.cost_of(u), extra={"cost": 1.0})
    rate, how = sweep.estimate_rate(e, store, time_probe=False)
    assert rate == pytest.approx(2.0) and "1 stored unit" in how


# the one experiment without a cost model: its work does not depend on its parameters (n = 40, K = 56 at any η), so
# its stored paper result times it
FIXED_SIZE = {"ch6.identity"}


def test_every_experiment_has_a_cost_model(tmp_path):
    """`run --dry-run` can estimate every experiment of every chapter: each unit of both profiles has a finite positive
    cost, the probe unit is a cheaper unit of the same kind, and with one stored timing per experiment (written here,
    nothing is computed) the CI profile's dry run without probes gives a number for each."""
    store = st.Store(tmp_path)
    for name, e in sorted(ex.REGISTRY.items()):
        ci = e.units(e.params(e.schema.validate(load_profile("ci", e.section))))
        paper = e.units(e.params(e.schema.validate(load_profile("paper", e.section))))
        if name in FIXED_SIZE:
            assert e._cost is None and len(ci) == len(paper) == 1, name
            store.save(name, paper[0], e.code(), "paper", {"x": np.zeros(1)}, wall_s=1.0)
            continue
        assert e._cost is not None, f"{name} has no cost model (cost= in its @experiment)"
        costs = [e.cost_of(u) for u in ci + paper]
        assert all(np.isfinite(c) and c > 0 for c in costs), (name, costs)
        cheapest = min(ci, key=e.cost_of)
        probe = e.probe_unit()
        assert sorted(probe) == sorted(cheapest) and e.cost_of(probe) <= e.cost_of(cheapest), name
        store.save(name, cheapest, e.code(), "timing", {"x": np.zeros(1)}, wall_s=1.0, extra={"cost": 1.0})
    r = subprocess.run([sys.executable, "-m", "grokspectra", "run", "all", "--profile", "ci", "--dry-run",
                        "--no-probe", "--store", str(tmp_path)], env=ENV, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    heads = {x.split(" [")[0]: x for x in r.stdout.splitlines() if not x.startswith(" ") and " [ci]" in x}
    assert sorted(heads) == sorted(ex.REGISTRY)
    for name, line in heads.items():
        assert "left ? (" not in line, line
        if len(ex.REGISTRY[name].units(ex.REGISTRY[name].params(load_profile("ci", ex.REGISTRY[name].section)))) == 1 \
                and name not in FIXED_SIZE:
            assert "left 1 s (" in line, line  # the stored unit is the CI unit itself: its 1 s, whatever was recorded
    assert "no estimate" not in r.stdout.splitlines()[-1]


def _stored_but_last_unit(e, sec: dict, tmp_path):
    """Run experiment ``e`` on the notebook section ``sec`` into a store at ``tmp_path``, delete its last unit, and
    write ``sec`` as a profile YAML named like the stored profile: (parameters, store, profile path)."""
    P = e.schema.validate({**sec, "profile": "ci"})
    store = st.Store(tmp_path)
    e.run(P, store=store, show=False)
    name = e.profile_for(P)
    last = st.make_key(e.name, e.units(e.params(P))[-1], e.code())
    for f in (tmp_path / name / e.name).glob(f"{last}.*"):
        f.unlink()
    prof = tmp_path / f"{name}.yaml"  # a profile given as a YAML file named like the stored profile
    prof.write_text(yaml.safe_dump({e.section: sec}))
    return P, store, prof


def test_best_falls_back_to_the_largest_computed_part(tmp_path):
    """ch4's sweep with its largest d not yet computed: best(prefix="d_list") shows the stored part (d ≤ 30 of
    [20, 30, 40]) under the profile's name, with a note naming the gap; without prefix the live result stays."""
    e = ex.find("ch4.sweep")
    sec = {"device": "cpu", "students": ["quad:1:0.1"], "link": "pr_clip", "clip": 6.0, "d_list": [20, 30, 40],
           "deltas": [3.0, 5.0], "seeds": 2, "T": 10, "threshold": 0.5, "n_test": 256, "spec_deltas": [1.0, 2.0],
           "spec_iters": 10, "init_d": 20, "init_deltas": [3.0], "init_T": 10, "seed": 0, "dtype": "float32"}
    P, store, prof = _stored_but_last_unit(e, sec, tmp_path)
    live = st.Result({}, {"profile": "other"})
    part = e.best(live, store=store, profile=str(prof), prefix="d_list")
    assert part is not live and list(part["d_list"]) == [20, 30] and part["cos_final"].shape == (1, 2, 2, 2)
    assert "d_list up to 30" in part.meta["note"] and "2 of 3 units" in part.meta["note"]
    assert e.best(live, store=store, profile=str(prof)) is live and "2 of 3 units" in live.meta["note"]


def test_best_partial_shows_the_stored_cells_of_a_grid(tmp_path):
    """ch3's δ_NN grid (one unit per cell) with one of its two cells computed: best(partial=True) assembles the
    stored cell (finite δ_NN, DMFT runs > 0) and leaves the other nan with zero runs, says "1 of 2 units" and
    records units_stored; without partial the live result stays."""
    e = ex.find("ch3.dnn")
    base = load_profile("ci", e.section)
    sec = {**{k: v for k, v in base.items() if k != "profile"}, "device": "cpu", "dnn_acts": ["quad"],
           "dnn_ms": [1], "dnn_links": ["pr_clip"], "dnn_scales": [1.0, 0.25], "dnn_times": [2], "dnn_N": 1000,
           "dnn_Nmax": 1000, "dnn_reps": 2, "dnn_rtol": 0.5, "dnn_lo": 2.0, "dnn_hi": 32.0}
    P, store, prof = _stored_but_last_unit(e, sec, tmp_path)
    live = st.Result({}, {"profile": "other"})
    part = e.best(live, store=store, profile=str(prof), partial=True)
    assert part is not live and part.meta["units_stored"] == [1, 2] and "1 of 2 units" in part.meta["note"]
    assert part["dmft_runs"].shape == (1, 1, 1, 2) and part["dmft_runs"][0, 0, 0, 0] > 0
    assert part["dmft_runs"][0, 0, 0, 1] == 0 and np.isnan(part["delta_nn"][0, 0, 0, 1]).all()
    assert np.isfinite(part["lo"][0, 0, 0, 0]).all()
    from grokspectra.experiments import ch3
    text = ch3.dnn_coverage_sentence(part, store)
    assert text.startswith("The table gives the compute time") and "breakdown" not in text
    gap = ch3.dnn_gap_sentence(part, store)
    assert "1 of the 2 cells at m = 1" in gap and "at the rate the computed cells ran" in gap and "Of these" not in gap  # it fits here
    assert [c["state"] for c in ch3.dnn_cells(part, store)] == ["computed", "to do"]
    table = ch3.dnn_coverage_table(part, store).splitlines()
    assert table[0] == "| student | pr_clip, s = 1 | pr_clip, s = 0.25 |" and len(table) == 3
    assert table[2].startswith("| quad,\u00a0m\u00a0=\u00a01 | **") and table[2].endswith(" min) |")
    arr = {k: np.array(v) for k, v in part.arrays.items()}
    arr["status"][0, 0, 0, 0] = ch3.BISECT_STATUS.index("DMFT breakdown")  # a cell stored as a breakdown
    bd = st.Result(arr, part.meta)
    assert ch3.dnn_coverage_sentence(bd, store).startswith("One of the computed cells is a DMFT breakdown. ")
    assert "| breakdown |" in ch3.dnn_coverage_table(bd, store)
    assert e.best(live, store=store, profile=str(prof)) is live and "1 of 2 units" in live.meta["note"]
    whole = e.run(P, store=store, show=False)
    assert ch3.dnn_coverage_sentence(whole) == "" == ch3.dnn_coverage_table(whole)  # the whole grid: nothing to say


def test_ch3_outliers_blocks_assemble_in_seed_order(tmp_path):
    """ch3.outliers in units (per student and δ: DMFT laws, and GD seeds in blocks of OUT_BLOCK): 5 seeds make two
    blocks (4 + 1) joined to [δ, 5, ...] in seed order, each block's seeds are distinct problems, the last |M_t|
    column is the median over all seeds, and a block recomputed alone gives the same numbers (deterministic)."""
    from grokspectra.experiments import ch3
    e = ex.find("ch3.outliers")
    base = load_profile("ci", e.section)
    P = e.schema.validate({**base, "device": "cpu", "out_d": 50, "out_N": 2000, "out_seeds": 5, "quad_t": 3,
                           "gelu_t": 2, "quad_deltas": [4.0], "gelu_deltas": [6.0, 8.0]})
    units = e.units(e.params(P))
    assert [u["kind"] for u in units] == ["dmft", "gd", "gd"] * 3 and units[2]["seeds"] == [4, 5]
    assert len({(u["data_seed"], u["init_seed"]) for u in units if u["kind"] == "gd"}) == 6
    O = e.run(P, store=st.Store(tmp_path), show=False)
    assert O["quad_gd"].shape == (1, 5, 4) and O["gelu_emp"].shape == (2, 5, 4) and O["gelu_cos"].shape == (2, 5)
    assert O["gelu_anti"].shape == (2, 4) and O["quad_M"].shape == (1, 4)
    assert np.isfinite(O["quad_gd"]).all() and np.isfinite(O["gelu_gd"]).all()
    assert len(np.unique(O["gelu_gd"][0, :, 0])) == 5  # five different problems
    alone = e.fn(units[5], "cpu")  # the gelu δ = 6 block of seeds 4..5
    assert np.array_equal(alone["gd"], O["gelu_gd"][0, 4:5])
    assert units[4]["kind"] == "gd" and units[4]["seeds"] == [0, 4]
    m_gd = np.concatenate([e.fn(units[4], "cpu")["M_gd"], alone["M_gd"]])
    assert np.isclose(O["gelu_M"][0, 3], np.median(m_gd))


def _write(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj))
    return path


def test_a_unit_interrupted_mid_way_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    """A ch3.dnn unit (one bisection per t) killed after 3 DMFT runs keeps those points in its checkpoint; restarted,
    it runs only the missing points and gives exactly the uninterrupted result; run_units removes the checkpoint
    once the unit is stored, and the stored wall time covers both attempts."""
    from grokspectra import dmft
    e = ex.find("ch3.dnn")
    base = load_profile("ci", e.section)
    P = e.schema.validate({**base, "device": "cpu", "dnn_acts": ["quad"], "dnn_ms": [1], "dnn_links": ["pr_clip"],
                           "dnn_scales": [1.0], "dnn_times": [2, 3], "dnn_N": 1000, "dnn_Nmax": 2000,
                           "dnn_reps": 2, "dnn_rtol": 0.3, "dnn_lo": 2.0, "dnn_hi": 32.0})
    unit = e.units(e.params(P))[0]
    whole = e.fn(dict(unit), "cpu")  # uninterrupted, no checkpoint
    real, calls = dmft.run_dmft, []

    def counting(*a, limit=None, **k):
        calls.append(1)
        if limit is not None and len(calls) > limit:
            raise KeyboardInterrupt("killed")
        return real(*a, **k)

    ck = tmp_path / "unit.json"
    monkeypatch.setattr(dmft, "run_dmft", lambda *a, **k: counting(*a, limit=3, **k))
    with pytest.raises(KeyboardInterrupt):
        sweep._compute(e.name, e.code(), unit, "cpu", None, str(ck))
    assert len(json.loads(ck.read_text())["entries"]) == 3 and sweep._CKPT is None
    calls.clear()
    monkeypatch.setattr(dmft, "run_dmft", lambda *a, **k: counting(*a, **k))
    again, wall, _ = sweep._compute(e.name, e.code(), unit, "cpu", None, str(ck))
    assert len(calls) == int(whole["dmft_runs"]) - 3 and int(again["dmft_runs"]) == int(whole["dmft_runs"])
    assert np.array_equal(again["cell"], whole["cell"], equal_nan=True)
    assert wall >= json.loads(ck.read_text())["spent_s"] > 0
    # through run_units: the leftover checkpoint of this unit is used, then removed
    store = st.Store(tmp_path / "store")
    path = sweep.checkpoint_path(store, "ci", e, unit)
    path.parent.mkdir(parents=True)
    path.write_text(ck.read_text())
    calls.clear()
    (r,) = sweep.run_units(e, [unit], profile="ci", store=store, device="cpu", show=False)
    assert len(calls) == 0 and np.array_equal(r["cell"], whole["cell"], equal_nan=True) and not path.exists()
    # a checkpoint written on another kind of device (a GPU's random streams differ) is set aside, not mixed in
    data = json.loads(ck.read_text())
    assert data["device"] == "cpu"
    ck.write_text(json.dumps({**data, "device": "cuda"}))
    calls.clear()
    third, _, _ = sweep._compute(e.name, e.code(), unit, "cpu", None, str(ck))
    assert len(calls) == int(whole["dmft_runs"]) and np.array_equal(third["cell"], whole["cell"], equal_nan=True)
    assert json.loads(ck.read_text())["device"] == "cpu"
    old = {k: v for k, v in data.items() if k != "device"}  # files written before devices were recorded: a CPU's
    assert sweep.Checkpoint(_write(tmp_path / "old.json", old)).entries == data["entries"]
    assert sweep.Checkpoint(tmp_path / "old.json", "cuda").discarded == len(data["entries"])


def test_keep_going_stores_every_unit_but_the_diverged_one(tmp_path, monkeypatch):
    """A unit that diverges: without keep_going the sweep stops there (units after it are not computed); with it
    every other unit is computed and stored and UnitsDiverged names the skipped unit. A rerun with the fault gone
    computes only that unit."""
    from grokspectra.device import DivergenceError

    real = HEAD.fn
    code = HEAD.code()

    def faulty(u, device):
        if u["seeds"] == [3] and u["eta"] > 0:
            raise DivergenceError("synthetic divergence at step 7")
        return real(u, device)

    faulty.__module__ = real.__module__  # the experiment finds its parameter schema through its function's module
    monkeypatch.setattr(HEAD, "fn", faulty)
    monkeypatch.setattr(HEAD, "code", lambda: code)  # the same code version as the real function
    with pytest.raises(DivergenceError) as e:
        HEAD.run(TINY, store=st.Store(tmp_path / "a"), show=False)
    assert not isinstance(e.value, sweep.UnitsDiverged) and "nothing was stored" in str(e.value)
    assert len(list((tmp_path / "a").rglob("*.json"))) == 1  # unit 0 only: the sweep stopped at unit 1
    with pytest.raises(sweep.UnitsDiverged) as e:
        HEAD.run(TINY, store=st.Store(tmp_path / "b"), show=False, keep_going=True)
    assert "1 of 4 units diverged" in str(e.value) and "unit 1" in str(e.value) and "step 7" in str(e.value)
    assert len(list((tmp_path / "b").rglob("*.json"))) == 3
    monkeypatch.setattr(HEAD, "fn", real)
    r = HEAD.run(TINY, store=st.Store(tmp_path / "b"), show=False)
    assert r.meta["units"] == 4 and len(list((tmp_path / "b").rglob("*.json"))) == 4


def test_on_diverged_stores_the_outcome_and_versions_it_by_the_handler(tmp_path, monkeypatch):
    """An experiment with an ``on_diverged`` handler: a diverged unit's outcome is stored (marked with the error)
    and the sweep goes on without keep_going; the outcome counts as current only while the handler's code version is
    unchanged; a handler that declines (None) leaves the divergence an error."""
    import torch
    from grokspectra.device import DivergenceError

    real, code = HEAD.fn, HEAD.code()

    def faulty(u, device):
        if u["seeds"] == [3] and u["eta"] > 0:
            raise DivergenceError("synthetic divergence at step 7")
        return real(u, device)

    faulty.__module__ = real.__module__
    monkeypatch.setattr(HEAD, "fn", faulty)
    monkeypatch.setattr(HEAD, "code", lambda: code)
    seen = []

    def outcome(u, err):
        seen.append(str(err))
        return {k: np.zeros_like(v) for k, v in real(u, torch.device("cpu")).items()}  # a recognisable outcome

    monkeypatch.setattr(HEAD, "_diverged", outcome)
    monkeypatch.setattr(HEAD, "_outcome_code", "handler-v1")
    store = st.Store(tmp_path)
    r = HEAD.run(TINY, store=store, show=False)  # no keep_going needed
    assert seen == ["synthetic divergence at step 7"] and r.meta["units"] == 4
    metas = [json.loads(p.read_text()) for p in tmp_path.rglob("*.json")]
    marked = [m for m in metas if "diverged" in m]
    assert len(metas) == 4 and len(marked) == 1
    assert marked[0]["outcome_code"] == "handler-v1" and "step 7" in marked[0]["diverged"]
    units, prof = HEAD.units(HEAD.params(TINY)), marked[0]["profile"]
    got = [HEAD.load_unit(store, u, prof) for u in units]
    assert [g is not None for g in got] == [True] * 4
    assert not np.any(got[1]["test_acc"]) and np.any(got[0]["test_acc"])  # unit 1 holds the handler's outcome
    assert "wall_s" in marked[0]
    rate_units = sweep.estimate_rate(HEAD, store, time_probe=False)
    assert np.isfinite(rate_units[0]) and "3 stored" in rate_units[1]  # the outcome is not timed
    # a changed handler: that unit (only) is missing again, and a rerun computes only it
    monkeypatch.setattr(HEAD, "_outcome_code", "handler-v2")
    assert [HEAD.load_unit(store, u, prof) is not None for u in units] == [True, False, True, True]
    HEAD.run(TINY, store=store, show=False)
    assert len(seen) == 2
    # a handler that declines: the divergence is an error again, and nothing of it is stored
    monkeypatch.setattr(HEAD, "_diverged", lambda u, err: None)
    monkeypatch.setattr(HEAD, "_outcome_code", "handler-v3")
    with pytest.raises(DivergenceError, match="step 7"):
        HEAD.run(TINY, store=store, show=False)


def test_dnn_outcome_of_a_diverged_dmft_is_a_breakdown_row_and_keeps_the_code_version():
    """ch3.dnn's handler: a cell whose DMFT diverges is recorded as "DMFT breakdown" at every t (no root, the
    bracket searched); registering it below the experiment leaves the units' code version that of the unit
    function alone."""
    from grokspectra.device import DivergenceError
    from grokspectra.experiments import ch3

    e = ex.find("ch3.dnn")
    u = e.units(e.params(load_profile("ci", ch3.SECTION)))[0]
    out = e.outcome(u, DivergenceError("DMFT diverged at step 60"))
    cell = out["arrays"]["cell"]
    assert cell.shape == (len(u["dnn_times"]), len(ch3.DNN_FIELDS))
    st_ = cell[:, ch3.DNN_FIELDS.index("status")]
    assert all(ch3.BISECT_STATUS[int(s)] == "DMFT breakdown" for s in st_)
    assert np.isnan(cell[:, 0]).all() and (cell[:, 1] == u["dnn_lo"]).all() and (cell[:, 2] == u["dnn_hi"]).all()
    assert out["extra"]["diverged"] == "DMFT diverged at step 60" and out["extra"]["outcome_code"] == e.outcome_code()
    assert e.code() == version.code_version([e.fn]) and e.outcome_code() != e.code()


def test_a_unit_that_kills_its_workers_is_a_clear_sweep_error(monkeypatch):
    """Dask gives up on a unit whose every worker died (KilledWorker; most often the worker's memory limit): the
    sweep stops with a SweepError naming the unit and the limit and saying what to do, not a Dask traceback."""
    import distributed

    class Fut:
        def result(self):
            import types

            raise distributed.KilledWorker("ch7.headline-1", types.SimpleNamespace(address="tcp://127.0.0.1:1"), 4)

    class Client:
        class scheduler:
            address = "tcp://127.0.0.1:0"

        def submit(self, *a, **k):
            return Fut()

        def scheduler_info(self):
            return {"workers": {"w0": {"memory_limit": 3 * 2 ** 30}, "w1": {"memory_limit": 2 * 2 ** 30}}}

    monkeypatch.setattr(distributed, "as_completed", lambda futs: list(futs))
    exe = sweep.DaskExecutor(Client())
    units = HEAD.units(HEAD.params(TINY))
    with pytest.raises(sweep.SweepError) as e:
        list(exe.map(HEAD, units[:1], "cpu", keep_going=True))
    msg = str(e.value)
    assert "unit 0" in msg and "2.0 GiB here" in msg and "--workers 1" in msg and "stored so far are kept" in msg


def test_a_unit_too_large_for_the_device_is_not_started(tmp_path, monkeypatch):
    """A memory model that puts one unit above the limit: that unit is not computed (no store entry, no
    checkpoint), every other unit is, and UnitsTooLarge names it with what it needs and what to do; a larger
    --max-memory then computes only it. Models are registered below the experiment: no code version changes."""
    code = HEAD.code()
    monkeypatch.setattr(HEAD, "_memory", lambda u: 5e9 if u["seeds"] == [3] and u["eta"] > 0 else 1e6)
    assert HEAD.code() == code
    store = st.Store(tmp_path)
    with pytest.raises(sweep.UnitsTooLarge) as e:
        HEAD.run(TINY, store=store, show=False, max_memory=2 ** 30)
    msg = str(e.value)
    assert "ch7.headline" in msg and "1 of 4 units were not started" in msg and "unit 1" in msg
    assert "5 GB" in msg and "--max-memory 1 GiB" in msg and "--device cuda" in msg
    assert len(list(tmp_path.rglob("*.json"))) == 3 and not list(tmp_path.rglob(".checkpoints/**/*.json"))
    r = HEAD.run(TINY, store=store, show=False, max_memory=8 * 2 ** 30)
    assert r.meta["units"] == 4 and len(list(tmp_path.rglob("*.json"))) == 4
    # the default limit is the device's memory: a model beyond any machine is refused without --max-memory
    monkeypatch.setattr(HEAD, "_memory", lambda u: 1e18)
    with pytest.raises(sweep.UnitsTooLarge, match="4 of 4 units"):
        HEAD.run(TINY, store=st.Store(tmp_path / "b"), show=False)


def test_device_memory_is_the_host_total_on_the_cpu():
    import torch
    from grokspectra.device import device_memory

    total, where = device_memory(torch.device("cpu"))
    phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 2 ** 28 < total <= phys and "GiB" in where
    lim, where2 = sweep.InProcess().memory_limit("cpu")
    assert lim == total and where2 == where


@pytest.mark.parametrize("N,T,m", [(4000, 40, 2), (2000, 40, 4), (20000, 30, 1)])
def test_dmft_bytes_bounds_the_measured_peak(N, T, m):
    """The DMFT memory model against the peak resident memory of an actual run in a fresh process: the kernel's
    high-water mark (VmHWM, reset just before the run through /proc/self/clear_refs) minus the resident memory at
    that moment. The model is an upper estimate: measured between 85 % and 105 % of it (repeated runs vary by
    about 2 %, page granularity and the allocator's own use; the path responses alone, N·m²·(T+1)(T+2)/2 float64, are
    93–96 % of the model here)."""
    from grokspectra.experiments import costs

    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak resident memory")
    code = textwrap.dedent(f"""
        import numpy as np, torch
        from grokspectra import dmft

        def status(key):
            return next(int(x.split()[1]) * 1024 for x in open("/proc/self/status") if x.startswith(key + ":"))

        torch.set_num_threads(1)
        dmft.run_dmft("quad", "pr_clip", 6.0, 0.1, 3, 200, {m}, keep=[3], generator=0)  # warm-up
        open("/proc/self/clear_refs", "w").write("5")  # reset VmHWM to the current resident memory
        base = status("VmRSS")
        dmft.run_dmft("quad", "pr_clip", 6.0, 0.1 * {m}, {T}, {N}, {m}, keep=[{T // 2}, {T}], Q0=np.eye({m}),
                      generator=0)
        print(status("VmHWM") - base)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300)
    assert out.returncode == 0, out.stderr
    measured, model = float(out.stdout.split()[-1]), costs.dmft_bytes(N, T, m)
    assert 0.85 * model <= measured <= 1.05 * model, (measured, model)


def test_dnn_memory_model_reaches_the_bisections_largest_path_count():
    """ch3.dnn's model: the paths double from dnn_N while they stay ≤ dnn_Nmax (as transitions.noisy_bisect does),
    so an m = 4 cell would reach 160 000 paths, whose path responses alone are 38.7 GB to t = 60 (χ(t, s) for
    s ≤ t: 61·62/2 blocks of N·m² float64), beyond a 24 GiB machine; with the paper profile's cap of 20 GiB a run
    its paths stop doubling at 80 000 (18.5 GiB), while m ≤ 2 keep dnn_Nmax (their unit dicts, hence their stored
    keys, unchanged by the cap)."""
    from grokspectra.experiments import ch3, costs

    assert ch3._bisect_max_paths(20000, 160000) == 160000 and ch3._bisect_max_paths(20000, 150000) == 80000
    assert ch3._bisect_max_paths(2000, 2000) == 2000
    e = ex.find("ch3.dnn")
    P = load_profile("paper", ch3.SECTION)
    assert P["dnn_run_gib"] == 20.0 and P["dnn_Nmax"] == 160000
    us = e.units(e.params(P))
    m4 = [u for u in us if u["m"] == 4]
    assert m4 and all(u["dnn_Nmax"] == 80000 and e.memory_of(u) == costs.dmft_bytes(80000, 60, 4) for u in m4)
    assert all(u["dnn_Nmax"] == 160000 for u in us if u["m"] <= 2)
    assert 20 * 2 ** 30 >= e.memory_of(m4[0]) > 18 * 2 ** 30
    # without the cap (a machine with more memory): 160 000 paths, 38.7 GB
    big = [u for u in e.units(e.params({**P, "dnn_run_gib": 64.0})) if u["m"] == 4]
    assert all(u["dnn_Nmax"] == 160000 and e.memory_of(u) == costs.dmft_bytes(160000, 60, 4) for u in big)
    assert 8 * 160000 * 16 * 61 * 62 / 2 / 1e9 == pytest.approx(38.7, abs=0.1) and e.memory_of(big[0]) > 38.7e9
    assert e.memory_of(big[0]) > 24 * 2 ** 30
    # a cap below even dnn_N's run leaves dnn_N, which the sweep's memory check then refuses
    assert ch3.dnn_nmax({**P, "dnn_run_gib": 0.5}, 4) == P["dnn_N"]
    # the chapter's sentence names the capped width, its paths and the memory of the uncapped run; none when no cap
    text = ch3.dnn_cap_sentence(e.params(P))
    assert "m = 4 up to 80 000 paths" in text and "37.0 GiB" in text and "20 GiB" in text and "m = 2" not in text
    assert ch3.dnn_cap_sentence(e.params({**P, "dnn_run_gib": 64.0})) == ""
    # the cap is one of the experiment's parameters (Experiment.unit_keys): required, and an override of it is
    # stored under its own profile name, never under paper
    V = e.schema.validate(P)
    assert e.profile_for(V) == "paper" and e.profile_for({**V, "dnn_run_gib": 64.0}) == "paper+dnn_run_gib=64.0"
    with pytest.raises(ex.ParamError, match="dnn_run_gib"):
        e.params({k: v for k, v in V.items() if k != "dnn_run_gib"})


def test_cli_reports_units_too_large_and_marks_them_in_the_dry_run(tmp_path):
    """From the command line: --max-memory below a unit's estimate marks it '!' in --dry-run, and a run then stops
    with one error line naming the units not started, exit status 2, having stored nothing of them."""
    env = {**ENV, "GROKSPECTRA_STORE": str(tmp_path)}
    cmd = [sys.executable, "-m", "grokspectra", "run", "ch3.limit", "--profile", "ci", "--max-memory", "0.001"]
    dry = subprocess.run(cmd + ["--dry-run", "--no-probe"], capture_output=True, text=True, env=env, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert "'!': more than --max-memory" in dry.stdout and "MB!" in dry.stdout
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 2
    err = run.stderr.strip().splitlines()[-1]
    assert err.startswith("error:") and "were not started" in err and "ch3.limit" in err
    assert not list(tmp_path.rglob("*.json"))
    bad = subprocess.run(cmd[:-1] + ["0"], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "--max-memory must be a positive" in bad.stderr


def test_dnn_gap_sentence_names_cells_too_large_for_this_device(tmp_path, monkeypatch):
    """The gap of a partial δ_NN grid: cells whose memory model exceeds the device's memory are named with their
    estimate and the way to compute them; the time left is the cost model times the rate of the stored cells."""
    from grokspectra.experiments import ch3

    e = ex.find("ch3.dnn")
    sec = {**{k: v for k, v in load_profile("ci", e.section).items() if k != "profile"}, "device": "cpu",
           "dnn_acts": ["quad"], "dnn_ms": [1], "dnn_links": ["pr_clip"], "dnn_scales": [1.0, 0.25],
           "dnn_times": [2], "dnn_N": 1000, "dnn_Nmax": 1000, "dnn_reps": 2, "dnn_rtol": 0.5, "dnn_lo": 2.0,
           "dnn_hi": 32.0}
    P, store, prof = _stored_but_last_unit(e, sec, tmp_path)
    part = e.best(st.Result({}, {"profile": "other"}), store=store, profile=str(prof), partial=True)
    monkeypatch.setattr(e, "_memory", lambda u: 3e15 if u["scale"] == 0.25 else 1e6)
    text = ch3.dnn_gap_sentence(part, store)
    assert "Of these, 1 (m = 1) need up to 3000000 GB each" in text
    assert ch3.dnn_coverage_table(part, store).splitlines()[2].endswith("| needs 3000000\u00a0GB |")
    assert "GiB of the device that built this page" in text and "--device cuda" in text
    rate, _ = sweep.estimate_rate(e, store, time_probe=False)
    missing = [u for u in e.units(part.meta["params"]) if u["scale"] == 0.25]
    hours = rate * e.cost_of(missing[0]) / 3600
    assert f"about {sweep.fmt_seconds(hours * 3600)} by the cost model, at the rate the computed cells ran" in text


def test_every_experiment_that_runs_the_dmft_has_a_memory_model():
    """The DMFT's path responses grow as N·m²·T²: every experiment whose units reach ``dmft.run_dmft`` (found on
    its call graph, as the code version finds it) registers a peak-memory model, so that no sweep of it can start a
    unit its device cannot hold; and each model gives a finite, positive estimate for a unit of the paper profile."""
    reach = [e for e in ex.REGISTRY.values() if any("run_dmft" in k for k in version.dependencies([e.fn]))]
    assert len(reach) >= 9
    assert [e.name for e in reach if e._memory is None] == []
    for e in reach:
        needs = [e.memory_of(u) for u in e.units(e.params(e.schema.validate(load_profile("paper", e.section))))]
        assert any(x is not None for x in needs) and all(x is None or 0 < x < 1e15 for x in needs), e.name


def test_the_rate_weighs_stored_units_by_their_cost(tmp_path):
    """Seconds per unit of cost = total seconds / total cost of the stored units: a large unit at 3 s per cost and
    a small one at 1 s per cost (a short unit, overhead-bound) give a rate near 3, not their median 2."""
    e = ex.find("ch4.sweep")
    us = sorted(e.units(e.params(e.schema.validate(load_profile("ci", e.section)))), key=e.cost_of)
    small, large = us[0], us[-1]
    assert e.cost_of(large) > 2 * e.cost_of(small)
    store = st.Store(tmp_path)
    store.save(e.name, small, e.code(), "ci", {"x": np.zeros(1)}, wall_s=1.0 * e.cost_of(small))
    store.save(e.name, large, e.code(), "ci", {"x": np.zeros(1)}, wall_s=3.0 * e.cost_of(large))
    rate, how = sweep.estimate_rate(e, store, time_probe=False)
    want = (e.cost_of(small) + 3 * e.cost_of(large)) / (e.cost_of(small) + e.cost_of(large))
    assert rate == pytest.approx(want) and "2 stored unit" in how and rate > 2


def test_each_unit_is_estimated_at_the_rate_of_stored_units_of_like_cost(tmp_path):
    """A cost model off by a factor that depends on the kind of unit (chapter 3's m = 4 cells ran at 2.3 times the
    rate of its narrower ones on one host): a missing unit is estimated at the rate of the stored units within a
    factor 2 of its cost, and at the rate of all of them where none is that close."""
    e = ex.find("ch4.sweep")
    small, mid, large = sorted(e.units(e.params(e.schema.validate(load_profile("ci", e.section)))), key=e.cost_of)
    c = {k: e.cost_of(u) for k, u in (("small", small), ("mid", mid), ("large", large))}
    assert c["mid"] > 2 * c["small"] and c["large"] > 2 * c["mid"]  # no two are alike
    store = st.Store(tmp_path)
    store.save(e.name, small, e.code(), "ci", {"x": np.zeros(1)}, wall_s=1.0 * c["small"])
    store.save(e.name, large, e.code(), "ci", {"x": np.zeros(1)}, wall_s=3.0 * c["large"])
    rate, _ = sweep.estimate_rate(e, store, time_probe=False)
    (s_small, s_large, s_mid), how = sweep.estimate_seconds(e, store, [small, large, mid], time_probe=False)
    assert s_small == pytest.approx(1.0 * c["small"]) and s_large == pytest.approx(3.0 * c["large"])
    assert s_mid == pytest.approx(rate * c["mid"]) and 1.0 < rate < 3.0
    assert "2 of 3 at the rate of the stored units of like cost" in how


def test_prune_removes_only_what_can_never_be_current(tmp_path):
    """``prune``: an entry made by other code and a checkpoint of no current unit are listed by --dry-run (nothing
    removed) and removed without it; the current entries, a current unit's checkpoint and every other file stay,
    and the result still loads whole."""
    ci = {**TINY, "profile": "ci"}
    store = st.Store(tmp_path)
    HEAD.run(ci, store=store, show=False)
    name = HEAD.profile_for(ci)
    prof = tmp_path / f"{name}.yaml"
    prof.write_text(yaml.safe_dump({"ch7_lockin": {k: v for k, v in TINY.items() if k != "profile"}}))
    units = HEAD.units(HEAD.params(ci))
    old = store.save(HEAD.name, units[0], "old-code", name, {"x": np.zeros(2)})
    ck_dir = tmp_path / name / ".checkpoints" / HEAD.name
    ck_dir.mkdir(parents=True)
    (ck_dir / "0123456789abcdef.json").write_text("{}")  # a checkpoint of no current unit
    live_ck = sweep.checkpoint_path(store, name, HEAD, units[1])
    live_ck.write_text("{}")
    want = sorted([tmp_path / name / HEAD.name / f"{old.meta['key']}.json",
                   tmp_path / name / HEAD.name / f"{old.meta['key']}.npz", ck_dir / "0123456789abcdef.json"])
    assert sorted(ex.stale_files(HEAD, str(prof), store)) == want
    cmd = [sys.executable, "-m", "grokspectra", "prune", "--profile", str(prof), "--store", str(tmp_path)]
    dry = subprocess.run(cmd + ["--dry-run"], env=ENV, cwd=REPO, capture_output=True, text=True)
    assert dry.returncode == 0 and "3 stale file(s)" in dry.stdout and all(p.exists() for p in want)
    run = subprocess.run(cmd, env=ENV, cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0 and not any(p.exists() for p in want) and live_ck.exists()
    _, n, total = HEAD.load(ci, name, store)
    assert (n, total) == (4, 4) and ex.stale_files(HEAD, str(prof), store) == []


@pytest.mark.parametrize("student,d,delta,R", [("gelu", 400, 48.0, 4), ("gelu", 400, 48.0, 2), ("quad", 600, 12.0, 4)])
def test_gd_hessian_bytes_bounds_the_measured_peak(student, d, delta, R):
    """ch3.outliers' GD units against their measured peak resident memory (VmHWM, reset after a tiny warm-up unit):
    the model is an upper estimate, within 80 % of the measurement (GeLU m = 2 at two block sizes, Quad m = 1)."""
    from grokspectra.experiments import ch3

    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak resident memory")
    u = {"student": student, "delta": delta, "t": 10, "out_d": d, "seed": 0, "kind": "gd", "seeds": [0, R],
         "data_seed": 1, "init_seed": 2}
    code = textwrap.dedent(f"""
        import torch
        from grokspectra.experiments import ch3

        def status(key):
            return next(int(x.split()[1]) * 1024 for x in open("/proc/self/status") if x.startswith(key + ":"))

        torch.set_num_threads(1)
        u = {u!r}
        ch3.outliers.fn({{**u, "out_d": 50, "delta": 4.0, "seeds": [0, 1]}}, torch.device("cpu"))  # warm-up
        open("/proc/self/clear_refs", "w").write("5")
        base = status("VmRSS")
        ch3.outliers.fn(u, torch.device("cpu"))
        print(status("VmHWM") - base)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300)
    assert out.returncode == 0, out.stderr
    measured, model = float(out.stdout.split()[-1]), ch3.outliers.memory_of(u)
    assert 0.8 * model <= measured <= 1.0 * model, (measured, model)


def test_dnn_breakdowns_flags_cells_that_break_down_only_with_the_new_code(tmp_path):
    """``scripts/dnn_breakdowns.py`` (move_ahead's check before chapter 3 moves to new code): a cell stored as "DMFT
    breakdown" in the new store where the old one bisected is named and fails the check; one that breaks down in both,
    or only in the old store, or exists in one store only, does not."""
    from grokspectra.experiments.ch3 import BISECT_STATUS

    brk, ok = BISECT_STATUS.index("DMFT breakdown"), BISECT_STATUS.index("bisected")

    def put(root, key, cell, status):
        d = root / "ch3.dnn"
        d.mkdir(parents=True, exist_ok=True)
        act, m, link, scale = cell
        (d / f"{key}.json").write_text(json.dumps({"params": {"act": act, "m": m, "link": link, "scale": scale}}))
        row = [np.nan] * 7 + [status]
        np.savez(d / f"{key}.npz", cell=np.array([row, row]))

    new, old = tmp_path / "new", tmp_path / "old"
    cells = [("quad", 1, "pr_clip", 1.0), ("quad", 1, "pr", 1.0), ("gelu", 2, "pr", 0.25), ("gelu", 4, "pr", 1.0)]
    for i, (c, s_new, s_old) in enumerate(zip(cells, (brk, brk, ok, ok), (ok, brk, brk, ok))):
        put(new, f"k{i}", c, s_new)
        put(old, f"k{i}", c, s_old)
    put(new, "only", ("quad", 4, "pr", 1.0), brk)
    script = Path(__file__).resolve().parents[1] / "scripts" / "dnn_breakdowns.py"
    out = subprocess.run([sys.executable, str(script), str(new), str(old)], capture_output=True, text=True, env=ENV)
    assert out.returncode == 1, out.stderr
    assert "act=quad, m=1, link=pr_clip, scale=1.0" in out.stdout and out.stdout.count("DMFT breakdown in") == 1
    assert "1 of 4 common cells" in out.stdout
    back = subprocess.run([sys.executable, str(script), str(old), str(new)], capture_output=True, text=True, env=ENV)
    assert back.returncode == 1 and "act=gelu, m=2, link=pr, scale=0.25" in back.stdout


def test_dnn_breakdowns_reports_how_far_the_roots_moved(tmp_path):
    """Beside the check, ``dnn_breakdowns.py`` prints z = Δ/√(u₁² + u₂²) for every (cell, t) with a root in both
    stores, u = √(half-bracket² + root_mc_se²): here Δ = 0.5 with u = 0.1 and 0.2 at t = 30 (z = 2.24, listed) and
    Δ = 0 at t = 60; a cell without a root in one store is left out and does not fail the check."""
    from grokspectra.experiments.ch3 import BISECT_STATUS

    def put(root, key, cell, rows):
        d = root / "ch3.dnn"
        d.mkdir(parents=True, exist_ok=True)
        act, m, link, scale = cell
        (d / f"{key}.json").write_text(json.dumps({"params": {"act": act, "m": m, "link": link, "scale": scale,
                                                              "dnn_times": [30, 60]}}))
        np.savez(d / f"{key}.npz", cell=np.array(rows, float))

    def row(v, half, se, status=0):  # delta_nn, lo, hi, noise_limited, root_mc_se, edge, edge_se, status
        return [v, v - half, v + half, float(status == 1), se, -0.1, 0.01, status]

    new, old = tmp_path / "new", tmp_path / "old"
    cells = [("quad", 1, "pr_clip", 1.0), ("gelu", 2, "pr", 0.25)]
    put(new, "a", cells[0], [row(8.0, 0.06, 0.08), row(9.0, 0.1, 0.1)])
    put(old, "a", cells[0], [row(7.5, 0.12, 0.16), row(9.0, 0.1, 0.1)])
    undecided = [np.nan, 3.0, 32.0, 1.0, np.inf, np.nan, np.nan, BISECT_STATUS.index("end undecided")]
    put(new, "b", cells[1], [row(20.0, 0.2, 0.2), row(21.0, 0.2, 0.2)])
    put(old, "b", cells[1], [undecided, undecided])
    script = Path(__file__).resolve().parents[1] / "scripts" / "dnn_breakdowns.py"
    out = subprocess.run([sys.executable, str(script), str(new), str(old)], capture_output=True, text=True, env=ENV)
    assert out.returncode == 0, out.stderr
    assert "2 (cell, t) with a root in both; rms z = 1.58; |z| > 2: 1, |z| > 3: 0" in out.stdout
    assert "z = +2.2: act=quad, m=1, link=pr_clip, scale=1.0, t=30: 8.00 ± 0.10 against 7.50 ± 0.20" in out.stdout


def test_compare_results_reports_each_arrays_largest_change_and_moved_nans(tmp_path):
    """``scripts/compare_results.py`` (printed by move_ahead before a move): units matched by their parameters, per
    array the largest change relative to the old array's largest entry, and the values finite in one store only."""
    def put(root, key, params, **arrays):
        d = root / "ch9.x"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{key}.json").write_text(json.dumps({"params": params}))
        np.savez(d / f"{key}.npz", **arrays)

    new, old = tmp_path / "new", tmp_path / "old"
    put(new, "a1", {"m": 1}, M=np.array([1.0, 2.0 + 1e-9]), cell=np.array([np.nan, 3.0]))
    put(old, "b1", {"m": 1}, M=np.array([1.0, 2.0]), cell=np.array([1.0, 3.0]))
    put(new, "a2", {"m": 2}, M=np.array([4.0, 4.0]), cell=np.array([1.0, 1.0]))  # not in the old store
    script = Path(__file__).resolve().parents[1] / "scripts" / "compare_results.py"
    out = subprocess.run([sys.executable, str(script), str(new), str(old)], capture_output=True, text=True, env=ENV)
    assert out.returncode == 0, out.stderr
    assert "ch9.x: 1 units in both (2 new, 1 old)" in out.stdout
    assert "M                largest relative change 5.0e-10" in out.stdout
    assert "cell             largest relative change 0.0e+00; 1 values finite in one store only" in out.stdout
