"""The intro's reproduction summary (report.summary_md): counts per chapter and per scale, and the disagreements."""

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
