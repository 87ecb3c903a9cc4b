#!/usr/bin/env bash
# Make the Debian 12 base image `local/debian:12` from the Debian mirror apt already uses, for
# sites and CI that cannot pull `debian:12` from a registry.
#
#   bash docker/build-base.sh            # idempotent: does nothing when the image exists
#   SHOCKSLURM_DEBIAN_MIRROR=http://... bash docker/build-base.sh      # another mirror
#
# It runs `debootstrap --variant=minbase bookworm` into a temporary directory (about 30 s) and
# imports the tree with `docker import`. The mirror is the first one apt is configured with for
# bookworm (/etc/apt/sources.list.d/*.sources or /etc/apt/sources.list), or
# $SHOCKSLURM_DEBIAN_MIRROR. Users with Docker Hub skip this and build FROM debian:12.
# Talks to the engine in $DOCKER_HOST (docker/engine.sh's, when it is set by the caller).
set -euo pipefail

IMAGE="${SHOCKSLURM_BASE_IMAGE:-local/debian:12}"
say() { echo "build-base: $*"; }
die() { echo "build-base: ERROR: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (debootstrap needs it)"

if docker image inspect "$IMAGE" >/dev/null 2>&1; then say "$IMAGE exists"; exit 0; fi

apt_mirror() { # the first bookworm URI apt uses (deb822 .sources, then one-line sources.list)
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    uri=$(awk 'BEGIN{RS=""} /(^|\n)Suites:[^\n]*bookworm( |\n|$)/ && /(^|\n)Types:[^\n]*deb( |\n|$)/ {
                 if (match($0, /(^|\n)URIs: *[^ \n]+/)) { s = substr($0, RSTART, RLENGTH);
                   sub(/^\n?URIs: */, "", s); print s; exit } }' "$f")
    [ -n "$uri" ] && { echo "$uri"; return 0; }
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    uri=$(awk '$1 == "deb" && $0 ~ / bookworm / { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' "$f")
    [ -n "$uri" ] && { echo "$uri"; return 0; }
  done
  return 1
}

MIRROR="${SHOCKSLURM_DEBIAN_MIRROR:-$(apt_mirror || true)}"
[ -n "$MIRROR" ] || die "no bookworm mirror in apt's sources; set SHOCKSLURM_DEBIAN_MIRROR"
if ! command -v debootstrap >/dev/null 2>&1; then
  say "installing debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

ROOT=$(mktemp -d /var/tmp/shockslurm-rootfs.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
say "debootstrap bookworm from $MIRROR"
debootstrap --variant=minbase bookworm "$ROOT" "$MIRROR" >"$ROOT.log" 2>&1 \
  || { tail -20 "$ROOT.log" >&2; rm -f "$ROOT.log"; die "debootstrap failed"; }
rm -f "$ROOT.log"
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*
tar -C "$ROOT" -c . | docker import --change 'CMD ["bash"]' - "$IMAGE" >/dev/null
say "made $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
