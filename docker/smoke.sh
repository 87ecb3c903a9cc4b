#!/usr/bin/env bash
# The docker smoke, exactly what CI runs (tests/run.sh calls it after pytest) and what README.md
# "Docker" shows:
#   bash docker/smoke.sh
# As root on Debian 12. It
#   1. starts a loopback-only Docker engine (docker/engine.sh: installs docker.io when missing,
#      no bridge, no iptables), unless that engine already runs;
#   2-3. builds the image (docker/build.sh): the base local/debian:12 from apt's Debian mirror
#      (docker/build-base.sh) unless $SHOCKSLURM_DOCKER_BASE names another (e.g. debian:12 where
#      Docker Hub is reachable), then docker/Dockerfile with the host's network;
#   4. runs the container on the host's network: its entrypoint starts the test cluster
#      (shockslurm/slurm/testcluster.sh, slurmctld 6917 and slurmd 17101-17104 on 127.0.0.1, so
#      a test cluster on the host keeps running), then docker/live-smoke.sh runs inside it:
#      `shockslurm simulate`, and the daemon driving shocksub jobs to COMPLETED;
#   5. checks that the engine made no network interface and that neither dockerd nor containerd
#      has a TCP/UDP socket;
#   6. cleans up, also on failure: the container, the image, the build cache, and the engine if
#      it started it. It keeps local/debian:12 in the engine's data root (/var/lib/shockslurm-docker)
#      for the next run; SHOCKSLURM_DOCKER_KEEP_BASE=0 removes it too.
# Exits non-zero when the image cannot be built or the smoke fails. About 3 minutes on a 2-core
# machine, plus installing docker.io when missing (README.md "Docker" has the measured numbers).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
IMAGE=shockslurm-testcluster:smoke
NAME="shockslurm-smoke-$$"
BASE="${SHOCKSLURM_DOCKER_BASE:-local/debian:12}"   # docker/build.sh reads it too
export DOCKER_HOST=unix:///run/shockslurm-docker.sock DOCKER_BUILDKIT=0
T0=$(date +%s); t=$T0
say() { echo "docker-smoke: $*"; }
lap() { local now; now=$(date +%s); say "$1 took $((now - t)) s"; t=$now; }
fail() { echo "docker-smoke: FAILED: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "run as root (it installs docker.io and starts an engine)"

links_before=$(ip -o link | awk -F': ' '{print $2}' | sort)
started_engine=0
[ -S /run/shockslurm-docker.sock ] && docker version >/dev/null 2>&1 || started_engine=1

cleanup() {
  local rc=$?
  docker rm -f "$NAME" >/dev/null 2>&1 || true
  docker rmi -f "$IMAGE" >/dev/null 2>&1 || true
  docker container prune -f >/dev/null 2>&1 || true      # stopped ones, e.g. a failed build step's
  docker image prune -f >/dev/null 2>&1 || true          # layers of a build that failed midway
  docker builder prune -af >/dev/null 2>&1 || true
  if [ "${SHOCKSLURM_DOCKER_KEEP_BASE:-1}" = 0 ]; then docker rmi -f "$BASE" >/dev/null 2>&1 || true; fi
  say "left in the engine: $(docker images -aq 2>/dev/null | wc -l) image(s) $(docker images --format '{{.Repository}}:{{.Tag}}' 2>/dev/null | xargs), $(docker ps -aq 2>/dev/null | wc -l) container(s)"
  if [ "$started_engine" = 1 ]; then bash docker/engine.sh stop; fi
  say "cleaned up; total $(( $(date +%s) - T0 )) s, exit $rc"
  exit $rc
}
trap cleanup EXIT

bash docker/engine.sh start
lap "engine"
build_log=$(mktemp /tmp/shockslurm-docker-build.XXXXXX)
timeout 1500 bash docker/build.sh "$IMAGE" >"$build_log" 2>&1 \
  || { tail -40 "$build_log" >&2; fail "the image did not build (log: $build_log)"; }
grep -E '^(build-base|build):' "$build_log"; rm -f "$build_log"
lap "base image and image build"

docker run -d --name "$NAME" --network host "$IMAGE" >/dev/null
for _ in $(seq 120); do
  docker exec "$NAME" test -e /run/shockslurm-cluster-ready 2>/dev/null && break
  [ "$(docker inspect -f '{{.State.Running}}' "$NAME")" = true ] || break
  sleep 0.5
done
docker exec "$NAME" test -e /run/shockslurm-cluster-ready 2>/dev/null \
  || { docker logs "$NAME" >&2 || true; fail "the test cluster did not start in the container"; }
docker logs "$NAME" | grep 'testcluster: ready'
lap "container and test cluster"

timeout 600 docker exec "$NAME" bash docker/live-smoke.sh || fail "the live smoke failed"
lap "live smoke"

# Loopback only: the engine made no interface (no docker0, no veth) and has no network socket.
links_now=$(ip -o link | awk -F': ' '{print $2}' | sort)
[ "$links_now" = "$links_before" ] || fail "new network interfaces: $(comm -13 <(echo "$links_before") <(echo "$links_now") | xargs)"
engine_sockets=$(ss -tunapH | grep -E '"(dockerd|containerd[^"]*|docker-proxy)"' || true)
[ -z "$engine_sockets" ] || fail "the engine has network sockets: $engine_sockets"
say "no new network interface, no engine socket on the network"
docker stop -t 30 "$NAME" >/dev/null
docker logs "$NAME" 2>&1 | tail -1
say "OK"
