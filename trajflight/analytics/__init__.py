"""trajflight.analytics: SQL and dataframes over live and archived trajectory groups.

* :func:`scan` reads the rows of a running data plane's groups (tokenless reads: no lease taken, no
  lease, token, generation or state changed) and/or of an archive (a Hive-partitioned Parquet dataset
  ``job_id=<job>/epoch=<n>/`` at a local path or any ``pyarrow.fs`` URI), pushing the projection down to
  the storage servers and to Parquet. The :class:`Scan` it returns gives a ``pyarrow.Table``, record
  batches, a DuckDB relation or a Polars ``LazyFrame``.
* Derived columns analysts always compute (:data:`DERIVED_COLUMNS`: ``prompt_length``,
  ``response_length``, ``tokens``, ``mean_logprob``, ``top_p_entropy``), made on request by the scan;
  :func:`add_derived` makes them on any table of trajectory rows.
* :func:`report` draws six figures (reward by policy version, response lengths and finish reasons by
  epoch, staleness, groups per state and throughput over time) into one static HTML page.
* ``trajflight sql SOURCE "SELECT ..."`` (DuckDB over a ``trajectories`` view), ``trajflight export
  SOURCE OUT.parquet`` and ``trajflight report SOURCE -o report.html`` are the command-line faces of the
  same scan.

pyarrow is all a scan needs; DuckDB and Polars are imported only by the calls that return them, and a
missing one raises :class:`~trajflight.errors.ConfigError` naming ``pip install 'trajflight[analytics]'``.
"""

from __future__ import annotations

from trajflight.analytics._derived import DERIVED_COLUMNS, add_derived
from trajflight.analytics._report import FIGURES, Figure, Report, report
from trajflight.analytics._scan import Scan, scan

__all__ = ["DERIVED_COLUMNS", "FIGURES", "Figure", "Report", "Scan", "add_derived", "report", "scan"]
