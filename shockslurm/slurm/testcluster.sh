#!/usr/bin/env bash
# shockslurm test cluster: a real Slurm 22.05 (Debian 12) on one host, for tests, CI and docker/.
#
#   testcluster.sh start    install Debian's Slurm when missing, configure, start (idempotent);
#                           a cluster that was killed, not stopped, starts with an empty queue
#   testcluster.sh install  only install Debian's Slurm and munge when missing (image builds)
#   testcluster.sh stop     cancel every job, then stop the daemons this script started (by PID)
#   testcluster.sh clear    cancel every job and wait for its end; the daemons keep running
#   testcluster.sh status   daemons, nodes, queue
#   testcluster.sh reset    stop, wipe job state, start again (job ids restart at 1)
#
# Knobs (environment):
#   SHOCK_SLURM_DIR    state, logs, spool, fake devices       [/tmp/shockslurm-cluster]
#   SHOCK_SLURM_NODES  number of slurmd processes (nodes)      [4]
#   SHOCK_SLURM_GPUS   fake GPUs per node                      [8]
#   SHOCK_SLURM_LUA    job_submit.lua to enable ("" = none)    [the plugin shipped beside this script]
#   SHOCK_SLURM_KILLWAIT  seconds between SIGTERM and SIGKILL  [5]
#   SHOCK_SLURM_CTLD_PORT slurmctld's port                     [6817]
#   SHOCK_SLURM_NODE_PORT the first slurmd's port; node i listens on this + i - 1  [17001]
#     (docker/ runs a second cluster on the host's network with other ports: 6917, 17101...)
#
# Facts this relies on (verified on Slurm 22.05.8, see the project's notes):
# - slurmctld only starts when SlurmctldHost is this host's short name; we pin its address to
#   127.0.0.1, and every slurmd listens on 127.0.0.1 with a port of its own (17001, ...).
#   SlurmdPort stays 6818 but nothing listens there: each node's Port= wins.
# - GPU gres without File= is dropped ("Removing file-less GPU") and the node drains, so each
#   node gets character devices (major 195, like nvidia) that nothing ever opens (task/none).
# - Without slurmdbd, AccountingStorageTRES=gres/gpu is fatal: GPUs are read from tres_per_node.
# - A node that once registered badly stays DRAIN: test nodes are disposable, so we resume them.
# - slurmctld recovers the jobs it had saved when it was killed (not stopped): a killed test
#   run's jobs would run again under the next run's tests and take their GPUs or preempt their
#   jobs (seen in CI). A start that has to start slurmctld cancels what it recovered, and first
#   kills the job scripts whose slurmstepd died with the cluster.
# - Slurm binds its listening sockets to every address (INADDR_ANY) unless CommunicationParameters
#   has NoCtldInAddrAny (slurmctld) and NoInAddrAny (slurmd, commands): then it binds the address
#   this host's name resolves to. We set both when that address is loopback, so nothing listens
#   beyond 127.0.0.0/8 (docker/entrypoint.sh maps the container's name to 127.0.0.1).
# - PID 1 here may reap orphans late: a zombie still answers kill -0, so liveness checks ps.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="${SHOCK_SLURM_DIR:-/tmp/shockslurm-cluster}"
NODES="${SHOCK_SLURM_NODES:-4}"
GPUS="${SHOCK_SLURM_GPUS:-8}"
LUA="${SHOCK_SLURM_LUA-$HERE/plugin/job_submit.lua}"
KILLWAIT="${SHOCK_SLURM_KILLWAIT:-5}"
CTLD_PORT="${SHOCK_SLURM_CTLD_PORT:-6817}"
NODE_PORT="${SHOCK_SLURM_NODE_PORT:-17001}"
ETC=/etc/slurm
CONF="$ETC/slurm.conf"
MARK="# written by shockslurm testcluster.sh"

say() { echo "testcluster: $*"; }
die() { echo "testcluster: ERROR: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts daemons)"
case "$NODES$GPUS$KILLWAIT$CTLD_PORT$NODE_PORT" in
  *[!0-9]*) die "SHOCK_SLURM_NODES/GPUS/KILLWAIT/CTLD_PORT/NODE_PORT must be integers";; esac
