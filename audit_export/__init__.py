"""The audit export: a PySpark job over the coordinator's tables (DESIGN 2.2, 3.17; issue 4).

It reads every coordinator table over Spark JDBC (PostgreSQL, or the embedded SQLite default),
writes a full snapshot of the current state and the events added since the previous run as
Parquet partitioned by export date and group, computes audit findings in Spark (rebalances, lost
resources, per-connector task moves, violations), and writes them beside the data as Parquet, a
JSON summary and a static HTML report.

Modules: `source` (JDBC reading, the pinned snapshot), `snapshot` (the snapshot tables),
`snapshot_sql` (the derived tables as SQL, per dialect), `events` (event payloads),
`watermark` (incremental runs), `findings` (a package, a module per finding), `summary` (the
JSON summary, collected in Spark), `report` (JSON and HTML), `job` (one run), `session` (a local
Spark session), `cli` (`coordinator-audit-export`) and `spark_submit` (the file to hand
to `spark-submit`). The package depends on PySpark only, so it can be shipped to a cluster with
`--py-files`.
"""

from __future__ import annotations

from .job import ExportOptions, ExportResult, run_export

__all__ = ["ExportOptions", "ExportResult", "run_export"]
