#!/usr/bin/env bash
# Install everything the test suite needs and run it (developers and CI alike).
#   bash tests/run.sh [pytest args...]
# Works on a fresh Debian 12 as root: installs python3-venv when missing, builds .venv, installs
# the package with its test extras, then runs pytest. pytest's exit code 5 ("no tests
# collected", e.g. a -k that matches nothing) is reported and treated as success.
# Then, whatever pytest's outcome, the docker smoke (docker/smoke.sh, README "Docker": the test
# cluster and the daemon in a container, about 3 minutes); the run fails if either fails.
# SHOCKSLURM_SKIP_DOCKER=1 skips the smoke on a developer's machine; with
# SHOCKSLURM_REQUIRE_ALL=1 (CI) that is refused.
# Then the same live smoke on Slurm 24.11 (docker/versions.sh 24.11: a Debian 13 root beside the
# host's, made once with debootstrap and kept in /var/tmp/shockslurm-roots; README "Slurm
# versions"); SHOCKSLURM_SKIP_VERSIONS=1 skips it, refused with SHOCKSLURM_REQUIRE_ALL=1 too.
# Before pytest, mypy checks the package (config in pyproject.toml); a type error fails the run.
# The Slurm test cluster that the integration tests start is stopped after pytest (a line says
# so) unless SHOCKSLURM_KEEP_CLUSTER=1, or it was running before this script started, in which
# case it is left as it was.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

for knob in SHOCKSLURM_SKIP_DOCKER SHOCKSLURM_SKIP_VERSIONS; do
  if [ "${!knob:-0}" = 1 ] && [ "${SHOCKSLURM_REQUIRE_ALL:-0}" = 1 ]; then
    echo "tests/run.sh: $knob=1 refused: SHOCKSLURM_REQUIRE_ALL=1, nothing may skip" >&2
    exit 1
  fi
done

if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  echo "tests/run.sh: installing python3-venv"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    python3 python3-venv python3-pip >/dev/null
fi

# PostgreSQL for tests/test_store.py (127.0.0.1:5432, trust auth, database `test`): start the
# local cluster when it is installed but down; install it only when it is missing entirely.
pg_up() { command -v pg_isready >/dev/null 2>&1 && pg_isready -q -h 127.0.0.1 -p 5432; }
if ! pg_up; then
  if ! command -v pg_ctlcluster >/dev/null 2>&1 && [ ! -d /etc/postgresql ]; then
    echo "tests/run.sh: installing postgresql"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    fresh_pg=1
  fi
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -1)" main start \
      || echo "tests/run.sh: could not start PostgreSQL; its store tests will skip"
  fi
  for _ in $(seq 1 30); do pg_up && break; sleep 1; done
  if pg_up && [ "${fresh_pg:-0}" = 1 ]; then
    hba=$(su postgres -c "psql -tAc 'SHOW hba_file'")
    sed -i -E 's/^(host\s+all\s+all\s+127\.0\.0\.1\/32\s+)\S+/\1trust/' "$hba"
    su postgres -c "psql -qc 'SELECT pg_reload_conf()'" >/dev/null
    su postgres -c "createdb test" 2>/dev/null || true
  fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
# CPU torch for the training helper's tests (tests/test_train_*.py), FIRST: a local wheel answers
# this pin, and the test extra (lightning) then finds torch satisfied instead of fetching a
# multi-GB CUDA build from PyPI.
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'

echo "tests/run.sh: mypy (the type checker; pyproject.toml [tool.mypy])"
.venv/bin/python -m mypy

cluster_up() { command -v scontrol >/dev/null 2>&1 && scontrol ping 2>/dev/null | grep -q "is UP"; }
cluster_was_up=0
cluster_up && cluster_was_up=1

set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "tests/run.sh: pytest collected no tests (exit 5); nothing failed"
  rc=0
fi

if ! cluster_up; then
  echo "tests/run.sh: no Slurm test cluster is running; nothing to stop"
elif [ "$cluster_was_up" = 1 ]; then
  echo "tests/run.sh: the Slurm test cluster was running before the tests; left running"
elif [ "${SHOCKSLURM_KEEP_CLUSTER:-0}" = 1 ]; then
  echo "tests/run.sh: the Slurm test cluster is left running (SHOCKSLURM_KEEP_CLUSTER=1);" \
    "stop it with: bash shockslurm/slurm/testcluster.sh stop"
else
  echo "tests/run.sh: stopping the Slurm test cluster the tests started" \
    "(SHOCKSLURM_KEEP_CLUSTER=1 keeps it)"
  bash shockslurm/slurm/testcluster.sh stop >/dev/null \
    || echo "tests/run.sh: could not stop the Slurm test cluster" >&2
fi

docker_rc=0
if [ "${SHOCKSLURM_SKIP_DOCKER:-0}" = 1 ]; then
  echo "tests/run.sh: docker smoke SKIPPED (SHOCKSLURM_SKIP_DOCKER=1)"
else
  set +e
  bash docker/smoke.sh
  docker_rc=$?
  set -e
  [ "$docker_rc" -eq 0 ] || echo "tests/run.sh: the docker smoke FAILED (exit $docker_rc)" >&2
fi

versions_rc=0
if [ "${SHOCKSLURM_SKIP_VERSIONS:-0}" = 1 ]; then
  echo "tests/run.sh: Slurm 24.11 smoke SKIPPED (SHOCKSLURM_SKIP_VERSIONS=1)"
else
  set +e
  SHOCKSLURM_PYTHON="$PWD/.venv/bin/python" bash docker/versions.sh 24.11
  versions_rc=$?
  bash docker/versions.sh 24.11 --stop
  set -e
  [ "$versions_rc" -eq 0 ] || echo "tests/run.sh: the Slurm 24.11 smoke FAILED (exit $versions_rc)" >&2
fi
[ "$rc" -ne 0 ] && exit "$rc"
[ "$docker_rc" -ne 0 ] && exit "$docker_rc"
exit "$versions_rc"
