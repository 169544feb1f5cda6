"""Benchmarks of trajflight, installed as ``trajflight.bench``; ``trajflight bench`` runs the comparison.

The side-by-side benchmark (``trajflight bench``, :mod:`trajflight.bench._cli`) measures trajflight's
public client against references in the same run: numpy memcpy (the floor), the raw shared-memory
ceiling (one segment written and mapped by two processes), a bare ``pyarrow.flight`` server (the
transport's ceiling), Ray's object store and TransferQueue (optional peers), each peer in its strongest
ordinary form (labelled) and the weaker per-group form beside it. The older
scripts (``bench_codec.py``, ``bench_flight_server.py``, ``bench_controller.py``) still run as
``python bench/bench_x.py``.

Benchmarks are not tests: timing never decides whether anything passes.
"""

from __future__ import annotations

__all__: list[str] = []
