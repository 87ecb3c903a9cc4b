#!/usr/bin/env bash
# The docker smoke, exactly what CI runs (tests/run.sh calls it after pytest) and what README.md
# "Docker" shows:
#   bash docker/smoke.sh
# As root on Debian 12. It
#   1. starts a loopback-only Docker engine (docker/engine.sh: installs docker.io when missing,
#      no bridge, no iptables), unless that engine already runs;
#   2. makes the base image local/debian:12 from apt's Debian mirror (docker/build-base.sh),
#      or uses $SHOCKSLURM_DOCKER_BASE (e.g. debian:12 where Docker Hub is reachable);
#   3. builds the image (docker/Dockerfile) with the host's network;
#   4. runs the container on the host's network: its entrypoint starts the test cluster
#      (shockslurm/slurm/testcluster.sh, slurmctld 6917 and slurmd 17101-17104 on 127.0.0.1, so
#      a test cluster on the host keeps running), then docker/live-smoke.sh runs inside it:
#      `shockslurm simulate`, and the daemon driving shocksub jobs to COMPLETED;
#   5. checks that the engine made no network interface and that neither dockerd nor containerd
#      has a TCP/UDP socket;
#   6. cleans up, also on failure: the container, the image, the build cache, and the engine if
#      it started it. It keeps local/debian:12 in the engine's data root (/var/lib/shockslurm-docker)
#      for the next run; SHOCKSLURM_DOCKER_KEEP_BASE=0 removes it too.
# Exits non-zero when the image cannot be built or the smoke fails. About 4-6 minutes on a fresh
# 2-core machine (mostly the image build); docker/README or README.md "Docker" has the numbers.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
IMAGE=shockslurm-testcluster:smoke
NAME="shockslurm-smoke-$$"
BASE="${SHOCKSLURM_DOCKER_BASE:-local/debian:12}"
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
  docker image prune -f >/dev/null 2>&1 || true          # layers of a build that failed midway
  docker builder prune -af >/dev/null 2>&1 || true
  if [ "${SHOCKSLURM_DOCKER_KEEP_BASE:-1}" = 0 ]; then docker rmi -f "$BASE" >/dev/null 2>&1 || true; fi
  [ "$started_engine" = 1 ] && bash docker/engine.sh stop
  say "cleaned up; total $(( $(date +%s) - T0 )) s, exit $rc"
  exit $rc
}
trap cleanup EXIT

bash docker/engine.sh start
lap "engine"
if [ "$BASE" = local/debian:12 ]; then bash docker/build-base.sh; lap "base image"; fi

# The PEM certificates in the CA bundle this machine's pip trusts that Debian's ca-certificates
# does not ship (a site CA, e.g. of a TLS-inspecting proxy): the image trusts them too.
site_ca_certs() {
  python3 - "${PIP_CERT:-${REQUESTS_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}}" <<'PY'
import glob, re, sys
pem = re.compile(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", re.S)
def blocks(path):
    try:
        return pem.findall(open(path, encoding="ascii", errors="replace").read())
    except OSError:
        return []
shipped = {"".join(b.split()) for f in glob.glob("/usr/share/ca-certificates/**/*.crt",
                                                 recursive=True) for b in blocks(f)}
print("\n".join(b for b in blocks(sys.argv[1]) if "".join(b.split()) not in shipped))
PY
}

# Where the build machine reaches PyPI through another index, a proxy or a site CA, so does the build.
build_args=(--build-arg "BASE=$BASE")
site_ca=$(site_ca_certs)
[ -n "$site_ca" ] && build_args+=(--build-arg "SITE_CA_CERTS=$site_ca")
[[ "${PIP_INDEX_URL:-}" =~ ^https?:// ]] && build_args+=(--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL")
for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
  [ -n "${!v:-}" ] && build_args+=(--build-arg "$v")
done
build_log=$(mktemp /tmp/shockslurm-docker-build.XXXXXX)
timeout 1200 docker build --network host "${build_args[@]}" -t "$IMAGE" -f docker/Dockerfile . \
  >"$build_log" 2>&1 || { tail -40 "$build_log" >&2; fail "the image did not build (log: $build_log)"; }
rm -f "$build_log"
lap "image build"

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
