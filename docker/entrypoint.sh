#!/usr/bin/env bash
# The container's PID 1: start the test cluster with the project's own script, run the command
# (default: sleep), and stop the cluster on `docker stop`.
set -euo pipefail
CLUSTER=/opt/shockslurm/shockslurm/slurm/testcluster.sh
# Slurm resolves this host's name; on the host's network the name may be the host's own.
grep -qw "$(hostname -s)" /etc/hosts || echo "127.0.0.1 $(hostname -s)" >> /etc/hosts
bash "$CLUSTER" start
touch /run/shockslurm-cluster-ready
trap 'bash "$CLUSTER" stop; exit 0' TERM INT
"$@" &
wait $!
