"""Small files and directories on the output's file system, through Hadoop's FileSystem API (the
one Spark writes with), so that an output on HDFS or an object store works like a local path.
"""

from __future__ import annotations

import os
from typing import Any

from pyspark.sql import SparkSession


def qualify(path: str) -> str:
    """A path with a scheme: local paths become absolute `file:` URIs."""
    if "://" in path or path.startswith("file:"):
        return path
    return "file://" + os.path.abspath(path)


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *[p.strip("/") for p in parts]])


class OutputFS:
    """Read, write, list and delete under the output path (any Hadoop-supported scheme)."""

    def __init__(self, spark: SparkSession) -> None:
        self._jvm: Any = spark.sparkContext._jvm
        self._conf: Any = spark.sparkContext._jsc.hadoopConfiguration()

    def _path(self, path: str) -> tuple[Any, Any]:
        jpath = self._jvm.org.apache.hadoop.fs.Path(path)
        fs = jpath.getFileSystem(self._conf)
        fs.setWriteChecksum(False)  # no .crc files beside the summary and watermarks
        return jpath, fs

    def exists(self, path: str) -> bool:
        jpath, fs = self._path(path)
        return bool(fs.exists(jpath))

    def delete(self, path: str) -> None:
        """Delete a file or a directory tree; nothing if absent."""
        jpath, fs = self._path(path)
        if fs.exists(jpath):
            fs.delete(jpath, True)

    def write_text(self, path: str, text: str) -> None:
        """Write a whole file: to a temporary name beside it, then renamed over it."""
        jpath, fs = self._path(path)
        tmp = self._jvm.org.apache.hadoop.fs.Path(path + ".tmp")
        stream = fs.create(tmp, True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()
        if fs.exists(jpath):
            fs.delete(jpath, False)
        if not fs.rename(tmp, jpath):
            raise OSError(f"could not rename {path}.tmp to {path}")

    def read_text(self, path: str) -> str:
        jpath, fs = self._path(path)
        stream = fs.open(jpath)
        try:
            data = self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
        finally:
            stream.close()
        return bytes(data).decode("utf-8")

    def list_names(self, path: str) -> list[str]:
        """Names of the entries directly under a directory; empty if it does not exist."""
        jpath, fs = self._path(path)
        if not fs.exists(jpath):
            return []
        return sorted(str(status.getPath().getName()) for status in fs.listStatus(jpath))

    def size(self, path: str) -> int:
        """Bytes under a file or directory tree; 0 if it does not exist."""
        jpath, fs = self._path(path)
        if not fs.exists(jpath):
            return 0
        return int(fs.getContentSummary(jpath).getLength())
