# Shared set-up for scripts/test and scripts/run (sourced, not run): installs what is missing
# (Debian packages, PostgreSQL server binaries when NEED_POSTGRES=1, a .venv with the project and
# its dev dependencies) and leaves ROOT, VENV and the helpers banner/die/apt_install defined.
# Extra Debian packages the suite needs; installed only when `dpkg -s` says missing.
# More can be given at run time, space-separated, in EXTRA_APT_PACKAGES.
APT_PACKAGES=(
    prometheus  # promtool: tests/deploy/test_monitoring.py checks the alert rules with it
    # The audit export (audit_export/, tests/audit): PySpark runs on Java 17 and reads the
    # databases through these JDBC drivers (Spark cannot download jars here).
    openjdk-17-jre-headless
    libpostgresql-jdbc-java
    libxerial-sqlite-jdbc-java
    # Headless Chromium: tests/audit/test_report*.py and the benchmark screenshot the audit
    # report (tests/support/browser.py).
    chromium
    # The images (scripts/build-images, tests/packaging/test_images.py): a Debian base made with
    # debootstrap, built with buildah, run with podman on runc (crun refuses this machine's
    # hybrid cgroups), inspected with skopeo and umoci, pushed and pinned (--pin) to a registry
    # on 127.0.0.1 (docker-registry).
    debootstrap
    buildah
    podman
    runc
    skopeo
    umoci
    docker-registry
)
if [[ -n "${EXTRA_APT_PACKAGES:-}" ]]; then
    read -r -a _extra <<<"${EXTRA_APT_PACKAGES}"
    APT_PACKAGES+=("${_extra[@]}")
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
STAMP="$VENV/.pyproject.sha256"

banner() { printf '\n==> %s\n' "$*"; }
die() { printf '\n%s: ERROR: %s\n' "$(basename "$0")" "$*" >&2; exit 1; }

as_root() {
    if [[ "$(id -u)" -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        die "need root (or sudo) to run: $*"
    fi
}

APT_UPDATED=0
apt_install() {
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install manually: $*"
    export DEBIAN_FRONTEND=noninteractive
    if [[ "$APT_UPDATED" -eq 0 ]]; then
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        APT_UPDATED=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

# --- system packages -------------------------------------------------------
banner "system packages"
if [[ "${NEED_POSTGRES:-1}" == "1" ]]; then
shopt -s nullglob
pg_ctls=(/usr/lib/postgresql/*/bin/pg_ctl)
shopt -u nullglob
if [[ ${#pg_ctls[@]} -eq 0 ]]; then
    echo "PostgreSQL server binaries not found; installing postgresql"
    apt_install postgresql
    shopt -s nullglob
    pg_ctls=(/usr/lib/postgresql/*/bin/pg_ctl)
    shopt -u nullglob
    [[ ${#pg_ctls[@]} -gt 0 ]] || die "postgresql installed but no /usr/lib/postgresql/*/bin/pg_ctl"
fi
echo "PostgreSQL server: ${pg_ctls[-1]}"
fi

if [[ "${NEED_AUDIT_PACKAGES:-1}" != "1" ]]; then
    APT_PACKAGES=()  # Java and the JDBC jars are only for the audit export (Spark)
fi
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "installing missing Debian packages: ${missing[*]}"
    apt_install "${missing[@]}"
fi

# --- virtualenv ------------------------------------------------------------
banner "virtualenv (.venv)"
PYTHON=""
for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 \
        && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        PYTHON="$candidate"
        break
    fi
done
[[ -n "$PYTHON" ]] || die "need python3.11 or newer (python3.11 / python3 on PATH)"

if [[ -x "$VENV/bin/python" ]] && ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    echo "existing .venv is broken; recreating it"
    rm -rf "$VENV"
fi
if [[ ! -x "$VENV/bin/python" ]]; then
    if ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
        # Debian's own python3 ships venv/ensurepip separately.
        apt_install python3-venv
    fi
    echo "creating .venv with $("$PYTHON" --version) ($(command -v "$PYTHON"))"
    "$PYTHON" -m venv "$VENV"
    rm -f "$STAMP"
fi

# Which extras to install: the test command wants everything (dev); ./scripts/run only the
# coordinator's (the demo needs no Spark, no test tools).
EXTRAS="${EXTRAS:-dev}"
want_hash="$(cat pyproject.toml <(echo "extras=$EXTRAS") | sha256sum | cut -d' ' -f1)"
have_hash="$(cat "$STAMP" 2>/dev/null || true)"
if [[ "$want_hash" == "$have_hash" ]]; then
    echo "dependencies up to date (pyproject.toml sha256 ${want_hash:0:12}); skipping pip install"
else
    echo "installing the project (pip install -e '.[$EXTRAS]')"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -e ".[$EXTRAS]"
    printf '%s\n' "$want_hash" >"$STAMP"
fi

