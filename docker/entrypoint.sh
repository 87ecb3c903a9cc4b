#!/usr/bin/env bash
# The container's PID 1: start the test cluster with the project's own script, run the command
# (default: sleep), and stop the cluster on `docker stop`.
set -euo pipefail
CLUSTER=/opt/shockslurm/shockslurm/slurm/testcluster.sh
# testcluster.sh binds Slurm to the address this host's name resolves to when that is loopback.
# On the host's network the name is the host's own, which may resolve elsewhere: map it to
# 127.0.0.1 first (/etc/hosts is a bind mount: rewrite it in place).
name=$(hostname -s)
if [[ "$(getent ahostsv4 "$name" | awk 'NR == 1 {print $1}')" != 127.* ]]; then
  hosts=$(cat /etc/hosts); printf '127.0.0.1 %s\n%s\n' "$name" "$hosts" > /etc/hosts
fi
bash "$CLUSTER" start
touch /run/shockslurm-cluster-ready
trap 'bash "$CLUSTER" stop; exit 0' TERM INT
"$@" &
wait $!
