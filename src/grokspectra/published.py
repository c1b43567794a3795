"""Numbers published by others, each with its source, used by the chapters' claims tables.

Every entry is a :class:`Published` value: the number (or tuple of numbers), what it is, and where it is published
(a paper with section/figure/table, or a public repository file at a commit, cited by its bibliography key).
Values that exist only in this project's own working notes are not published and do not belong here: chapters
compare those with the book's own theory (simulation against equation, both computed in the book).
Entries are grouped by chapter; each chapter's owner edits only its own block.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Published:
    value: Any
    what: str
    source: str  # e.g. "{cite}`xu2026repulsion`, Table 2" or "{cite}`xu2026code`, lockin.py"

    def __float__(self) -> float:
        return float(self.value)


# --- chapters 1-2 -------------------------------------------------------------------------------------------
CH1: dict[str, Published] = {}
CH2: dict[str, Published] = {}

# --- chapters 3-5 -------------------------------------------------------------------------------------------
CH3: dict[str, Published] = {}
CH4: dict[str, Published] = {}
CH5: dict[str, Published] = {}

# --- chapters 6-7 -------------------------------------------------------------------------------------------
# Xu's numbers are published in the arXiv paper (its abstract carries the headline ones) and, with every table, in
# the public repository skydancerosel/grokking-integrability, folder tian_eigengap/ ({cite}`xu2026code`); each
# source names the file and the commit it was read at (files under tian_eigengap/, paper/ for the note). Tian's critical-fraction constant is in his public code
# (github.com/yuandong-tian/understanding, ssl/real-dataset/cogo/modular_addition_simple2.py, option
# use_critical_ratio, at commit ac179609).
XU_ABSTRACT = "{cite}`xu2026repulsion`, abstract"
XU_FINDINGS = "{cite}`xu2026code` findings.md (1fbaa890)"
XU_NOTE = "{cite}`xu2026code` note_technical.tex (3269f599)"
XU_NOTE5 = "{cite}`xu2026code` note_technical.tex §5 (3269f599)"
XU_WINDOW = "{cite}`xu2026code` note_technical.tex §4 (3269f599)"
XU_PROJ = "{cite}`xu2026code` verify_proj_approx.py (e4c33570)"
TIAN_CODE = "{cite}`tian2025li2`, public code: modular_addition_simple2.py (ac179609)"

CH6: dict[str, Published] = {
    # Tian's Fig. 3 configuration as replicated by Xu (M = 71, K = 2048, n = 2016, x², eta = 2e-4 vs 0)
    "train_acc_1_seed0": Published(25, "epoch at which seed 0's training accuracy prints 1.000", XU_FINDINGS),
    "test05_seed0": Published(101, "epoch of test accuracy 0.5, seed 0", XU_FINDINGS),
    "test05_med15": Published((102, 99, 102), "epoch of test accuracy 0.5: median [IQR] over 15 seeds", XU_FINDINGS),
    "test99_seed0": Published(139, "epoch of test accuracy 0.99, seed 0", XU_FINDINGS),
    "ctrl_test": Published(0.03, "final test accuracy of the eta = 0 control (approximately)", XU_FINDINGS),
    "gf_peak_grok": Published((71.2, 57), "peak of ||G_F|| and its epoch, eta = 2e-4, seed 0", XU_FINDINGS),
    "gf_peak_ctrl": Published((63.6, 49), "peak of ||G_F|| and its epoch, eta = 0, seed 0", XU_FINDINGS),
    "ftf_max": Published((0.033, 0.028), "maximum off/diag ratio of F~'F~, grok / control, seed 0", XU_FINDINGS),
    "rho_fire_grok": Published((15, 15, 17, 17, 18), "rho_tian (code) >= 0.075: runs fired, runs, median epoch, "
                               "IQR", XU_FINDINGS),
    "rho_ctrl": Published((0, 15, 0.065), "rho_tian >= 0.075 in the control: runs fired, runs, max rho", XU_FINDINGS),
    # Theorem 6 sign-match (top 200 pairs), by checkpoint epoch
    "sm_seed0": Published({50: 0.83, 100: 0.91, 175: 0.975, 250: 0.975, 300: 0.995},
                          "sign-match of x² seed 0, Xu's pipeline", XU_FINDINGS),
    "sm_med5": Published({50: 0.865, 100: 0.895, 175: 0.955, 250: 0.970, 300: 0.985},
                         "sign-match of x², median over 5 seeds", XU_NOTE),
    "frac_Bneg_seed0": Published({50: 0.83, 100: 0.91, 175: 0.97, 250: 0.97, 300: 0.99},
                                 "frac(B < 0 | cos > 0), x² seed 0", XU_FINDINGS),
    "sim_seed0": Published({50: 0.20, 100: 0.22, 175: 0.40, 250: 0.59, 300: 0.64},
                           "median |cos| of the top-200 pairs, x² seed 0", XU_FINDINGS),
    "sm_relu": Published({100: 0.91, 300: 0.995, 500: 1.000}, "sign-match of ReLU seed 0", XU_NOTE),
    "exact_top10": Published((10, 10, 175), "exact leave-two-out projector: sign rule on the top 10 pairs (count, of, "
                             "epoch), seed 0", XU_PROJ),
    "relu_rho0": Published(0.075, "ReLU: rho_tian is above 0.075 already at epoch 0", XU_NOTE),
}

CH7: dict[str, Published] = {
    # headline: x², eta = 2e-4 vs eta = 0, 15 paired seeds, 400 epochs, W = 20
    "fire_grok": Published((15, 15, 174, 173, 174), "slope detector, grok arm: fired, runs, median epoch, IQR",
                           XU_NOTE),
    "fire_ctrl": Published((0, 15), "slope detector, eta = 0 control: fired, runs", XU_NOTE),
    "test05": Published((102, 99, 102), "epoch of test accuracy 0.5, grok arm: median [IQR]", XU_FINDINGS),
    "ctrl_test": Published(0.03, "final test accuracy of the controls (approximately); none reaches 0.99", XU_FINDINGS),
    "fire_minus_t99": Published(35, "slope fire minus epoch of test accuracy 0.99 (approximately)", XU_NOTE),
    "late_grok": Published(300, "late sigma2/sigma3 (epochs 200-400), median over grok seeds (approximately)",
                           XU_ABSTRACT),
    "late_ctrl": Published((1.31, 1.25, 1.37), "late sigma2/sigma3 of the controls: median and bracket", XU_NOTE),
    "late_ratio": Published(229, "late sigma2/sigma3 separation grok / control", XU_ABSTRACT),
    "rank_seed0_e200": Published((4.4e-3, 2.1e-5, 6.0e-4, 5.5e-4), "seed 0, epoch 200: sigma2, sigma3 (grok), "
                                 "sigma2, sigma3 (control)", XU_FINDINGS),
    # ReLU arm: 15 seeds, 800 epochs
    "relu_fire": Published((0, 15), "slope detector fires in ReLU runs with weight decay", XU_ABSTRACT),
    "relu_ratio": Published(1.4, "late sigma2/sigma3 separation for ReLU", XU_ABSTRACT),
    # window sweep: seeds 0-2, 400 epochs
    "window_ctrl_fp": Published({5: 3, 10: 3, 20: 0, 30: 0}, "control false positives out of 3 seeds, per window W",
                                XU_WINDOW),
    # rho_tian threshold 0.075 on the headline runs
    "rho_fire": Published((15, 15, 17, 17, 18), "rho >= 0.075, grok arm: fired, runs, median epoch, IQR", XU_FINDINGS),
    # eta sweep (5 eta x 5 seeds x 600 epochs) and the long run
    "eta_fit": Published((0.80, -75, 0.87), "t_rho = a t_test + b over grokking runs: a, b, R²", XU_FINDINGS),
    "eta_late": Published({1e-5: 1.8, 5e-5: 1949, 1e-4: 14.3, 2e-4: 6.8, 5e-4: 20.4},
                          "late sigma2/sigma3 (median over epochs 300-600, then over 5 seeds) per eta", XU_FINDINGS),
    "long_t_grok": Published(1527, "eta = 1e-5, 2000 epochs, one seed: grokking epoch", XU_NOTE5),
    "long_t_rho": Published(527, "eta = 1e-5 long run: epoch of rho >= 0.075", XU_NOTE5),
    "long_peak": Published(25, "eta = 1e-5 long run: peak sigma2/sigma3 (approximately)", XU_ABSTRACT),
    # M x p grid (eta = 2e-4, 5 seeds per cell): 1 = the cell groks (5/5), 0 = it does not (0/5)
    "grid_outcome": Published({41: (0, 0, 0, 1), 71: (0, 1, 1, 1), 127: (0, 1, 1, 0)},
                              "grok outcome per cell, p = 0.1, 0.2, 0.3, 0.5 (M = 127, p = 0.5 diverged)", XU_FINDINGS),
    "grid_rho_fire": Published((60, 60), "rho >= 0.075 fires in every grid run (fired, runs)", XU_FINDINGS),
    "p_crit_c": Published(2.7482, "Tian's fitted constant c of the critical fraction p_c = c ln M / M", TIAN_CODE),
}
