#!/usr/bin/env bash
# Make this machine able to run the lab: Debian packages and a Docker engine that answers.
# Idempotent; installs only what is missing. Needs root (or sudo) for the first run.
set -euo pipefail

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
command -v rsync >/dev/null 2>&1 || need+=(rsync)
command -v git >/dev/null 2>&1 || need+=(git)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
if [ "${#need[@]}" -gt 0 ]; then
  echo "ensure-host: installing ${need[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
fi

if ! docker info >/dev/null 2>&1; then
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $SUDO systemctl start docker
  else
    echo "ensure-host: starting dockerd (log: /var/log/sparkfleet-dockerd.log)"
    # in a session of its own (setsid): a dockerd left in the caller's process group died with it when a job
    # runner stopped that group (a finished tool job), and took every running lab with it
    $SUDO sh -c 'setsid nohup dockerd >>/var/log/sparkfleet-dockerd.log 2>&1 </dev/null &'
  fi
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "ensure-host: dockerd did not answer within 60 s; see /var/log/sparkfleet-dockerd.log" >&2; exit 1; }
fi
