#!/usr/bin/env bash
# Build the test cluster image (docker/Dockerfile) the way this machine reaches its package
# sources, from the repository root:
#   bash docker/build.sh [TAG]                      # default tag: shockslurm-testcluster
#   SHOCKSLURM_DOCKER_BASE=debian:12 bash docker/build.sh    # where Docker Hub is reachable
# The base image is local/debian:12, made from apt's Debian mirror by docker/build-base.sh when
# missing, unless SHOCKSLURM_DOCKER_BASE names another. The build uses the host's network and
# passes on what this machine's pip needs to reach PyPI: an http(s) PIP_INDEX_URL, proxy
# variables, and the certificates of the CA bundle pip trusts that Debian's ca-certificates does
# not ship (a site CA, e.g. a TLS-inspecting proxy's). Uses the legacy builder (DOCKER_BUILDKIT=0:
# Debian's docker.io has no buildx) and the engine in $DOCKER_HOST.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TAG="${1:-shockslurm-testcluster}"
BASE="${SHOCKSLURM_DOCKER_BASE:-local/debian:12}"
export DOCKER_BUILDKIT=0

site_ca_certs() { # PEM blocks of pip's CA bundle that no Debian ca-certificates file holds
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

t0=$SECONDS
if [ "$BASE" = local/debian:12 ]; then bash docker/build-base.sh; echo "build: base image ready in $((SECONDS - t0)) s"; fi
t0=$SECONDS
args=(--build-arg "BASE=$BASE")
site_ca=$(site_ca_certs)
if [ -n "$site_ca" ]; then
  args+=(--build-arg "SITE_CA_CERTS=$site_ca")
  echo "build: trusting $(grep -c 'BEGIN CERTIFICATE' <<<"$site_ca") site CA certificate(s) from pip's bundle"
fi
if [[ "${PIP_INDEX_URL:-}" =~ ^https?:// ]]; then args+=(--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL"); fi
for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
  if [ -n "${!v:-}" ]; then args+=(--build-arg "$v"); fi
done
docker build --force-rm --network host "${args[@]}" -t "$TAG" -f docker/Dockerfile .
echo "build: $TAG built on $BASE in $((SECONDS - t0)) s"
