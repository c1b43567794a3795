"""Progress bars: ``tqdm`` on an interactive terminal (or when ``GROKSPECTRA_PROGRESS=1``), silent otherwise."""

from __future__ import annotations

import os
import sys

from tqdm import tqdm  # the console bar: no notebook widgets (bars are off in notebooks unless asked for)


def enabled() -> bool:
    flag = os.environ.get("GROKSPECTRA_PROGRESS")
    if flag is not None:
        return flag not in ("0", "", "false", "no")
    return sys.stderr.isatty()


def bar(iterable=None, *, total: int | None = None, desc: str = "", **kw):
    """A progress bar over ``iterable`` (or a manual one with ``total``), disabled when not interactive."""
    disable = kw.pop("disable", False) or not enabled()
    kw.setdefault("leave", False)
    return tqdm(iterable, total=total, desc=desc, disable=disable, dynamic_ncols=True, **kw)
