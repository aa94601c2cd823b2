#!/usr/bin/env bash
# Disposable single-node Slurm for CI and for eaglewatch's Slurm executor tests:
# munge + slurmctld + slurmd (+ optional slurmdbd/MariaDB for sacct). No systemd; every file lives under $BASE.
# Installs slurm-wlm with apt-get when sbatch/slurmd/munged are missing (needs root or passwordless sudo).
# Tested: Debian 12, slurm-wlm 22.05.8, munge 0.5.15. Adapted from ../shared/reference/slurm/slurm_ci_up.sh.
#
# Usage: BASE=<scratch dir> [ACCOUNTING=1] [FAKE_GPUS=N] bash scripts/slurm_ci_up.sh
#        then: . $BASE/env   (exports SLURM_CONF and EAGLEWATCH_SLURM=1; the slurm tests run only then)
# Stop with: BASE=<same dir> bash scripts/slurm_ci_down.sh
# Running it again while the cluster at $BASE is up is a no-op (prints "slurm ready").
set -euo pipefail
BASE=${BASE:-/tmp/eaglewatch-slurm}
case "$BASE" in /*) ;; *) BASE="$(pwd)/$BASE" ;; esac   # slurm.conf needs absolute paths
CTLD_PORT=${CTLD_PORT:-6817}; SLURMD_PORT=${SLURMD_PORT:-6818}; DBD_PORT=${DBD_PORT:-6819}; MYSQL_PORT=${MYSQL_PORT:-3307}
NODE=${NODE:-cinode}                 # fixed node name, independent of `hostname`
ACCOUNTING=${ACCOUNTING:-0}
FAKE_GPUS=${FAKE_GPUS:-0}            # >0: advertise N fake GPUs (symlinks to /dev/null) -> real CUDA_VISIBLE_DEVICES
ME=$(id -un)

# --- install when missing -------------------------------------------------------------------------
need=()
command -v sbatch >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 && command -v slurmctld >/dev/null 2>&1 \
  || need+=(slurm-wlm)
command -v munged >/dev/null 2>&1 && command -v mungekey >/dev/null 2>&1 || need+=(munge)
if [ "$ACCOUNTING" = 1 ]; then
  command -v slurmdbd >/dev/null 2>&1 || need+=(slurmdbd)
  command -v mariadbd >/dev/null 2>&1 || need+=(mariadb-server)
fi
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  echo "slurm_ci_up: installing ${need[*]} with apt-get" >&2
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

write_env() {
  printf 'export SLURM_CONF=%s\nexport EAGLEWATCH_SLURM=1\n' "$BASE/etc/slurm.conf" > "$BASE/env"
}

# --- already up? ----------------------------------------------------------------------------------
if [ -f "$BASE/etc/slurm.conf" ] && [ -s "$BASE/run/slurmctld.pid" ] && kill -0 "$(cat "$BASE/run/slurmctld.pid")" 2>/dev/null \
   && SLURM_CONF="$BASE/etc/slurm.conf" sinfo -h -n "$NODE" -o %T 2>/dev/null | grep -Eq '^(idle|mixed|allocated)'; then
  write_env; echo "slurm ready (already running): . $BASE/env"; exit 0
fi

# a half-started cluster from an earlier try: stop it (by pid file) before starting afresh
if ls "$BASE"/run/*.pid >/dev/null 2>&1; then BASE="$BASE" bash "$(dirname "$0")/slurm_ci_down.sh"; rm -f "$BASE"/run/*.pid; fi
mkdir -p "$BASE"/{etc,run,log,spool/ctld,spool/d,munge}
chmod 700 "$BASE/munge"

# --- munge: private key + private socket --------------------------------------------------------
[ -f "$BASE/munge/munge.key" ] || mungekey -c -k "$BASE/munge/munge.key"
munged --key-file="$BASE/munge/munge.key" --socket="$BASE/run/munge.socket" \
       --pid-file="$BASE/run/munged.pid" --log-file="$BASE/log/munged.log" \
       --seed-file="$BASE/munge/munged.seed"

# --- optional accounting: MariaDB + slurmdbd ----------------------------------------------------
ACCT_LINES="AccountingStorageType=accounting_storage/none"
if [ "$ACCOUNTING" = 1 ]; then
  if [ ! -d "$BASE/mysql/data/mysql" ]; then
    mkdir -p "$BASE/mysql"
    mariadb-install-db --user="$ME" --datadir="$BASE/mysql/data" --skip-test-db \
        --auth-root-authentication-method=socket > "$BASE/log/mariadb-install.log" 2>&1
  fi
  mariadbd --no-defaults --user="$ME" --datadir="$BASE/mysql/data" --socket="$BASE/run/mysqld.sock" \
      --port="$MYSQL_PORT" --bind-address=127.0.0.1 --pid-file="$BASE/run/mariadbd.pid" \
      --log-error="$BASE/log/mariadbd.log" --innodb-buffer-pool-size=64M --skip-name-resolve \
      </dev/null >/dev/null 2>&1 &
  for _ in $(seq 1 300); do mariadb --no-defaults -S "$BASE/run/mysqld.sock" -u"$ME" -e 'select 1' >/dev/null 2>&1 && break; sleep 0.1; done
  mariadb --no-defaults -S "$BASE/run/mysqld.sock" -u"$ME" -e "
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  cat > "$BASE/etc/slurmdbd.conf" <<CONF
AuthType=auth/munge
AuthInfo=socket=$BASE/run/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=$ME
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$MYSQL_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
PidFile=$BASE/run/slurmdbd.pid
LogFile=$BASE/log/slurmdbd.log
CONF
  chmod 600 "$BASE/etc/slurmdbd.conf"          # slurmdbd refuses a group/world-readable file
  SLURM_CONF="$BASE/etc/slurm.conf" slurmdbd    # reads slurmdbd.conf next to $SLURM_CONF
  for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/$DBD_PORT) 2>/dev/null && break; sleep 0.1; done
  # AccountingStoragePass = munge socket used for the slurmctld<->slurmdbd connection (AuthInfo is NOT used there)
  ACCT_LINES="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$BASE/run/munge.socket"
fi

# --- optional fake GPUs ---------------------------------------------------------------------------
GRES_NODE=""; GRES_LINE=""
if [ "$FAKE_GPUS" -gt 0 ]; then
  mkdir -p "$BASE/fakegpu"
  for i in $(seq 0 $((FAKE_GPUS-1))); do ln -sfn /dev/null "$BASE/fakegpu/nvidia$i"; done  # must be a char device
  echo "NodeName=$NODE Name=gpu File=$BASE/fakegpu/nvidia[0-$((FAKE_GPUS-1))]" > "$BASE/etc/gres.conf"
  GRES_NODE="Gres=gpu:$FAKE_GPUS"; GRES_LINE="GresTypes=gpu"
fi

# --- slurm.conf sized from this host (slurmd -C) -------------------------------------------------
read -r CPUS MEM <<<"$(slurmd -C | sed -n 's/.*CPUs=\([0-9]*\).*RealMemory=\([0-9]*\).*/\1 \2/p')"
MEM=$(( MEM > 2048 ? MEM - 1024 : MEM ))
cat > "$BASE/etc/slurm.conf" <<CONF
ClusterName=ci
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=$ME
SlurmdUser=$ME
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$BASE/run/munge.socket
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
StateSaveLocation=$BASE/spool/ctld
SlurmdSpoolDir=$BASE/spool/d
SlurmctldPidFile=$BASE/run/slurmctld.pid
SlurmdPidFile=$BASE/run/slurmd.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
$ACCT_LINES
JobCompType=jobcomp/filetxt
JobCompLoc=$BASE/log/jobcomp.txt
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
ReturnToService=2
MinJobAge=600
$GRES_LINE
NodeName=$NODE NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM $GRES_NODE State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$BASE/etc/slurm.conf"
slurmctld
slurmd -N "$NODE"
for _ in $(seq 1 300); do
  sinfo -h -n "$NODE" -o %T 2>/dev/null | grep -q '^idle' && { write_env; echo "slurm ready: . $BASE/env  (SLURM_CONF=$SLURM_CONF)"; exit 0; }
  sleep 0.1
done
echo "slurm did not become ready" >&2; tail -n 30 "$BASE"/log/*.log >&2; exit 1
