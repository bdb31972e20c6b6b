# syntax=docker/dockerfile:1
# One image per part, each a target of this file (README, "Installing"; deploy/k8s/README.md,
# "Building the images"):
#   coordinator  `coordinator-svc` (serve, migrate, operator commands): the server's libraries,
#                no Spark. The last stage, so a plain `docker build .` gives it.
#   agent        `worker-agent` and the sample worker (`python -m examples.sample_worker`): grpcio
#                and protobuf only, none of the server's libraries nor Spark.
#   audit        `coordinator-audit-export`: PySpark in local mode, Java 17 and Debian's JDBC
#                driver jars (/usr/share/java/postgresql.jar and sqlite-jdbc.jar).
# With a registry:
#   docker build --target coordinator -t connect-group-coordinator:0.1.0 .
#   docker build --target agent -t connect-group-coordinator-agent:0.1.0 .
#   docker build --target audit -t connect-group-coordinator-audit:0.1.0 .
# Without one (this repository's machines), `scripts/build-images` builds a Debian bookworm base
# with debootstrap and passes it as BASE, with the wheels it built as PIP_INSTALL_OPTIONS, so that
# nothing but the audit image's apt-get needs the network during the build.
#
# Python dependencies are pinned by deploy/images/requirements/*.txt (`scripts/build-images
# --lock` rewrites them from pyproject.toml); the project's own install checks that they satisfy
# its requirements.
ARG BASE=python:3.11-slim-bookworm

# --- build: one virtualenv per image ------------------------------------------------------------
FROM ${BASE} AS build
# Declared in every stage that writes files: buildah's layer cache does not key on --timestamp,
# so a layer built for another commit would carry that commit's file times into this one.
ARG SOURCE_DATE_EPOCH=0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1
COPY deploy/images/requirements/ /tmp/requirements/
RUN python3 -m venv /opt/venv

FROM scratch AS source
COPY pyproject.toml README.md /src/
COPY connect_protocol /src/connect_protocol
COPY coordinator_svc /src/coordinator_svc
COPY worker_agent /src/worker_agent
COPY audit_export /src/audit_export
COPY examples /src/examples
COPY generated /src/generated
COPY migrations /src/migrations

# Each venv: the pinned dependencies first (a layer kept while only the sources change), then the
# project with its extra, constrained to the same pins (so a dependency missing from the pins
# fails the offline build), then `pip check`, then pip itself goes: the images never install.
# PIP_INSTALL_OPTIONS empty: from the package index; "--no-index --find-links=/wheels" with a
# wheel directory mounted at /wheels (scripts/build-images). SOURCE_DATE_EPOCH (the script: the
# commit's time): deterministic .pyc files and wheel timestamps. (An ARG lasts one stage.)
FROM build AS venv-agent
ARG PIP_INSTALL_OPTIONS=""
ARG SOURCE_DATE_EPOCH=0
RUN /opt/venv/bin/pip install ${PIP_INSTALL_OPTIONS} --no-deps -r /tmp/requirements/agent.txt
COPY --from=source /src /src
RUN PIP_CONSTRAINT="/tmp/requirements/build.txt /tmp/requirements/agent.txt" \
        /opt/venv/bin/pip install ${PIP_INSTALL_OPTIONS} /src \
    && /opt/venv/bin/pip check \
    && /opt/venv/bin/pip uninstall --yes --quiet pip setuptools \
    && cd / && /opt/venv/bin/worker-agent run --help >/dev/null \
    && /opt/venv/bin/python -m examples.sample_worker --help >/dev/null

FROM build AS venv-coordinator
ARG PIP_INSTALL_OPTIONS=""
ARG SOURCE_DATE_EPOCH=0
RUN /opt/venv/bin/pip install ${PIP_INSTALL_OPTIONS} --no-deps -r /tmp/requirements/coordinator.txt
COPY --from=source /src /src
RUN PIP_CONSTRAINT="/tmp/requirements/build.txt /tmp/requirements/coordinator.txt" \
        /opt/venv/bin/pip install ${PIP_INSTALL_OPTIONS} "/src[coordinator]" \
    && /opt/venv/bin/pip check \
    && /opt/venv/bin/pip uninstall --yes --quiet pip setuptools \
    && cd / && /opt/venv/bin/coordinator-svc serve --help >/dev/null \
    && /opt/venv/bin/coordinator-svc migrate --help >/dev/null

FROM build AS venv-audit
ARG PIP_INSTALL_OPTIONS=""
ARG SOURCE_DATE_EPOCH=0
RUN /opt/venv/bin/pip install ${PIP_INSTALL_OPTIONS} --no-deps -r /tmp/requirements/audit.txt
COPY --from=source /src /src
RUN PIP_CONSTRAINT="/tmp/requirements/build.txt /tmp/requirements/audit.txt" \
        /opt/venv/bin/pip install ${PIP_INSTALL_OPTIONS} "/src[audit]" \
    && /opt/venv/bin/pip check \
    && /opt/venv/bin/pip uninstall --yes --quiet pip setuptools \
    && cd / && /opt/venv/bin/coordinator-audit-export --help >/dev/null

# --- runtime: what every image shares -----------------------------------------------------------
FROM ${BASE} AS runtime
ARG SOURCE_DATE_EPOCH=0
# The user, written directly (useradd would stamp today's date into /etc/shadow). Numeric in
# USER, so that Kubernetes can verify runAsNonRoot.
RUN echo 'app:x:10001:10001:app:/home/app:/usr/sbin/nologin' >>/etc/passwd \
    && echo 'app:x:10001:' >>/etc/group \
    && mkdir -p /home/app \
    && chown 10001:10001 /home/app
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /home/app

FROM runtime AS agent
COPY --from=venv-agent /opt/venv /opt/venv
USER 10001:10001
# The status endpoint (readiness, the worker's /watch).
EXPOSE 8084
CMD ["worker-agent", "run"]

FROM runtime AS audit
# Java for Spark, and the JDBC drivers the audit export reads the database with (Spark cannot
# download jars at run time). The man directory works around openjdk's install script on slim
# images, which leave out /usr/share/man.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        openjdk-17-jre-headless \
        libpostgresql-jdbc-java \
        libxerial-sqlite-jdbc-java \
        procps \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/log/apt /var/log/dpkg.log /var/cache/ldconfig/aux-cache
COPY --from=venv-audit /opt/venv /opt/venv
ENV SPARK_LOCAL_IP=127.0.0.1
USER 10001:10001
CMD ["coordinator-audit-export"]

FROM runtime AS coordinator
COPY --from=venv-coordinator /opt/venv /opt/venv
USER 10001:10001
# gRPC, Prometheus metrics.
EXPOSE 9093 9100
CMD ["coordinator-svc", "serve"]
