# syntax=docker/dockerfile:1
# One image for everything in deploy/k8s: `coordinator-svc` (serve, migrate, operator commands),
# `worker-agent`, the sample worker (`python -m examples.sample_worker`) and
# `coordinator-audit-export` (PySpark in local mode: Java and Debian's JDBC driver jars are in the
# image, at /usr/share/java/postgresql.jar and /usr/share/java/sqlite-jdbc.jar).
#   docker build -t connect-group-coordinator:0.1.0 .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: the project and its dependencies in a virtualenv -----------------------------------
FROM ${PYTHON_IMAGE} AS build
ARG PYSPARK_REQUIREMENT="pyspark>=4.0,<5"
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY connect_protocol ./connect_protocol
COPY coordinator_svc ./coordinator_svc
COPY worker_agent ./worker_agent
COPY audit_export ./audit_export
COPY examples ./examples
COPY generated ./generated
COPY migrations ./migrations
RUN /opt/venv/bin/pip install ".[coordinator]" "${PYSPARK_REQUIREMENT}"
# Fail the build, not the pod, if an entry point the manifests run is missing (from /, so that
# `python -m` finds the installed packages, not the sources in /src).
RUN cd / \
    && /opt/venv/bin/coordinator-svc serve --help >/dev/null \
    && /opt/venv/bin/worker-agent run --help >/dev/null \
    && /opt/venv/bin/python -m examples.sample_worker --help >/dev/null \
    && /opt/venv/bin/coordinator-audit-export --help >/dev/null

# --- runtime -------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
# Java for Spark, and the JDBC drivers the audit export reads the database with (Spark cannot
# download jars at run time). The man directory works around openjdk's install script on slim.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends \
        openjdk-17-jre-headless \
        libpostgresql-jdbc-java \
        libxerial-sqlite-jdbc-java \
        procps \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --home-dir /home/app --create-home \
        --shell /usr/sbin/nologin app
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SPARK_LOCAL_IP=127.0.0.1
WORKDIR /home/app
# Numeric, so that Kubernetes can verify runAsNonRoot.
USER 10001:10001
# gRPC, Prometheus metrics, the agent's status endpoint.
EXPOSE 9093 9100 8084
CMD ["coordinator-svc", "serve"]