[ "$NODES" -ge 1 ] && [ "$NODES" -le 64 ] || die "SHOCK_SLURM_NODES must be 1..64"
[ "$GPUS" -ge 1 ] && [ "$GPUS" -le 64 ] || die "SHOCK_SLURM_GPUS must be 1..64"
[ "$CTLD_PORT" -ge 1024 ] && [ "$CTLD_PORT" -le 65535 ] || die "SHOCK_SLURM_CTLD_PORT must be 1024..65535"
[ "$NODE_PORT" -ge 1024 ] && [ $((NODE_PORT + NODES - 1)) -le 65535 ] \
  || die "SHOCK_SLURM_NODE_PORT must be 1024..65535 for every node"
[ "$CTLD_PORT" -lt "$NODE_PORT" ] || [ "$CTLD_PORT" -ge $((NODE_PORT + NODES)) ] \
  || die "SHOCK_SLURM_CTLD_PORT $CTLD_PORT falls among the slurmd ports $NODE_PORT..$((NODE_PORT + NODES - 1))"

node() { printf 'gpu%02d' "$1"; }
alive() { # a pid file naming a live, non-zombie process
  local p; [ -f "$1" ] && p=$(cat "$1") && kill -0 "$p" 2>/dev/null \
    && [ "$(ps -o stat= -p "$p" | cut -c1)" != Z ]
}

install_packages() {
  local want="slurmctld slurmd slurm-client munge" missing=""
  for p in $want; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
  done
  [ -z "$missing" ] && return 0
  say "installing$missing"
  apt-get update -qq
  # keep the packages' own scripts from starting daemons: we start them ourselves
  local prc=/usr/sbin/policy-rc.d added=0
  if [ ! -e $prc ]; then printf '#!/bin/sh\nexit 101\n' > $prc; chmod 755 $prc; added=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  [ $added = 1 ] && rm -f $prc
  return 0
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return 0; fi
  [ -s /etc/munge/munge.key ] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
  chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
  install -d -o munge -g munge -m 755 /run/munge
  install -d -o munge -g munge -m 700 /var/lib/munge /var/log/munge
  setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n | unmunge >/dev/null || die "munged did not start"
  cp /run/munge/munged.pid "$DIR/munged.pid"
}

