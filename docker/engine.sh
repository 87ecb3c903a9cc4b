#!/usr/bin/env bash
# A Docker engine that stays on loopback, for the test cluster image (sites and CI without one).
#
#   bash docker/engine.sh start    install docker.io when missing, start dockerd (idempotent)
#   bash docker/engine.sh stop     stop the dockerd this script started (by PID) and its containerd
#   export DOCKER_HOST=unix:///run/shockslurm-docker.sock    then use `docker` as usual
#
# The engine is private to shockslurm: its own socket, pid file, exec root and data root, so it
# never touches another engine on the machine. It runs without its default bridge
# (--bridge=none: no docker0, no private-range addresses) and without iptables rules; containers
# use the host's network (`--network host`), where the test cluster listens on 127.0.0.1 only.
# Knobs (environment):
#   SHOCKSLURM_DOCKER_ROOT  images, containers, build cache          [/var/lib/shockslurm-docker]
#   SHOCKSLURM_DOCKER_LOG   dockerd's log                            [/var/log/shockslurm-dockerd.log]
# No systemd needed: dockerd runs in the background, started and stopped here.
set -euo pipefail

SOCK=/run/shockslurm-docker.sock
PIDFILE=/run/shockslurm-docker.pid
EXEC_ROOT=/run/shockslurm-docker
DATA_ROOT="${SHOCKSLURM_DOCKER_ROOT:-/var/lib/shockslurm-docker}"
LOG="${SHOCKSLURM_DOCKER_LOG:-/var/log/shockslurm-dockerd.log}"
export DOCKER_HOST="unix://$SOCK"

say() { echo "engine: $*"; }
die() { echo "engine: ERROR: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts dockerd)"

alive() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

install_engine() {
  command -v dockerd >/dev/null 2>&1 && return 0
  say "installing docker.io"
  apt-get update -qq
  # keep the package's own scripts from starting an engine with a bridge: we start ours
  local prc=/usr/sbin/policy-rc.d added=0
  if [ ! -e $prc ]; then printf '#!/bin/sh\nexit 101\n' > $prc; chmod 755 $prc; added=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >/dev/null
  [ $added = 1 ] && rm -f $prc
  return 0
}

do_start() {
  install_engine
  if alive && docker version >/dev/null 2>&1; then say "already running ($DOCKER_HOST)"; return 0; fi
  mkdir -p "$DATA_ROOT" "$EXEC_ROOT" "$(dirname "$LOG")"
  dockerd --host "$DOCKER_HOST" --pidfile "$PIDFILE" --exec-root "$EXEC_ROOT" \
    --data-root "$DATA_ROOT" --bridge=none --iptables=false --ip-masq=false \
    --ip-forward=false --storage-driver overlay2 >>"$LOG" 2>&1 &
  for _ in $(seq 150); do docker version >/dev/null 2>&1 && break; sleep 0.2; done
  docker version >/dev/null 2>&1 || { tail -20 "$LOG" >&2; die "dockerd did not answer on $DOCKER_HOST"; }
  ip link show docker0 >/dev/null 2>&1 && die "a docker0 bridge exists: another engine made it"
  say "ready on $DOCKER_HOST (no bridge, data in $DATA_ROOT, log $LOG)"
}

do_stop() {
  if ! alive; then say "not running"; rm -f "$PIDFILE"; return 0; fi
  local pid; pid=$(cat "$PIDFILE")
  kill "$pid"   # dockerd stops the containerd it started itself
  for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$pid" 2>/dev/null && { kill -9 "$pid"; say "dockerd did not stop in 30 s: killed"; }
  rm -f "$PIDFILE"
  say "stopped"
}

case "${1:-}" in
  start) do_start ;;
  stop) do_stop ;;
  *) die "usage: $0 start|stop" ;;
esac
