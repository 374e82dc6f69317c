#!/usr/bin/env bash
# Run the molecule scenarios (each stands up its own lab cluster: own name, networks, fact cache).
# By default they run side by side, every line prefixed with its scenario: much of a scenario's
# time is spent waiting (boots, restarts, readiness), which the other one fills. tp3 starts first
# (the longer one); tp2 ends long before tp3's fault tests, which run last in tp3's verify.
#   MOLECULE_SCENARIOS="tp3"   limits the set
#   MOLECULE_PARALLEL=0        one after the other
# Every scenario's lab is removed, also on failure; the exit code is 1 if any scenario failed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH" ANSIBLE_CONFIG="$PWD/ansible.cfg"
scenarios=${MOLECULE_SCENARIOS:-"tp3 tp2"}
parallel=${MOLECULE_PARALLEL:-1}
logs=.cache/molecule
mkdir -p "$logs"

one() {  # one scenario; its result goes to $logs/$s.rc and its time to $logs/$s.s
  local s=$1 start rc=0
  start=$(date +%s)
  echo "=== molecule test -s $s"
  molecule test -s "$s" || rc=$?
  sparkfleet lab down --name "molecule-$s" >/dev/null 2>&1 || true
  echo "$rc" > "$logs/$s.rc"
  echo "$(( $(date +%s) - start ))" > "$logs/$s.s"
}

rm -f "$logs"/*.rc "$logs"/*.s
pids=()
for s in $scenarios; do
  if [ "$parallel" = 0 ]; then
    one "$s"
  else
    # line-buffered prefix; sed -u so a line shows when it is written
    ( one "$s" 2>&1 | sed -u "s/^/[$s] /" ) &
    pids+=($!)
    sleep 5  # the first lab takes its slot (networks) before the next one looks for a free one
  fi
done
for pid in "${pids[@]}"; do wait "$pid" || true; done

rc=0
for s in $scenarios; do
  r=$(cat "$logs/$s.rc" 2>/dev/null || echo "missing")
  t=$(cat "$logs/$s.s" 2>/dev/null || echo "?")
  if [ "$r" = 0 ]; then
    echo "=== molecule $s: passed in $t s"
  else
    echo "=== molecule $s: FAILED (exit $r) after $t s"
    rc=1
  fi
done
exit $rc