write_config() { # prints 1 when the configuration changed
  mkdir -p "$DIR"/{state,log,dev} "$ETC"
  for d in $(seq 0 $((GPUS - 1))); do
    [ -e "$DIR/dev/nvidia$d" ] || mknod "$DIR/dev/nvidia$d" c 195 "$d" 2>/dev/null \
      || ln -sf /dev/null "$DIR/dev/nvidia$d"
  done
  if [ -e "$CONF" ] && ! grep -q "^$MARK" "$CONF"; then
    cp -a "$CONF" "$CONF.before-shockslurm.$(date +%s)"   # never clobber a site's config silently
  fi
  local host last tmp
  host="$(hostname -s)"; last=$(node "$NODES"); tmp=$(mktemp)
  cat > "$tmp" <<EOF
$MARK (nodes=$NODES gpus=$GPUS lua=${LUA:+yes}) - rerun the script instead of editing
ClusterName=shocktest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldPort=$CTLD_PORT
SlurmdPort=6818
MailProg=/bin/true
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/backfill
# batch_sched_delay=0: a released job starts on the next pass, not up to 3 s later (README "Slurm settings")
SchedulerParameters=bf_interval=5,sched_interval=5,batch_sched_delay=0
PriorityType=priority/basic
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
JobRequeue=1
KillWait=$KILLWAIT
MinJobAge=600
SlurmdTimeout=120
InactiveLimit=0
EOF
  [ -n "$LUA" ] && echo "JobSubmitPlugins=lua" >> "$tmp"
  if [[ "$(getent ahostsv4 "$host" | awk 'NR == 1 {print $1}')" == 127.* ]]; then
    echo "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny" >> "$tmp"
  else
    say "warning: $host does not resolve to 127.0.0.0/8: Slurm listens on every address" >&2
  fi
  for i in $(seq "$NODES"); do
    echo "NodeName=$(node "$i") NodeHostname=$host NodeAddr=127.0.0.1 Port=$((NODE_PORT + i - 1)) CPUs=32 Boards=1 SocketsPerBoard=2 CoresPerSocket=16 ThreadsPerCore=1 RealMemory=256000 Gres=gpu:$GPUS State=UNKNOWN" >> "$tmp"
  done
  local all; all="gpu[01-$(printf %02d "$NODES")]"; [ "$NODES" = 1 ] && all=gpu01
  echo "PartitionName=gpu Nodes=$all Default=YES MaxTime=INFINITE State=UP PriorityTier=1" >> "$tmp"
  echo "PartitionName=urgent Nodes=$all Default=NO MaxTime=INFINITE State=UP PriorityTier=10" >> "$tmp"
  { echo "$MARK"; echo "AutoDetect=off"
    for i in $(seq "$NODES"); do echo "NodeName=$(node "$i") Name=gpu File=$DIR/dev/nvidia[0-$((GPUS - 1))]"; done
  } > "$tmp.gres"
  local changed=0
  cmp -s "$tmp" "$CONF" || { mv "$tmp" "$CONF"; changed=1; }
  cmp -s "$tmp.gres" "$ETC/gres.conf" || { mv "$tmp.gres" "$ETC/gres.conf"; changed=1; }
  rm -f "$tmp" "$tmp.gres"
  chmod 644 "$CONF" "$ETC/gres.conf"
  if [ -n "$LUA" ]; then
    [ -f "$LUA" ] || die "job_submit.lua not found: $LUA"
    cmp -s "$LUA" "$ETC/job_submit.lua" || { cp "$LUA" "$ETC/job_submit.lua"; changed=1; }
  elif [ -e "$ETC/job_submit.lua" ] && grep -q shockslurm "$ETC/job_submit.lua"; then
    rm -f "$ETC/job_submit.lua"; changed=1
  fi
  for i in $(seq "$NODES"); do mkdir -p "$DIR/spool/$(node "$i")"; done
  echo $changed
}

nodes_ready() {
  local n; n=$(sinfo -h -N -t idle,mixed,allocated,completing -o '%N' 2>/dev/null | sort -u | wc -l)
  [ "$n" -ge "$NODES" ]
}

start_slurm() {
  if ! alive "$DIR/slurmctld.pid"; then
    if scontrol ping 2>/dev/null | grep -q 'is UP'; then
      die "another slurmctld answers (not started by this script with SHOCK_SLURM_DIR=$DIR); stop it first"
    fi
    slurmctld
    for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.1; done
    scontrol ping 2>/dev/null | grep -q 'is UP' || { tail -20 "$DIR/log/slurmctld.log" >&2; die "slurmctld did not answer"; }
  fi
  for i in $(seq "$NODES"); do
    alive "$DIR/slurmd-$(node "$i").pid" || slurmd -N "$(node "$i")"
  done
  for _ in $(seq 50); do nodes_ready && return 0; sleep 0.2; done
  local bad; bad=$(sinfo -h -N -t drain,down,fail -o '%N' | sort -u | paste -sd, -)
  [ -n "$bad" ] && scontrol update NodeName="$bad" State=RESUME || true
  for _ in $(seq 150); do nodes_ready && return 0; sleep 0.2; done
  sinfo -N -o '%N %T %E' >&2; die "nodes did not become ready"
}

stop_pids() { # TERM every daemon named by the pid files, wait, then KILL the stubborn ones
  local f p pids=""
  for f in "$@"; do [ -f "$f" ] && p=$(cat "$f") && kill "$p" 2>/dev/null && pids="$pids $p"; done
  for _ in $(seq 100); do
    local left=""
    for p in $pids; do kill -0 "$p" 2>/dev/null && [ "$(ps -o stat= -p "$p" | cut -c1)" != Z ] && left="$left $p"; done
    [ -z "$left" ] && break; sleep 0.1
  done
  for p in $pids; do kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null || true; done
  rm -f "$@"
}

