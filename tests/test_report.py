"""The intro's reproduction summary (report.summary_md): counts per chapter and per scale, and the disagreements."""

from grokspectra import report
from grokspectra.report import Claim, scale_group, summary_md


def _summary(title, rows):
    import dataclasses

    return {"notebook": "chX", "title": title, "provenance": "", "rows": [dataclasses.asdict(r) for r in rows]}


def test_scale_group_is_the_part_before_the_colon():
    assert scale_group("paper: 15 seeds") == "paper"
    assert scale_group("CI: 2 seeds") == "CI"
    assert scale_group("") == "not recorded"


def test_summary_counts_rows_per_scale_and_lists_disagreements():
    rows = [Claim("a", "s", "1", "1", True, scale="paper: 15 seeds"),
            Claim("b", "s", "1", "2", False, scale="paper: 15 seeds", note="outside 3σ"),
            Claim("c", "s", "1", "–", None, scale="CI: 2 seeds"),
            Claim("d", "s", "1", "1", True, scale="CI: 2 seeds")]
    md = summary_md([_summary("Chapter 9: test", rows)])
    assert "| Chapter 9: test | paper | 1 | 1 | 0 |" in md
    assert "| Chapter 9: test | CI | 1 | 0 | 1 |" in md
    assert "* Chapter 9: test: b (s): claimed 1, ours 2, judged at paper: 15 seeds. outside 3σ" in md


def test_summary_tolerates_old_and_empty_summaries():
    old = {"title": "Chapter 1", "rows": [{"claim": "a", "source": "s", "claimed": "1", "ours": "1", "agree": True}]}
    md = summary_md([old])
    assert "| Chapter 1 | not recorded | 1 | 0 | 0 |" in md and "No claim disagrees." in md
    assert summary_md([]) == "No chapter has been executed yet."


def test_scale_note_counts_units_and_names_the_commands(tmp_path):
    """section_status on an empty store: every ch6 experiment missing with 0 of its units; scale_md then lists each
    with its command, and says so in one sentence when everything is complete."""
    from grokspectra import experiments as ex
    from grokspectra import store as st

    rows = ex.section_status("ch6_repulsion", "paper", st.Store(tmp_path))
    assert rows and all(r["stored"] == 0 and r["state"] == "missing" and r["units"] >= 1 for r in rows)
    text = report.scale_md(rows)
    assert f"0 of {len(rows)} experiments" in text
    assert all(f"`python -m grokspectra run {r['experiment']} --profile paper`" in text for r in rows)
    assert text.count("\n| `ch6.") == len(rows)
    done = [{**r, "stored": r["units"], "state": "current", "left_s": 0.0} for r in rows]
    assert report.scale_md(done) == "Every result on this page is computed at the `paper` scale."  # no records
    timed = [{**r, "stored_s": 1800.0, "threads": [2]} for r in done]
    units = sum(r["units"] for r in rows)
    assert report.scale_md(timed) == ("Every result on this page is computed at the `paper` scale. Its "
                                      f"{units} units took {len(rows) * 30} min of computing on 2 CPU threads when they "
                                      "were run (a figure's provenance line names the device and date).")
    mixed = done[:-1] + [{**rows[-1], "stored": 1, "state": "partial", "left_s": 5400.0}]
    t = report.scale_md(mixed)
    assert "(complete)" in t and "90 min" in t and rows[-1]["experiment"] in t.split("Units are resumable")[1]
    # units that need more memory than this machine has are named, not folded into "0 s" left
    big = done[:-1] + [{**rows[-1], "stored": 1, "state": "partial", "left_s": 0.0, "too_big": 12,
                        "too_big_s": 18000.0, "memory": "this machine's 23.5 GiB of memory"}]
    row = report.scale_md(big).splitlines()[-1]
    assert row.endswith("| 5.0 h in 12 units that need more memory than this machine's 23.5 GiB of memory |"), row
    both = done[:-1] + [{**big[-1], "left_s": 600.0}]
    assert "| 10 min here; 5.0 h in 12 units" in report.scale_md(both)
