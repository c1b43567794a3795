"""Every benchmark runs at its quick size and reports its time next to a floor measured in the same run (the
README's speed table quotes these ratios); a benchmark that cannot run says why in one line."""
import math
import subprocess
import sys

import pytest

from grokspectra import experiments as ex


def _benchmarks() -> dict:
    out = {}
    for ch in ex.load_chapters():
        out.update(getattr(ex.chapter(ch), "BENCHMARKS", {}))
    return out


BENCHMARKS = _benchmarks()


def test_the_benchmarks_of_the_readme_exist():
    assert {"gd", "dmft", "eig", "phase_retrieval_gd", "modadd", "xu", "lockin"} <= set(BENCHMARKS)


@pytest.mark.parametrize("name", sorted(n for n in BENCHMARKS if n != "xu"))  # xu needs Xu's script (not ours)
def test_benchmark_reports_its_floor(name):
    out = BENCHMARKS[name](device="cpu", quick=True)
    ratios = {k: v for k, v in out.items() if k.startswith("ratio_to_floor")}
    assert ratios, f"{name} reports no ratio to a floor: {sorted(out)}"
    for key, v in ratios.items():
        # a floor is plain torch work of the engine's sizes, the best of several repetitions: an engine several
        # times faster than it would mean the floor times something else than the engine's work
        assert math.isfinite(v) and v > 0.25, (key, v)
    assert any("floor" in k and k != "ratio_to_floor" and not k.startswith("ratio") for k in out)


def test_bench_xu_without_its_script_is_one_clear_error():
    r = subprocess.run([sys.executable, "-m", "grokspectra", "bench", "xu", "--quick"], capture_output=True, text=True)
    assert r.returncode != 0
    assert "needs --against PATH" in r.stderr and "Traceback" not in r.stderr


def test_bench_size_overrides_reach_the_benchmark_and_bad_ones_are_one_clear_error():
    """``bench dmft --size T=…`` times the DMFT at that horizon (the README quotes the ratio at the paper's T); a key
    the benchmark does not take, or a size that is not a positive integer, is refused before anything runs."""
    import json
    ok = subprocess.run([sys.executable, "-m", "grokspectra", "bench", "dmft", "--quick", "--device", "cpu",
                         "--size", "T=4", "--size", "m=1"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert (out["T"], out["m"], len(out["M_T"])) == (4, 1, 1)
    for bad, msg in [(["dmft", "--size", "X=3"], "KEY in ['T', 'N', 'm']"), (["gd", "--size", "T=3"], "KEY in none"),
                     (["dmft", "--size", "T=0"], "positive integer")]:
        r = subprocess.run([sys.executable, "-m", "grokspectra", "bench", *bad, "--quick"], capture_output=True,
                           text=True)
        assert r.returncode != 0 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr
