#!/usr/bin/env bash
# Start the test cluster with the project's own script, then run the container's command.
set -euo pipefail
bash /opt/shockslurm/shockslurm/slurm/testcluster.sh start
trap 'bash /opt/shockslurm/shockslurm/slurm/testcluster.sh stop' TERM INT
"$@" &
wait $!
