#!/usr/bin/env bash
# Stop what scripts/slurm_ci_up.sh started, by PID file only (never by name). Same BASE as for up.
BASE=${BASE:-/tmp/eaglewatch-slurm}
case "$BASE" in /*) ;; *) BASE="$(pwd)/$BASE" ;; esac
rm -f "$BASE/env"
pids=()
for d in slurmd slurmctld slurmdbd munged mariadbd; do
  f="$BASE/run/$d.pid"; [ -s "$f" ] || continue
  p=$(cat "$f"); kill "$p" 2>/dev/null && pids+=("$p")
done
for p in "${pids[@]}"; do for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done; done
