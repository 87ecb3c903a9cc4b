#!/usr/bin/env bash
# The test cluster on a newer Slurm, in a Debian root beside the host's (chroot, host network):
#
#   bash docker/versions.sh 24.11                  the live smoke (docker/live-smoke.sh) there
#   bash docker/versions.sh 24.11 tests/integration -q -x   pytest with these arguments there
#   bash docker/versions.sh 26.05 --shell 'squeue --json'   any command there (cluster started)
#   bash docker/versions.sh 24.11 --record         record the JSON samples into tests/data/slurm
#   bash docker/versions.sh 24.11 --stop           stop that cluster and unmount the root
#
# Versions: 24.11 (Debian 13 trixie, slurm-wlm 24.11.5), 26.05 (Debian sid, slurm-wlm 26.05.x);
# 22.05 is the host's own (Debian 12): run the suite natively for it. As root on a Debian host.
# The root is made once with debootstrap from $SHOCKSLURM_DEBIAN_MIRROR (default
# http://deb.debian.org/debian) into $SHOCKSLURM_ROOTS/<suite> (/var/tmp/shockslurm-roots) and
# kept for the next run (a few minutes on 2 cores). Inside it, the same testcluster.sh starts the
# cluster on loopback ports of its own (24.11: slurmctld 6927, slurmd 17201+; 26.05: 6937,
# 17301+), so the host's cluster (6817) and the docker smoke's (6917) keep running. The root
# shares the host's network and process table (no interface is added); its /etc, /run and /tmp
# are its own, so its munge key, slurm.conf and cluster state never touch the host's.
# The project's tests run with the host's interpreter: the repository, the virtual environment
# and the Python it was made from are bind-mounted read-only at the same paths (the root's glibc
# is newer than the host's, so the host's binaries run there).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROOTS="${SHOCKSLURM_ROOTS:-/var/tmp/shockslurm-roots}"
MIRROR="${SHOCKSLURM_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PY="${SHOCKSLURM_PYTHON:-$REPO/.venv/bin/python}"
# Slurm, munge, what testcluster.sh and live-smoke.sh call, and the libraries the host's Python
# and its wheels load that a minimal Debian lacks (ctypes/cffi: libffi8; sqlite3: libsqlite3-0;
# Debian 12's python3.11 itself: libexpat1)
PACKAGES="slurmctld slurmd slurm-client munge procps iproute2 ca-certificates libffi8 libsqlite3-0 libexpat1"

say() { echo "versions: $*"; }
die() { echo "versions: ERROR: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (debootstrap, mounts and Slurm need it)"
[ $# -ge 1 ] || die "usage: $0 24.11|26.05 [--smoke|--record|--stop|--shell CMD|PYTEST ARGS...]"
VERSION=$1; shift
case "$VERSION" in
  24.11) SUITE=trixie; CTLD_PORT=6927; NODE_PORT=17201 ;;
  26.05) SUITE=sid; CTLD_PORT=6937; NODE_PORT=17301 ;;
  22.05) die "22.05 is the host's Slurm: run tests/run.sh (or pytest) natively" ;;
  *) die "unknown version $VERSION (24.11 or 26.05)" ;;
esac
ROOT="$ROOTS/$SUITE"
[ -x "$PY" ] || die "no Python at $PY (make the venv first, or set SHOCKSLURM_PYTHON)"
VENV="$("$PY" -c 'import sys; print(sys.prefix)')"
BASE="$("$PY" -c 'import sys; print(sys.base_prefix)')"
PYEXE="$(readlink -f "$PY")"
PYVER="$("$PY" -c 'import sys; print("python%d.%d" % sys.version_info[:2])')"

missing_packages() { # the packages of $PACKAGES the root lacks
  local p; for p in $PACKAGES; do
    compgen -G "$ROOT/var/lib/dpkg/info/$p.list" >/dev/null \
      || compgen -G "$ROOT/var/lib/dpkg/info/$p:*.list" >/dev/null || echo "$p"; done
}

complete_root() { # a root made with an older package list gets the packages added since
  local missing; missing=$(missing_packages | xargs)
  [ -z "$missing" ] && return 0
  say "installing $missing into $ROOT"
  inside "apt-get -o Acquire::Check-Valid-Until=false update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null"
}

have_root() { [ -f "$ROOT/var/lib/dpkg/info/slurmctld.list" ]; }

