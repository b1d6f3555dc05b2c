#!/bin/bash
# Undoes the entrypoint's fake /proc/cgroups (cgroup v1) once systemd has
# started without the misc controller.
if [[ ! -f /sys/fs/cgroup/cgroup.controllers ]] && mountpoint -q /proc/cgroups 2>/dev/null; then
  umount /proc/cgroups || true
fi
exit 0
