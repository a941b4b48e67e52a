#!/bin/busybox sh
# The guest's PID 1: a minimal system (proc, sys, dev, tmpfs /run and /tmp, lo up), then
# /payload/run (by dash), then the result line the host looks for, then power-off. Host tools in
# /usr come before busybox's applets in PATH.
/bin/busybox --install -s /bin
# busybox's sh runs its own applets (its small `ip`) before anything in PATH: `sh` is the
# host's dash, so scripts reach the host tools.
ln -sf /usr/bin/dash /bin/sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export KPR_VM_GUEST=1 HOME=/tmp
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mkdir -p /run/netns /var
ln -s /run /var/run
ip link set lo up
# Loaded on the hosts these tests also run on (kpr-netns' labs need bridge netfilter);
# IPVS is not: what uses it must load it.
modprobe br_netfilter
stty -F /dev/ttyS1 raw -echo 2>/dev/null
# A payload that outlives the host's patience is killed with the guest: before that, the
# watchdog writes what every thread is doing, so the host's timeout error says where it hung.
# Its time is the guest's uptime (the host's clock started with qemu, a boot earlier).
watch_payload() {
  up=$(cut -d. -f1 /proc/uptime)
  [ "$up" -lt "$1" ] && sleep $(($1 - up))
  echo "KPR-VM: the payload still runs at $1 s of uptime; every thread, its state and its kernel stack:"
  for task in /proc/[0-9]*/task/[0-9]*; do
    cmdline=$(tr '\0' ' ' < "$task/cmdline" 2>/dev/null)
    [ -n "$cmdline" ] || continue # a kernel thread
    state=$(sed -n 's/^State:[[:space:]]*//p' "$task/status" 2>/dev/null)
    echo "KPR-VM: ${task#/proc/} $(cat "$task/comm" 2>/dev/null) [$state] wchan=$(cat "$task/wchan" 2>/dev/null): $cmdline"
    sed 's/^/KPR-VM:     /' "$task/stack" 2>/dev/null
  done
  echo "KPR-VM: end of the watchdog's report"
}
echo "KPR-VM: guest up: kernel $(uname -r), uptime $(cut -d' ' -f1 /proc/uptime) s"
watchdog=$(sed -n 's/.*kpr_vm\.watchdog=\([0-9][0-9]*\).*/\1/p' /proc/cmdline)
if [ -n "$watchdog" ]; then
  watch_payload "$watchdog" &
fi
(cd /payload && ./run)
rc=$?
echo "KPR-VM: RESULT rc=$rc uptime=$(cut -d' ' -f1 /proc/uptime) s"
sync
poweroff -f
