"""One plotting style for every figure of the book."""

from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np

COLORS = {"grok": "#c0392b", "control": "#2c3e50", "theory": "#000000", "x2": "#c0392b", "relu": "#2471a3",
          "gelu": "#1e8449", "quad": "#8e44ad", "accent": "#d68910"}
CYCLE = ["#c0392b", "#2471a3", "#1e8449", "#8e44ad", "#d68910", "#2c3e50", "#17a589"]


def style() -> None:
    """Apply the book's matplotlib style (call once per notebook)."""
    mpl.rcParams.update({
        "figure.dpi": 110, "savefig.dpi": 150, "figure.figsize": (6.4, 3.8), "font.size": 10,
        "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.25,
        "axes.prop_cycle": mpl.cycler(color=CYCLE), "legend.frameon": False, "lines.linewidth": 1.6,
        "figure.constrained_layout.use": True,
    })


def band(ax, x, runs, color, label=None, q=(25, 75), **kw):
    """Median line and inter-quantile band of ``runs`` (runs × len(x)), ignoring NaNs."""
    runs = np.asarray(runs, dtype=float)
    with np.errstate(all="ignore"):
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            med = np.nanmedian(runs, axis=0)
            lo, hi = np.nanpercentile(runs, q, axis=0)
    ax.plot(x, med, color=color, label=label, **kw)
    ax.fill_between(x, lo, hi, color=color, alpha=0.2, lw=0)
    return ax


def figure(nrows=1, ncols=1, **kw):
    return plt.subplots(nrows, ncols, **kw)
