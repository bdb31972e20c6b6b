"""A Spark session for a local run (the console command and the tests): `local[2]`, modest
memory, the JDBC jars from Debian's packages, UTC, no web UI. Under `spark-submit` the cluster's
own session is used instead (`spark_submit.py`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from pyspark.sql import SparkSession

from .source import DEFAULT_JDBC_JARS

APP_NAME = "coordinator-audit-export"


class MissingJarError(FileNotFoundError):
    """A JDBC driver jar is not where the session expects it."""


def local_session(
    *,
    master: str = "local[2]",
    jars: Sequence[str] = DEFAULT_JDBC_JARS,
    driver_memory: str = "1g",
    shuffle_partitions: int = 4,
    app_name: str = APP_NAME,
) -> SparkSession:
    """Start (or join) a local Spark session that can read both databases over JDBC.

    Spark cannot download jars here: they must exist (`apt-get install libpostgresql-jdbc-java
    libxerial-sqlite-jdbc-java`, which `./scripts/test` does)."""
    missing = [jar for jar in jars if not os.path.isfile(jar)]
    if missing:
        raise MissingJarError(
            f"JDBC driver jar(s) not found: {', '.join(missing)}; install Debian's "
            "libpostgresql-jdbc-java and libxerial-sqlite-jdbc-java, or pass --jdbc-jars"
        )
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.jars", ",".join(jars))
        .config("spark.driver.memory", driver_memory)
        # A batch job: the throughput collector costs less CPU than the default G1 (measured:
        # about a second less per million events on two cores).
        .config("spark.driver.extraJavaOptions", "-XX:+UseParallelGC")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.scheduler.mode", "FAIR")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    return spark
