"""Checks of the notebook sources: papermill can run them, their parameters are declared and validated, the
profiles fit the declared schemas, and the table of contents lists exactly the chapters."""

import ast
import importlib
import re
from pathlib import Path

import jupytext
import pytest
import yaml

from grokspectra.params import ParamError, load_profile

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.md"))
# words that mark unfinished work (spelled in pieces so this file does not contain them itself)
BANNED = ("TO" "DO", "FIX" "ME", "X" "XX", "place" "holder", "NotImplemented" "Error")


def _chapter(nb: Path):
    return importlib.import_module(f"grokspectra.experiments.{nb.stem.split('_')[0]}")


def _param_cell(nb: Path):
    cells = [c for c in jupytext.read(nb).cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"{nb.name}: {len(cells)} cells tagged parameters (papermill needs exactly 1)"
    return cells[0]


def _param_values(cell) -> dict:
    out = {}
    for node in ast.parse(cell.source).body:
        assert isinstance(node, ast.Assign) and len(node.targets) == 1, "the parameters cell may only assign names"
        out[node.targets[0].id] = ast.literal_eval(node.value)
    return out


def test_there_are_chapters():
    assert NOTEBOOKS, "no notebooks/*.md"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_header_and_parameters_cell(nb):
    notebook = jupytext.read(nb)
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    assert notebook.metadata["kernelspec"]["language"] == "python"
    values = _param_values(_param_cell(nb))
    assert {"profile", "device"} <= set(values)
    text = nb.read_text()
    assert "from_namespace(globals(), _before)" in text, "the notebook must validate its parameters"
    for word in BANNED:
        assert word not in text, f"{nb.name} contains {word!r}"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_schema_matches_parameters_cell_and_profiles(nb):
    mod = _chapter(nb)
    assert mod.SECTION == nb.stem
    values = _param_values(_param_cell(nb))
    assert set(values) == set(mod.SCHEMA.params), "parameters cell and SCHEMA declare different names"
    mod.SCHEMA.validate(values)  # defaults are valid
    ci = load_profile("ci", nb.stem)
    assert mod.SCHEMA.validate(ci)
    mod.SCHEMA.validate(load_profile("paper", nb.stem))
    # the notebook's defaults are the ci profile, so a plain `jupyter` run equals the CI run
    for k, v in ci.items():
        assert values[k] == v or (isinstance(v, float) and values[k] == pytest.approx(v)), \
            f"default of {k!r} ({values[k]!r}) differs from params/ci.yaml ({v!r})"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_papermill_sees_every_parameter(nb):
    """papermill's own inspection of the parameters cell (the one behind `papermill --help-notebook` and its
    "Passed unknown parameter" warning) skips a line with more than one '=' (e.g. a comment "y = z²"), so every
    parameter must be visible to it, with its comment as help."""
    from papermill.translators import PythonTranslator
    seen = {p.name: p for p in PythonTranslator.inspect(_param_cell(nb))}
    values = _param_values(_param_cell(nb))
    assert set(seen) == set(values), f"papermill cannot parse {sorted(set(values) - set(seen))}"
    assert all(p.help for p in seen.values()), "every parameter needs a comment (papermill shows it as help)"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_unknown_parameter_is_rejected(nb):
    mod = _chapter(nb)
    with pytest.raises(ParamError, match="no_such_param"):
        mod.SCHEMA.validate({**load_profile("ci", nb.stem), "no_such_param": 1})


# pages of the book that are plain MyST (no code), listed in the table of contents after the chapters
APPENDICES = ["book/appendix_theory"]


def test_toc_lists_exactly_the_notebooks():
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    listed = [c["file"] for c in toc.get("chapters") or []]
    chapters = [f for f in listed if f.startswith("book/generated/")]
    assert chapters == sorted(chapters), "chapters must be in reading order"
    assert sorted(Path(f).name for f in chapters) == [nb.stem for nb in NOTEBOOKS]
    assert listed == chapters + APPENDICES, "the appendices come after the chapters"
    assert toc["root"] == "book/generated/intro"


@pytest.mark.parametrize("page", APPENDICES)
def test_appendix_pages_exist_without_code(page):
    text = (REPO / f"{page}.md").read_text()
    assert text.startswith("# "), f"{page}.md must start with its title"
    assert "{code-cell}" not in text, f"{page}.md is a plain page; computations belong in the chapters"


def test_source_has_no_unfinished_marks():
    for path in list((REPO / "src").rglob("*.py")) + list((REPO / "tests").glob("*.py")):
        text = path.read_text()
        for word in BANNED:
            assert word not in text, f"{path.relative_to(REPO)} contains {word!r}"


# What a reader sees may rest only on the papers, public code at a commit (both in book/references.bib) and the
# book's own equations: never on the team's working notes, an issue of the tracker, or a file of this repository
# outside the book. READER_SOURCES lists the book sources that are clean; a chapter's notebooks/chN_*.md joins it
# once its text has been rewritten. CONTRIBUTOR_DOCS may name repository files, but not notes or issues either.
READER_SOURCES = ["book/intro.md", "book/appendix_theory.md", "notebooks/ch1_dmft.md", "notebooks/ch2_bulk.md",
                  "notebooks/ch3_outlier.md", "notebooks/ch4_phase_retrieval.md", "notebooks/ch5_grokking.md",
                  "notebooks/ch6_repulsion.md", "notebooks/ch7_lockin.md"]
CONTRIBUTOR_DOCS = ["README.md", "docs/CONVENTIONS.md", "docs/ENGINEERING_LOG.md"]
NOT_A_SOURCE = {
    "working notes": re.compile(r"\bbriefs?\b|seed summar|mw_theory|tian_xu|/work/|shared/(?:briefs|seeds)", re.I),
    "an issue number": re.compile(r"\bissues?\s*(?:no\.?\s*)?#?\s*\d+", re.I),
}
OUTSIDE_THE_BOOK = re.compile(r"(?<![\w.])(?:tests|src|docs|notebooks)/[\w./-]*|\b[\w-]+\.(?:py|md|tex|txt|json)\b")


# a file of a public repository is a source when its sentence names the repository's commit or cites its entry
PUBLIC_CODE = re.compile(r"\bcommit\b|\{cite[pt]?\}`[^`]*(?:xu2026code|tian2025code)", re.I)


def _offences(text: str, patterns: dict) -> list[str]:
    found = []
    lines = text.splitlines()
    for what, rx in patterns.items():
        for m in rx.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            near = "\n".join(lines[max(0, line - 3):line + 2])
            if rx is OUTSIDE_THE_BOOK and PUBLIC_CODE.search(near):
                continue
            found.append(f"line {line}: {what} ({m.group(0)!r})")
    return found


@pytest.mark.parametrize("path", READER_SOURCES)
def test_book_sources_cite_only_public_sources(path):
    text = (REPO / path).read_text()
    found = _offences(text, {**NOT_A_SOURCE, "a file outside the book": OUTSIDE_THE_BOOK})
    assert not found, f"{path} refers to what a reader cannot check: " + "; ".join(found)


@pytest.mark.parametrize("path", CONTRIBUTOR_DOCS)
def test_docs_cite_no_notes_or_issues(path):
    found = _offences((REPO / path).read_text(), NOT_A_SOURCE)
    assert not found, f"{path}: " + "; ".join(found)


def test_source_check_catches_what_it_should():
    bad = "as in " + "bri" + "ef §11 R4; see iss" + "ue 5 and tests/test_spectral.py; shared/" + "bri" + "efs/mw_" + "theory.md"
    found = _offences(bad, {**NOT_A_SOURCE, "a file outside the book": OUTSIDE_THE_BOOK})
    assert len(found) >= 4, found
    ok = "the appendix {eq}`app-bulk`; {cite}`xu2026code`, Table 2; `make run NB=ch6_repulsion`; params/ci.yaml"
    assert not _offences(ok, {**NOT_A_SOURCE, "a file outside the book": OUTSIDE_THE_BOOK})
