"""The file to hand to `spark-submit` (the cluster's session, master and jars are spark-submit's):

    spark-submit --master spark://spark-master:7077 --jars /usr/share/java/postgresql.jar \
        audit_export/spark_submit.py --database-url postgresql://user@db/coordinator \
        --output s3a://bucket/coordinator-audit

The driver imports the package from wherever this file is (a checkout, or an installed copy). The
executors run some of its Python too (the incremental findings fold each group's events on
them), so this file ships the package (and the `connect_protocol` modules it imports) to them
itself (`package_zip`, `addPyFile`). Executors need Spark, Java and a Python of the driver's
minor version, but not the package. They also need the
JDBC driver (`--jars` ships it), a route to the database (they read their partitions themselves)
and an output they share with the driver (README.md, "Audit export").
`tests/audit/test_local_cluster.py` runs this file on `local-cluster`.
"""

from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import audit_export
import connect_protocol
from audit_export.cli import build_parser, main_submit
from audit_export.session import APP_NAME

PACKAGE_ZIP = "audit-export-package.zip"
"""Not `audit_export.zip`: Spark refuses a second file of the same name, and a user may still
pass that one with `--py-files`."""


#: What the executors import: the package, and the standard-library modules of
#: `connect_protocol` it uses (`safe_text`, `env`; the rest is never imported there).
SHIPPED_PACKAGES = (audit_export, connect_protocol)


def package_zip(directory: str) -> str:
    """The packages the driver runs, zipped into `directory` for `SparkContext.addPyFile`."""
    path = os.path.join(directory, PACKAGE_ZIP)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for package in SHIPPED_PACKAGES:
            assert package.__file__ is not None
            root = Path(package.__file__).resolve().parent
            for file in sorted(root.rglob("*")):
                if file.is_file() and "__pycache__" not in file.parts:
                    zf.write(file, file.relative_to(root.parent).as_posix())
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Check the arguments (so `--help` starts no Spark), start the session, ship the package
    to the executors, then run `main_submit` in that session."""
    build_parser(local=False).parse_args(argv)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(APP_NAME).getOrCreate()
    with tempfile.TemporaryDirectory(prefix="audit-export-") as tmp:
        # Executors fetch the file from the driver while the job runs: keep it until the end.
        spark.sparkContext.addPyFile(package_zip(tmp))
        return main_submit(argv)


if __name__ == "__main__":
    sys.exit(main())
