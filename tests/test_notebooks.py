"""Checks of the notebook sources: papermill can run them, their parameters are declared and validated, the
profiles fit the declared schemas, and the table of contents lists exactly the chapters."""

import ast
import importlib
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
