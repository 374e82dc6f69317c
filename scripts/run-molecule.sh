#!/usr/bin/env bash
# Run the molecule scenarios, each with its own lab (own name, networks, fact cache): the cluster
# scenarios tp3 and tp2 (site.yml end to end, the fault tests) and one scenario per role
# (molecule/<role>/: a small lab of one or two nodes, that role alone), and vm (the VM lab: two qemu guests).
# By default in three lanes side by side, every line prefixed with its scenario: tp3 in the first (the
# longest), tp2 in the second, the role scenarios and then vm one after the other in the third. Much of a
# scenario's time is spent waiting (boots, restarts, readiness), which the other lanes fill; the role
# scenarios and tp2 end early, so tp3's long fault tests run on an idle machine.
#   MOLECULE_SCENARIOS="tp3 earlyoom"   limits the set (the first one gets the first lane)
#   MOLECULE_PARALLEL=0                 one after the other
#   SPARKFLEET_LAB_PREFIX=xyz           lab names xyz-<scenario> (default molecule)
# Every scenario's lab is removed, also on failure; the exit code is 1 if any scenario failed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH" ANSIBLE_CONFIG="$PWD/ansible.cfg"
# the role scenarios that build the engine image (its build in the nodes' nested Docker is the heaviest step of
# any scenario) go last, after tp3 and tp2 have built theirs, so that the builds do not all run at once; vm, the
# VM lab's scenario (qemu guests, README "The VM lab"), after them: the role lane ends well before tp3's, and
# the emulated CPUs then take less from the others' converges. vm_arm64 (one emulated arm64 guest) is never in the
# default set: `make test-vm-arm64` runs it alone (MOLECULE_SCENARIOS=vm_arm64)
roles=$(for d in molecule/*/molecule.yml; do
  s=$(basename "$(dirname "$d")")
  case $s in tp2|tp3|engine_image|engine_service|vm|vm_arm64) ;; *) printf '%s ' "$s" ;; esac
done)
roles="$roles engine_image engine_service vm"
scenarios=${MOLECULE_SCENARIOS:-"tp3 tp2 $roles"}
parallel=${MOLECULE_PARALLEL:-1}
prefix=${SPARKFLEET_LAB_PREFIX:-molecule}
logs=.cache/molecule
mkdir -p "$logs"

one() {  # one scenario; its result goes to $logs/$s.rc and its time to $logs/$s.s
  local s=$1 start rc=0
  start=$(date +%s)
  echo "=== molecule test -s $s"
  molecule test -s "$s" || rc=$?
  sparkfleet lab down --name "$prefix-$s" >/dev/null 2>&1 || true
  echo "$rc" > "$logs/$s.rc"
  echo "$(( $(date +%s) - start ))" > "$logs/$s.s"
}

lane() {  # scenarios one after the other, each line prefixed with its scenario
  local s
  for s in "$@"; do
    # line-buffered prefix; sed -u so a line shows when it is written
    one "$s" 2>&1 | sed -u "s/^/[$s] /"
  done
}

rm -f "$logs"/*.rc "$logs"/*.s
read -r -a all <<< "$scenarios"
if [ "$parallel" = 0 ]; then
  for s in "${all[@]}"; do one "$s"; done
else
  lane "${all[0]}" &
  first=$!
  second=""
  if [ "${#all[@]}" -gt 1 ]; then
    sleep 5  # the first lab takes its slot (networks) before the next one looks for a free one
    lane "${all[1]}" &
    second=$!
  fi
  if [ "${#all[@]}" -gt 2 ]; then
    sleep 5
    lane "${all[@]:2}" || true
  fi
  wait "$first" || true
  [ -z "$second" ] || wait "$second" || true
fi

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
