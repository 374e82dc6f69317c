#!/usr/bin/env bash
# Run the molecule scenarios one after another (each stands up its own lab cluster).
# MOLECULE_SCENARIOS="tp3" limits the set; every scenario's lab is removed even on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH" ANSIBLE_CONFIG="$PWD/ansible.cfg"
scenarios=${MOLECULE_SCENARIOS:-"tp2 tp3"}
rc=0
for s in $scenarios; do
  start=$(date +%s)
  echo "=== molecule test -s $s"
  if ! molecule test -s "$s"; then
    echo "=== molecule $s FAILED"
    rc=1
  fi
  sparkfleet lab down --name "molecule-$s" >/dev/null 2>&1 || true
  echo "=== molecule $s: $(( $(date +%s) - start )) s"
done
exit $rc