make_root() { # debootstrap into a new directory, renamed to $ROOT only when complete
  have_root && return 0
  [ -e "$ROOT" ] && die "$ROOT exists but has no Slurm: remove it (after --stop) and rerun"
  command -v debootstrap >/dev/null 2>&1 || {
    say "installing debootstrap"; apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
  local new="$ROOT.new.$$"
  say "debootstrap $SUITE with Slurm from $MIRROR into $ROOT (minutes)"
  mkdir -p "$ROOTS"
  debootstrap --variant=minbase --include="${PACKAGES// /,}" "$SUITE" "$new" "$MIRROR" >"$ROOT.log" 2>&1 \
    || { tail -20 "$ROOT.log" >&2; die "debootstrap failed (log $ROOT.log; remove $new)"; }
  find "$new/var/cache/apt/archives" -name '*.deb' -delete
  mv "$new" "$ROOT"
}

mounted() { mountpoint -q "$ROOT$1"; }
bind() { # bind <path> [ro]: the host's path at the same place in the root
  mounted "$1" && return 0
  if [ -d "$1" ]; then mkdir -p "$ROOT$1"; else mkdir -p "$(dirname "$ROOT$1")"; touch "$ROOT$1"; fi
  mount --bind "$1" "$ROOT$1"
  [ "${2:-}" = ro ] && mount -o remount,bind,ro "$ROOT$1"
  return 0
}

link_chain() { # the symlinks from the venv's python to the interpreter (/usr/bin/python3 -> ...)
  local p=$1 t
  while [ -L "$p" ]; do
    t=$(readlink "$p"); [[ $t = /* ]] || t="$(dirname "$p")/$t"
    if [ -L "$t" ] && [ ! -e "$ROOT$t" ] && [ ! -L "$ROOT$t" ]; then ln -s "$(readlink "$t")" "$ROOT$t"; fi
    p=$t
  done
}

mount_root() {
  mounted /proc || mount -t proc proc "$ROOT/proc"
  mounted /sys || mount --rbind /sys "$ROOT/sys"
  mounted /dev || mount --rbind /dev "$ROOT/dev"
  cp /etc/hosts /etc/resolv.conf "$ROOT/etc/" 2>/dev/null || true
  bind "$REPO"
  bind "$VENV" ro
  if [ "$BASE" = /usr ]; then     # a distribution Python: its library and executable only
    bind "/usr/lib/$PYVER" ro; bind "$PYEXE" ro; link_chain "$PY"
  else                            # pyenv, a self-built Python: the whole prefix
    bind "$BASE" ro
  fi
}

umount_root() {
  local m
  for m in $(awk -v r="$ROOT/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
}

inside() { # run a command in the root, the cluster's knobs and the project's Python set
  chroot "$ROOT" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
    PATH="$VENV/bin:/usr/sbin:/usr/bin:/sbin:/bin" PYTHONPATH="$REPO" \
    SHOCK_SLURM_CTLD_PORT="$CTLD_PORT" SHOCK_SLURM_NODE_PORT="$NODE_PORT" \
    SHOCK_SLURM_DIR=/tmp/shockslurm-cluster SHOCKSLURM_SLURM_VERSION_UNDER_TEST="$VERSION" \
    SHOCKSLURM_SMOKE_OWN_ENV="SHOCKSLURM_SLURM_VERSION_UNDER_TEST=$VERSION" \
    ${SHOCKSLURM_SMOKE_TIMEOUT_S:+SHOCKSLURM_SMOKE_TIMEOUT_S=$SHOCKSLURM_SMOKE_TIMEOUT_S} \
    bash -c "cd '$REPO' && $1"
}

start_cluster() {
  inside "bash shockslurm/slurm/testcluster.sh start" | tail -1
}

if [ "${1:-}" = --stop ]; then
  [ -d "$ROOT" ] || { say "no root at $ROOT"; exit 0; }
  mounted /proc && inside "bash shockslurm/slurm/testcluster.sh stop" || true
  umount_root; say "stopped $VERSION, unmounted $ROOT"; exit 0
fi
make_root
mount_root
complete_root
start_cluster
case "${1:---smoke}" in
  --smoke) inside "bash docker/live-smoke.sh" ;;
  --record) inside "bash docker/record-samples.sh $VERSION" ;;
  --shell) shift; inside "$*" ;;
  *) inside "python -m pytest -p no:cacheprovider $(printf '%q ' "$@")" ;;
esac
