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
CH6: dict[str, Published] = {}
CH7: dict[str, Published] = {}
