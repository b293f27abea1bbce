"""numpy for hybrid memory search, its BLAS on one thread.

A search multiplies a few MB of vectors by one query vector: a thread pool gains nothing there,
and on a small, shared machine (the daemon's usual home) OpenBLAS's threads fighting the other
processes for the cores made a search two to three times slower (bench_search.py --hybrid,
20,000 entries: 50 ms against 20 ms). The BLAS reads its thread count once, when numpy loads;
the variables are put back afterwards, so the commands memobot runs inherit none of this.
"""

from __future__ import annotations

import os

_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_before = {name: os.environ.get(name) for name in _THREAD_VARIABLES}
for _name in _THREAD_VARIABLES:
    os.environ.setdefault(_name, "1")
try:
    import numpy as np
finally:
    for _name, _value in _before.items():
        if _value is None:
            os.environ.pop(_name, None)
        else:
            os.environ[_name] = _value

__all__ = ["np"]