cancel_all() { # no job step may outlive its slurmd
  alive "$DIR/slurmctld.pid" || return 0
  local ids; ids=$(squeue -h -t PD,R,S,CG,CF -o %i 2>/dev/null | tr '\n' ' ')
  [ -n "${ids// /}" ] || return 0
  # shellcheck disable=SC2086
  scancel $ids 2>/dev/null || true
  for _ in $(seq $(( (KILLWAIT + 10) * 5 ))); do
    [ -z "$(squeue -h -t R,S,CG,CF -o %i 2>/dev/null)" ] && break; sleep 0.2
  done
  for _ in $(seq 50); do pgrep -x slurmstepd >/dev/null || break; sleep 0.1; done
}

do_stop() {
  cancel_all
  stop_pids "$DIR"/slurmd-*.pid "$DIR/slurmctld.pid"
  if [ -f "$DIR/munged.pid" ]; then stop_pids "$DIR/munged.pid"; rm -f /run/munge/munged.pid; fi
  say "stopped"
}

kill_orphan_steps() { # job scripts (and their process groups) left by a killed slurmstepd
  # only batch scripts of this root's spool (not another cluster's chroot or container, which
  # may share the path), never this script's own group or init's; a script that `exec`ed
  # another program no longer names the spool and is missed
  local p g own groups=""
  own=$(ps -o pgid= -p $$ | tr -d ' ')
  for p in $(pgrep -f -- "^/bin/(ba)?sh $DIR/spool/[^ ]+/slurm_script" || true); do
    [ /proc/$p/root -ef / ] || continue
    g=$(ps -o pgid= -p "$p" | tr -d ' ') || continue
    [ -n "$g" ] && [ "$g" -gt 1 ] && [ "$g" != "$own" ] && groups="$groups $g"
  done
  [ -n "$groups" ] || return 0
  say "killing the job scripts of a cluster that was killed, not stopped (process groups$groups)"
  for g in $groups; do kill -9 -- "-$g" 2>/dev/null || true; done
}

cancel_recovered() { # the jobs slurmctld recovered from a cluster that was killed, not stopped
  local ids; ids=$(squeue -h -o %i 2>/dev/null | sort -n | paste -sd' ' -) || ids=""
  [ -n "$ids" ] || return 0
  say "cancelling jobs $ids, recovered from a cluster that was killed, not stopped"
  cancel_all
}

do_start() {
  install_packages
  start_munge
  local changed; changed=$(write_config)
  if [ "$changed" = 1 ] && alive "$DIR/slurmctld.pid"; then
    say "configuration changed: restarting the Slurm daemons"
    cancel_all
    stop_pids "$DIR"/slurmd-*.pid "$DIR/slurmctld.pid"
  fi
  local fresh=0
  alive "$DIR/slurmctld.pid" || fresh=1
  [ "$fresh" = 0 ] || kill_orphan_steps
  start_slurm
  [ "$fresh" = 0 ] || cancel_recovered
  say "ready: $NODES nodes x $GPUS GPUs on 127.0.0.1, state in $DIR ($(sinfo -V))"
}

mkdir -p "$DIR"
case "${1:-start}" in
  start) do_start ;;
  install) install_packages ;;
  stop) do_stop ;;
  clear) cancel_all; say "queue empty" ;;
  reset)
    do_stop
    find "$DIR/state" -mindepth 1 -delete 2>/dev/null || true
    rm -rf "$DIR/log" "$DIR/spool"
    do_start ;;
  status)
    for f in "$DIR"/*.pid; do [ -e "$f" ] && printf '%-20s %s\n' "$(basename "$f")" "$(alive "$f" && echo alive || echo dead)"; done
    sinfo -N -o '%N %T %G' 2>&1 || true
    squeue 2>&1 || true ;;
  *) die "usage: $0 [start|stop|clear|status|reset|install]" ;;
esac
