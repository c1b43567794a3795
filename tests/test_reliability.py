"""Faults injected on purpose: diverged numerics, bad command lines and environment, concurrent and failed reruns.

Each test shows the clear message (one line, naming the input or the step), the exit status 2 for command lines,
and that nothing was written. Runs on the CPU in well under a minute.
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from grokspectra import cli, device as dv, dmft, hessian as hs, multiindex as mi, report, spectral as sp
from grokspectra.device import DivergenceError, SettingError
from grokspectra.params import ParamError, load_profile, parse_value

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def _files(root: Path) -> list[Path]:
    return sorted(p for p in Path(root).rglob("*") if p.is_file())


def _main(capsys, *argv):
    """Run the command line in-process: (exit status, stdout, stderr)."""
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# --- 1. diverged numerics are errors naming the step, and nothing is stored ----------------------------------------
def _first_bad(fn, T):
    """The step a diverging engine reports, checked to be the first bad one: with T = step − 1 it runs cleanly."""
    with pytest.raises(DivergenceError, match=r"diverged at step \d+") as e:
        fn(T)
    step = int(str(e.value).split("diverged at step ")[1].split()[0])
    assert 0 < step <= T
    fn(step - 1)  # no error: every earlier step is finite and bounded
    return step, str(e.value)


def test_gd_divergence_names_the_first_bad_step(monkeypatch):
    monkeypatch.setattr(mi, "CHECK_EVERY", 7)  # the reported step must not depend on the check cadence
    prob = mi.sample_problem(60, 180, 1, "pr", trials=2, generator=0)
    step, msg = _first_bad(lambda T: mi.run_gd(prob, 2, 100.0, T, M0=[[0.5, 0.3]], n_test=256, generator=1), 40)
    assert "η = 100" in msg and "reduce eta" in msg
    out = mi.run_gd(prob, 2, 2.0, 40, M0=[[0.5, 0.3]], n_test=256, generator=1)  # a sane step size is untouched
    assert torch.isfinite(out["train"]).all()


def test_gd_can_mark_diverged_trials_instead(monkeypatch):
    """Success-rate experiments (chapter 4) count a blown-up trial as a failure of GD: ``diverged="mark"``."""
    monkeypatch.setattr(mi, "CHECK_EVERY", 7)
    prob = mi.sample_problem(60, [60, 180], 1, "pr", trials=3, generator=0)
    with pytest.raises(DivergenceError) as e:
        mi.run_gd(prob, 2, 100.0, 30, M0=[[0.5, 0.3]], n_test=256, generator=1)
    out = mi.run_gd(prob, 2, 100.0, 30, M0=[[0.5, 0.3]], n_test=256, diverged="mark", generator=1)
    at = out["diverged_at"]
    assert at.shape == (2, 3) and at.dtype == torch.int64 and (at > 0).any()
    assert int(at[at >= 0].min()) == int(str(e.value).split("diverged at step ")[1].split()[0])
    for g, row in enumerate(at.tolist()):
        for r, s_bad in enumerate(row):
            tr = out["train"][g, r]
            assert torch.isfinite(tr[:s_bad if s_bad >= 0 else None]).all()
            assert s_bad < 0 or not (tr[s_bad].abs() <= 1e30 and out["Q"][g, r, s_bad].abs().max() <= 1e30)


def test_dmft_divergence_names_the_first_bad_step():
    step, msg = _first_bad(lambda T: dmft.run_dmft("gelu", "pr", 3.0, 100.0, T, 400, 2, antithetic=False,
                                                   generator=0), 14)
    assert "DMFT" in msg and "η = 100" in msg
    assert issubclass(dmft.DMFTError, DivergenceError) and issubclass(dmft.DMFTError, RuntimeError)


def test_diverging_experiment_stores_nothing(tmp_path, capsys):
    """The reported fault (``-p eta 100`` in chapter 1) through the command line into a temporary store."""
    rc, out, err = _main(capsys, "run", "ch1.easy_hard", "--profile", "ci", "--set", "eta=100", "--set", "N_eh=2000",
                         "--set", "T_eh=15", "--set", "seeds=2", "--device", "cpu", "--store", str(tmp_path))
    line = err.strip().splitlines()[-1]  # progress bars may precede it on stderr, a traceback may not
    assert rc == 2 and "Traceback" not in err and line.startswith("error: ")
    assert "diverged at step" in line and "η = 100" in line
    assert not [p for p in _files(tmp_path) if p.suffix in (".npz", ".json")]


def test_solvers_never_return_from_nan(monkeypatch):
    """A NaN in the bulk fixed point (injected into its map) is a ConvergenceError, not a silently accepted result."""
    G = torch.rand(200, 1, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) + 0.5
    good = sp.bulk_stieltjes(G, 2.0, [1.0 + 0.1j])
    assert torch.isfinite(good.real).all()
    real_map = sp._fixed_point_map

    def poisoned(G, w, delta, S, z, jacobian=False):
        F, J = real_map(G, w, delta, S, z, jacobian)
        return F * float("nan"), J

    monkeypatch.setattr(sp, "_fixed_point_map", poisoned)
    with pytest.raises(sp.ConvergenceError, match="did not converge"):
        sp.bulk_stieltjes(G, 2.0, [1.0 + 0.1j])
    assert issubclass(sp.ConvergenceError, DivergenceError)


def test_eigensolver_refuses_a_diverged_theta():
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(80, 20, generator=g), torch.randn(80, generator=g)
    Theta = torch.randn(20, 2, generator=g)
    Theta[3, 1] = float("inf")
    for method in ("dense", "lobpcg"):
        with pytest.raises(DivergenceError, match="non-finite"):
            hs.lowest_eigpairs(Theta, X, y, k=1, method=method)


def test_claims_never_score_non_finite_values():
    assert report.within(float("nan"), 1.0, 0.1) is None and report.within(float("inf"), 1.0, 1e9) is None
    for ours in ("nan", "inf", "-inf", "M = NaN", "Infinity"):
        row = report.Claim("c", "s", "1.0", ours, True)
        assert row.agree is None and row.mark() == "–" and "not finite" in row.note
    assert report.Claim("c", "s", "1.0", "0.99 (info)", True).agree is True


# --- 3. reruns never touch the book; concurrent reruns keep both; a failed rerun leaves nothing -----------------
FAKE_PAPERMILL = textwrap.dedent('''\
    #!{python}
    """Stands in for papermill: writes a notebook holding its parameters and the chapter summary, like a notebook."""
    import json, os, sys, time
    from grokspectra import report
    args = sys.argv[1:]
    pos, params, i = [], {{}}, 0
    while i < len(args):
        a = args[i]
        if a in ("-p", "-r"):
            params[args[i + 1]] = args[i + 2]; i += 3
        elif a in ("-k", "--cwd", "-f", "--execution-timeout"):
            i += 2
        elif a.startswith("-"):
            i += 1
        else:
            pos.append(a); i += 1
    time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
    report.save_summary("ch1_dmft", "fake", [report.Claim("c", "s", "1", str(params), True)])
    with open(pos[1], "w") as f:
        json.dump({{"params": params}}, f)
    if os.environ.get("FAKE_FAIL"):
        sys.exit("notebook cell failed")
''')


@pytest.fixture
def clone(tmp_path):
    """A scratch copy of the build files, with papermill and jupytext replaced by fast stand-ins."""
    root = tmp_path / "clone"
    (root / "notebooks").mkdir(parents=True)
    for f in ("Makefile", "requirements.txt", "constraints.txt", "pyproject.toml"):
        shutil.copy2(REPO / f, root / f)
    shutil.copy2(REPO / "notebooks" / "ch1_dmft.md", root / "notebooks" / "ch1_dmft.md")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "papermill").write_text(FAKE_PAPERMILL.format(python=sys.executable))
    (fake / "jupytext").write_text("#!/bin/sh\n# --quiet --to ipynb --output OUT IN\ncp \"$6\" \"$5\"\n")
    (fake / "python").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    for f in fake.iterdir():
        f.chmod(0o755)
    stamp = tmp_path / "venv" / ".installed"
    stamp.parent.mkdir()
    stamp.touch()
    return root, [f"BIN={fake}", f"VENV={stamp.parent}"]


def _make_run(root, extra, P, **env):
    e = dict(os.environ, GROKSPECTRA_THREADS="1", **env)
    e.pop("GROKSPECTRA_SUMMARY_DIR", None)
    return subprocess.Popen(["make", "-s", "--no-print-directory", "run", "NB=ch1_dmft", f"P={P}", *extra], cwd=root,
                            env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _last_path(root, out):
    return root / out.strip().splitlines()[-1].split(": ")[1]


def test_make_run_concurrent_reruns_keep_both_a_failed_one_leaves_nothing(clone):
    root, extra = clone
    procs = [_make_run(root, extra, P, FAKE_SLEEP="2") for P in ("-p eta 1e-3", "-p eta 2e-3")]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    paths = [_last_path(root, o) for o, _ in outs]
    assert paths[0] != paths[1] and all(p.parent.parent == root / "build" / "runs" for p in paths)
    for path, eta in zip(paths, ("1e-3", "2e-3")):
        assert json.loads(path.read_text())["params"] == {"eta": eta}
        assert eta in json.loads((path.parent / "ch1_dmft.json").read_text())["rows"][0]["ours"]
        assert "eta: 0.001" in (path.parent / "params.yaml").read_text() or eta != "1e-3"
    assert not (root / "build" / "summary").exists()  # the intro's input is untouched
    # the first rerun again, failing this time: its old notebook and summary must not pass for this run's result
    bad = _make_run(root, extra, "-p eta 1e-3", FAKE_FAIL="1")
    out, err = bad.communicate(timeout=120)
    assert bad.returncode != 0 and "FAILED" in out + err
    assert not paths[0].exists() and not (paths[0].parent / "ch1_dmft.json").exists()
    assert paths[1].exists()  # the other rerun's output is kept
    assert not list((root / "build" / "runs").glob(".partial-*")) and not (root / "build" / "summary").exists()


def test_make_run_rejects_bad_parameters_before_running(clone):
    root, extra = clone
    P = "-p eta abc" if torch.cuda.is_available() else "-p device cuda"
    p = _make_run(root, extra, P)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2 and "error: notebook ch1_dmft" in err, (P, out, err)
    assert not _files(root / "build")


def test_save_summary_follows_the_run_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("GROKSPECTRA_SUMMARY_DIR", str(tmp_path / "run"))
    path = report.save_summary("chX_test", "t", [report.Claim("c", "s", "1", "1", True)])
    assert path == tmp_path / "run" / "chX_test.json" and json.loads(path.read_text())["notebook"] == "chX_test"
    assert not (report.SUMMARY_DIR / "chX_test.json").exists()


# --- 5. one parser for -p values: papermill's own ----------------------------------------------------------------
def test_parse_value_is_papermills():
    from papermill.cli import _resolve_type

    for text in ["1e-3", "3", "-5", "1_000", "0x10", "2.", ".5", "inf", "nan", "True", "False", "None", "true",
                 "null", "[8,20]", "[8, 20]", "{a: 1}", "gelu", "", " 7 ", "1e400", "'x'", "2026-01-01"]:
        ours, theirs = parse_value(text), _resolve_type(text)
        assert type(ours) is type(theirs) and (ours == theirs or ours != ours), text
    assert cli._value("1e-3") == 0.001


def test_check_and_the_notebook_agree(capsys):
    rc, out, err = _main(capsys, "check", "ch1_dmft", "-p", "eta", "1e-3")
    assert rc == 0 and err == ""
    rc, out, err = _main(capsys, "check", "ch1_dmft", "-p", "ds", "[250,500]")  # papermill passes this as text
    assert rc == 2 and "'ds' = '[250,500]'" in _one_error_line(err) and "-y" in err
    rc, out, err = _main(capsys, "check", "ch1_dmft", "-y", "ds: [250, 500]", "--id")
    assert rc == 0 and len(out.strip()) == 10
    rc, out2, _ = _main(capsys, "check", "ch1_dmft", "-y", "ds: [250, 1000]", "--id")
    assert out2 != out


# --- 6. one line and exit status 2 for every bad input --------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda(capsys, tmp_path):
    rc, _, err = _main(capsys, "check", "ch1_dmft", "-p", "device", "cuda")
    assert rc == 2 and "CUDA is not available" in _one_error_line(err)
    rc, _, err = _main(capsys, "run", "ch1.easy_hard", "--profile", "ci", "--device", "cuda", "--store", str(tmp_path))
    assert rc == 2 and "CUDA is not available" in _one_error_line(err)
    assert not [p for p in _files(tmp_path) if p.suffix in (".npz", ".json")]


@pytest.mark.parametrize("value", ["abc", "-5", "0", "2.5"])
def test_bad_thread_setting(capsys, monkeypatch, value):
    monkeypatch.setenv("GROKSPECTRA_THREADS", value)
    rc, out, err = _main(capsys, "list")
    line = _one_error_line(err)
    assert rc == 2 and out == "" and "GROKSPECTRA_THREADS" in line and "positive integer" in line


def test_unset_thread_setting_is_fine(capsys, monkeypatch):
    n = torch.get_num_threads()
    monkeypatch.delenv("GROKSPECTRA_THREADS", raising=False)
    try:
        rc, out, err = _main(capsys, "list")
    finally:
        torch.set_num_threads(n)
    assert rc == 0 and "ch1.easy_hard" in out


@pytest.mark.parametrize("text, match", [
    ("ch1_dmft: 5\n", "section 'ch1_dmft' of .* must be a mapping"),
    ("ch1_dmft: [1, 2]\n", "must be a mapping"),
    ("ch1_dmft:\n  eta: [1,\n", "is not valid YAML .*line"),
    ("- just\n- a list\n", "must map notebook names"),
])
def test_malformed_profile(tmp_path, capsys, text, match):
    bad = tmp_path / "broken.yaml"
    bad.write_text(text)
    with pytest.raises(ParamError, match=match):
        load_profile(str(bad), "ch1_dmft")
    for argv in (["check", "ch1_dmft", "--profile", str(bad)], ["params", str(bad), "ch1_dmft"]):
        rc, out, err = _main(capsys, *argv)
        assert rc == 2 and out == "" and str(bad) in _one_error_line(err)


def test_pack_unknown_profile_and_tmp_files(tmp_path, capsys, monkeypatch):
    store = tmp_path / "results"
    entry = store / "paper" / "ch9.x"
    entry.mkdir(parents=True)
    np.savez(entry / "k.npz", a=np.arange(3))
    (entry / "k.json").write_text("{}")
    (entry / ".k.npz.abc123.tmp").write_text("half-written")
    monkeypatch.setenv("GROKSPECTRA_STORE", str(store))
    out = tmp_path / "out" / "nosuch.tar.gz"
    out.parent.mkdir()
    rc, _, err = _main(capsys, "pack", str(out), "--profile", "nosuch")
    assert rc == 2 and "'nosuch'" in _one_error_line(err) and "paper" in err
    assert list(out.parent.iterdir()) == []  # no archive, no temporary file
    good = tmp_path / "out" / "paper.tar.gz"
    rc, _, _ = _main(capsys, "pack", str(good), "--profile", "paper")
    with tarfile.open(good) as tar:
        names = tar.getnames()
    assert rc == 0 and "results/paper/ch9.x/k.npz" in names and not [n for n in names if n.endswith(".tmp")]
    assert sorted(p.name for p in out.parent.iterdir()) == ["paper.tar.gz"]


def test_exit_status_end_to_end():
    """The real entry point: one line on stderr and exit status 2."""
    env = dict(os.environ, GROKSPECTRA_THREADS="abc")
    r = subprocess.run([sys.executable, "-m", "grokspectra", "list"], capture_output=True, text=True, env=env,
                       cwd=REPO)
    assert r.returncode == 2 and r.stdout == "" and "GROKSPECTRA_THREADS" in _one_error_line(r.stderr)


def test_cpu_provenance_names_the_model(monkeypatch):
    """A CPU result's device names the processor model (its vector instructions pick the BLAS kernels, hence speed
    and roundoff), read from the kernel's cpuinfo; without one, the platform's name stands in."""
    import io

    info = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD  EPYC 9B14\nflags\t: fpu\n"
    monkeypatch.setattr(dv, "open", lambda *a, **k: io.StringIO(info), raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert dv.device_name(torch.device("cpu")) == f"cpu (AMD EPYC 9B14, {os.cpu_count()} cores, 1 torch thread)"

    def no_file(*a, **k):
        raise FileNotFoundError("/proc/cpuinfo")

    monkeypatch.setattr(dv, "open", no_file, raising=False)
    import platform
    monkeypatch.setattr(platform, "processor", lambda: "")
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    assert dv.cpu_model() == "arm64"


# --- 7. threads from the cores actually free -------------------------------------------------------------------
def test_threads_follow_the_free_cores(monkeypatch):
    n0 = torch.get_num_threads()
    monkeypatch.delenv("GROKSPECTRA_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(dv, "available_cores", lambda: 8)
    try:
        for load, want in ((0.0, 8), (1.1, 8), (3.4, 6), (8.6, 1), (30.0, 1)):
            monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
            assert dv.choose_threads(apply=False) == want
        monkeypatch.setenv("GROKSPECTRA_THREADS", "3")
        assert dv.choose_threads() == 3 and torch.get_num_threads() == 3
        torch.set_num_threads(1)  # a notebook's own choice after import is kept by get_device
        dv.get_device("cpu")
        assert torch.get_num_threads() == 1
        monkeypatch.setenv("GROKSPECTRA_THREADS", "x")
        with pytest.raises(SettingError, match="GROKSPECTRA_THREADS='x'"):
            dv.choose_threads()
        monkeypatch.setattr(dv, "_THREADS_SET", None)  # as after a failed choice at import
        with pytest.raises(SettingError, match="GROKSPECTRA_THREADS='x'"):
            dv.get_device("cpu")
    finally:
        torch.set_num_threads(n0)


@pytest.mark.parametrize("n", ["1", "2"])
def test_blas_threads_follow_torch_threads(n):
    """A fresh process with GROKSPECTRA_THREADS=n gives torch n threads and caps NumPy's and SciPy's BLAS at n too
    (left alone they take every core), with OpenBLAS's idle threads set to sleep at once."""
    code = ("import grokspectra.device, torch, os\n"
            "from threadpoolctl import threadpool_info\n"
            "b = sorted({d['num_threads'] for d in threadpool_info() if d['user_api'] == 'blas'})\n"
            "print(torch.get_num_threads(), b, os.environ['OPENBLAS_THREAD_TIMEOUT'])")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                             "OPENBLAS_THREAD_TIMEOUT")}
    r = subprocess.run([sys.executable, "-c", code], env={**env, "GROKSPECTRA_THREADS": n}, capture_output=True,
                       text=True, check=True)
    assert r.stdout.split() == [n, f"[{n}]", "4"]


