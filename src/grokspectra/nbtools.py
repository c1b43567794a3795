"""Small notebook post-processing used by the Makefile (``python -m grokspectra.nbtools hide-injected NB``)."""

from __future__ import annotations

import json
import os
import sys
import tempfile


def hide_injected(path: str) -> None:
    """Tag papermill's injected-parameters cell (and the parameters cell) ``hide-input``; rewrite atomically."""
    with open(path) as f:
        nb = json.load(f)
    for cell in nb["cells"]:
        tags = cell.setdefault("metadata", {}).setdefault("tags", [])
        if ("injected-parameters" in tags or "parameters" in tags) and "hide-input" not in tags:
            tags.append("hide-input")
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(nb, f, indent=1)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "hide-injected":
        raise SystemExit("usage: python -m grokspectra.nbtools hide-injected NOTEBOOK.ipynb")
    hide_injected(sys.argv[2])
