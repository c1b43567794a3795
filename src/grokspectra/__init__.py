"""grokspectra: the computational core of the book.

Layout (imports only go downwards):

* shared ground: :mod:`device`, :mod:`store`, :mod:`params`, :mod:`progress`, :mod:`plotting`
* modular-addition wing: :mod:`modadd` (engine), :mod:`repulsion` (Theorem 6), :mod:`lockin` (update Grams)
* multi-index wing: :mod:`multiindex` (GD engine), :mod:`hessian`, :mod:`dmft`, :mod:`spectral` (bulk/outlier)
* per-chapter experiments: :mod:`grokspectra.experiments`
* the command line: :mod:`grokspectra.cli` (``python -m grokspectra``)
"""

import os as _os

# OpenBLAS's idle worker threads spin for about 2^28 cycles before they sleep. When BLAS calls alternate with torch's
# own parallel regions (the Gram diagnostics call SciPy's syrk between torch products) the spinning threads take the
# cores torch needs: 0.20 s against 0.16 s per run-epoch measured with the Gram every epoch. 4 (2^4 cycles) lets
# them sleep at once. It must be set before SciPy loads its OpenBLAS; a value set by the user wins.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

__version__ = "0.1.0"
