#!/usr/bin/env bash
# Single-node SLURM for tests/launch/test_slurm_real.py: installs Debian's slurm-wlm pieces + munge (apt), writes a minimal
# slurm.conf (this host, all its CPUs, no cgroups, no accounting) and starts munged, slurmctld and slurmd as root
# without systemd. Partition `debug` (default) is this host; partition `pair` is two more slurmds on this host,
# halsift-n1 and halsift-n2 (1 CPU each, names that do not resolve, like clusters whose NodeAddr differs from the
# name), so a 2-node srun + torchrun job can run on one machine. Idempotent: exits 0 at once when a SLURM already answers. Exits non-zero, with a message, when it
# cannot bring one up (not root, no apt, install or start failed) -- CI treats that as "the SLURM test skips".
#
#   .ci/slurm-up.sh          install if needed, start, check `srun hostname`
#   .ci/slurm-up.sh stop     stop the daemons this script started
#
# State (spool, logs, pid files) lives under $HALSIFT_SLURM_DIR (default /var/tmp/halsift-slurm).
set -uo pipefail

DIR=${HALSIFT_SLURM_DIR:-/var/tmp/halsift-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# written by halsift .ci/slurm-up.sh"
HOST=$(hostname -s)

die() { echo "slurm-up: $*" >&2; exit 1; }
log() { echo "slurm-up: $*" >&2; }

if [ "${1:-}" = "stop" ]; then
    for pidf in "$DIR"/slurmd-*.pid "$DIR/slurmctld.pid" /run/munge/munged.pid; do
        pid=$(cat "$pidf" 2>/dev/null) || continue
        if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then log "stopped $(basename "$pidf" .pid) ($pid)"; fi
    done
    exit 0
fi

up() {  # a partition with a usable node answers, and a one-task step runs
    timeout 5 sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated|completing)' &&
        timeout 30 srun -N1 -n1 -t 1 true >/dev/null 2>&1
}

if command -v sinfo >/dev/null && up; then
    log "SLURM already up ($(sinfo -h -o '%P %D %T' | head -n 1))"
    exit 0
fi

[ "$(id -u)" = 0 ] || die "needs root to install/start SLURM (and no working SLURM answers)"

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
        || ! command -v munged >/dev/null; then
    command -v apt-get >/dev/null || die "no apt-get: install slurmctld slurmd slurm-client munge yourself"
    log "installing slurmctld slurmd slurm-client munge (apt)"
    export DEBIAN_FRONTEND=noninteractive
    timeout 300 apt-get update -qq >/dev/null || die "apt-get update failed"
    timeout 600 apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null \
        || die "apt-get install failed"
fi

# munge: the package creates /etc/munge/munge.key; /run/munge normally comes from systemd's tmpfiles.
[ -s /etc/munge/munge.key ] || { mkdir -p /etc/munge && dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 \
    2>/dev/null && chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key; } \
    || die "cannot create /etc/munge/munge.key"
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    mkdir -p /run/munge /var/log/munge /var/lib/munge && chown munge:munge /run/munge /var/log/munge /var/lib/munge
    chmod 755 /run/munge
    runuser -u munge -- munged || die "munged did not start (see /var/log/munge/munged.log)"
    for _ in $(seq 20); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.25; done
    munge -n | unmunge >/dev/null || die "munge does not answer"
fi

if [ -e "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    die "$CONF exists and was not written by this script, but SLURM does not answer: start it yourself"
fi
mkdir -p "$DIR/ctld" "$DIR/d" "$DIR/log" /etc/slurm
cat > "$CONF" <<EOF
$MARK: single node, CPUs only, no cgroups, no accounting.
ClusterName=halsift
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/d/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=600
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
NodeName=halsift-n1 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=6821 CPUs=1 State=UNKNOWN
NodeName=halsift-n2 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=6822 CPUs=1 State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
PartitionName=pair Nodes=halsift-n1,halsift-n2 MaxTime=INFINITE State=UP
EOF
mkdir -p "$DIR/d/$HOST" "$DIR/d/halsift-n1" "$DIR/d/halsift-n2"

pidalive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
pidalive "$DIR/slurmctld.pid" || slurmctld -i || die "slurmctld did not start (see $DIR/log/slurmctld.log)"
pidalive "$DIR/slurmd-$HOST.pid" || slurmd -N "$HOST" || die "slurmd did not start (see $DIR/log/slurmd-$HOST.log)"
for n in halsift-n1 halsift-n2; do  # best effort: only the 2-node test needs them
    pidalive "$DIR/slurmd-$n.pid" || slurmd -N "$n" || log "slurmd $n did not start: the 2-node test will skip"
done

for _ in $(seq 60); do
    state=$(timeout 5 sinfo -h -n "$HOST" -o '%T' 2>/dev/null)
    case "$state" in idle*|mixed*|allocated*) break ;; drain*|down*) scontrol update nodename="$HOST" state=resume ;; esac
    sleep 0.5
done
up || die "SLURM started but \`srun true\` does not run (node state: ${state:-none}; logs in $DIR/log)"
log "SLURM up: $(sinfo -h -o '%P:%D nodes %T' | tr '\n' ' ')"