def test_browser_check_survives_half_a_math_letter():
    """A JavaScript slice can cut a surrogate pair (𝜎 is two UTF-16 units); the browser check must still print
    and write JSON (it crashed on the first chapter table that began with such a letter)."""
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("browser_check", Path(__file__).with_name("browser_check.py"))
    bc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bc)
    half = "table: 𝜎"[:-1] + "\ud835"  # what json.loads gives for a lone high surrogate
    with pytest.raises(UnicodeEncodeError):
        half.encode("utf-8")
    fixed = bc._whole_chars({"wide": [half, "ok 𝜎"], "n": 3})
    assert fixed["wide"][0].encode("utf-8") and fixed["wide"][1] == "ok 𝜎" and fixed["n"] == 3
    json.dumps(fixed, ensure_ascii=False).encode("utf-8")


def test_browser_check_stitches_a_page_taller_than_one_capture(tmp_path, monkeypatch):
    """A page taller than one capture is screenshotted viewport by viewport and stitched: the image is as tall as
    the page, a band drawn at a known height lands there, and the sticky header appears only at the top (Chromium
    re-laid out a 22 000 px chapter at another width when captured whole)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("browser_check", Path(__file__).with_name("browser_check.py"))
    bc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bc)
    try:
        exe = bc.find_chromium()
    except bc.BrowserError:
        pytest.skip("no Chromium on this machine")
    from PIL import Image

    (tmp_path / "tall.html").write_text(
        "<html><body style='margin:0;background:#fff'>"
        "<div style='position:sticky;top:0;height:40px;background:#f00'></div>"
        "<div style='height:2960px'></div><div style='height:100px;background:#00f'></div>"
        "<div style='height:2000px'></div></body></html>")
    monkeypatch.setattr(bc, "ONE_SHOT", 1000)
    httpd, base = bc.serve(tmp_path)
    browser = bc.Chromium(exe)
    try:
        page = bc.Page(browser)
        page.viewport("1280")
        page.goto(f"{base}/tall.html")
        page.screenshot(tmp_path / "tall.jpg", 1280)
        assert page.js("window.scrollY") == 0  # left as it was found, for the checks that follow
    finally:
        browser.close()
        httpd.shutdown()
    im = Image.open(tmp_path / "tall.jpg").convert("RGB")
    assert im.size == (1280, 5100)
    red, blue = im.getpixel((640, 20)), im.getpixel((640, 3050))
    assert red[0] > 200 and red[2] < 60 and blue[2] > 200 and blue[0] < 60, (red, blue)
    for y in (920, 1820, 2720, 4520):  # the top of each later viewport: no repeated header
        assert min(im.getpixel((640, y))) > 200, (y, im.getpixel((640, y)))
