#!/usr/bin/env bash
# Stop the local cluster started by slurm/local/start.sh: cancel its jobs (slurmstepd outlives slurmd, so
# jobs go first), then end slurmd, slurmctld and munged by the PIDs recorded under STATE_DIR.
#
#   slurm/local/stop.sh [STATE_DIR] [--purge]    # --purge also deletes STATE_DIR
set -uo pipefail

STATE=${1:-${LAUNCHER_SLURM_DIR:-/tmp/launcher-slurm}}
PURGE=${2:-}
export SLURM_CONF=$STATE/slurm.conf
log() { echo "slurm/local: $*" >&2; }

stop_pid_file() {  # stop_pid_file FILE: SIGTERM, wait up to 10 s, then SIGKILL
    local file=$1 pid
    [ -f "$file" ] || return 0
    pid=$(cat "$file")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    fi
    rm -f "$file"
}

if [ -f "$SLURM_CONF" ] && scontrol ping >/dev/null 2>&1; then
    if [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
        scancel --full --signal=KILL $(squeue -h -o %i) 2>/dev/null
        scancel $(squeue -h -o %i) 2>/dev/null
        for _ in $(seq 50); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
    fi
fi
for f in "$STATE"/run/slurmd-*.pid; do [ -e "$f" ] && stop_pid_file "$f"; done
stop_pid_file "$STATE/run/slurmctld.pid"
stop_pid_file "$STATE/run/munged.pid"
log "stopped ($STATE)"
if [ "$PURGE" = "--purge" ]; then rm -rf "$STATE"; fi
