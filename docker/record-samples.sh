#!/usr/bin/env bash
# Record the Slurm JSON samples of tests/data/slurm from a live test cluster (its README says how
# each file was made). Run inside the version's root:  bash docker/versions.sh 24.11 --record
# It resets that cluster (job ids restart at 1: never run it against a cluster others use), then
# submits the recording's five jobs, as the 22.05 recording did:
#   rec-held    --gres=gpu:2, comment "shock:spec=x": tagged and held by job_submit.lua
#   rec-run     --gres=gpu:3, released by root: RUNNING
#   rec-requeue --gres=gpu:1, released, RUNNING, then `scontrol requeuehold`: held again, restarted
#   rec-cpu     CPU only: untouched by the plugin, RUNNING
#   rec-gpus    --gpus=2 (tres_per_job): tagged and held
# and writes squeue-<ver>.json, sinfo-<ver>.json, sinfo-N-<ver>.json (`sinfo -N --json`, what the
# daemon reads), scontrol-<ver>.json (`scontrol show job --json`), each trimmed to these jobs and
# pretty-printed, and scontrol-<ver>.txt (`scontrol -o -d show job`, the daemon's fallback).
set -euo pipefail
VER="${1:?usage: record-samples.sh VERSION}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$REPO/tests/data/slurm"
say() { echo "record: $*"; }
die() { echo "record: ERROR: $*" >&2; exit 1; }

bash "$REPO/shockslurm/slurm/testcluster.sh" reset | tail -1
mkdir -p /tmp/ssrec
printf '#!/bin/sh\nsleep 600\n' > /tmp/ssrec/s.sh; chmod 755 /tmp/ssrec/s.sh
sub() { sbatch --parsable -o /dev/null -D /tmp/ssrec "$@" /tmp/ssrec/s.sh; }
state() { squeue -h -j "$1" -o %T; }
wait_state() { # wait_state <id> <state>
  for _ in $(seq 100); do [ "$(state "$1")" = "$2" ] && return 0; sleep 0.2; done
  die "job $1 is $(state "$1"), not $2"
}

held=$(sub -J rec-held -p gpu --gres=gpu:2 --comment "shock:spec=x")
run=$(sub -J rec-run -p gpu --gres=gpu:3)
req=$(sub -J rec-requeue -p gpu --gres=gpu:1)
cpu=$(sub -J rec-cpu -p gpu)
gpus=$(sub -J rec-gpus -p gpu --gpus=2)
scontrol release "$run" "$req"
wait_state "$run" RUNNING; wait_state "$req" RUNNING; wait_state "$cpu" RUNNING
scontrol requeuehold "$req"
for _ in $(seq 100); do
  [ "$(squeue -h -j "$req" -o '%T %r')" = "PENDING JobHeldUser" ] && break; sleep 0.2; done
sleep 1
say "jobs $held $run $req $cpu $gpus: $(squeue -h -o '%i:%j:%T:%r' | xargs)"

trim() { # trim <file>: keep the rec-* jobs, pretty-print
  python3 - "$1" <<'PY'
import json, sys
path = sys.argv[1]
doc = json.load(open(path))
if isinstance(doc.get("jobs"), list):
    doc["jobs"] = [j for j in doc["jobs"] if str(j.get("name", "")).startswith("rec-")]
with open(path, "w") as f:
    json.dump(doc, f, indent=1, sort_keys=False)
    f.write("\n")
PY
}
squeue --json > "$OUT/squeue-$VER.json"
sinfo --json > "$OUT/sinfo-$VER.json"
sinfo -N --json > "$OUT/sinfo-N-$VER.json"
scontrol show job --json > "$OUT/scontrol-$VER.json"
for k in squeue sinfo sinfo-N scontrol; do trim "$OUT/$k-$VER.json"; done
scontrol -o -d show job | grep ' JobName=rec-' > "$OUT/scontrol-$VER.txt"
scancel "$held" "$run" "$req" "$cpu" "$gpus"
say "wrote $OUT/{squeue,sinfo,sinfo-N,scontrol}-$VER.json, scontrol-$VER.txt ($(sinfo -V))"
