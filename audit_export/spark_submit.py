"""The file to hand to `spark-submit` (the cluster's session, master and jars are spark-submit's):

    spark-submit --jars /usr/share/java/postgresql.jar,/usr/share/java/sqlite-jdbc.jar \
        audit_export/spark_submit.py --database-url postgresql://user@db/coordinator \
        --output s3a://bucket/coordinator-audit

On a cluster, ship the package too (`--py-files audit_export.zip`); run from a checkout, this
file finds the package beside it.
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from audit_export.cli import main_submit

if __name__ == "__main__":
    sys.exit(main_submit())
