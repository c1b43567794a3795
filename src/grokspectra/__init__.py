"""grokspectra: the computational core of the book.

Layout (imports only go downwards):

* shared ground: :mod:`device`, :mod:`store`, :mod:`params`, :mod:`progress`, :mod:`plotting`
* modular-addition wing: :mod:`modadd` (engine), :mod:`repulsion` (Theorem 6), :mod:`lockin` (update Grams)
* multi-index wing: :mod:`multiindex` (GD engine), :mod:`hessian`, :mod:`dmft`, :mod:`spectral` (bulk/outlier)
* per-chapter experiments: :mod:`grokspectra.experiments`
* the command line: :mod:`grokspectra.cli` (``python -m grokspectra``)
"""

__version__ = "0.1.0"
