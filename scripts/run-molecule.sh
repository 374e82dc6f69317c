#!/usr/bin/env bash
# Run the molecule scenarios: the cluster scenarios tp3 and tp2 (site.yml end to end, the fault tests), each
# on a lab of its own; the walk: the 2-node role scenarios one after the other on one shared two-node lab
# (molecule/default makes it and removes it; each keeps its converge, idempotence, check and verify); the
# 1-node role scenarios (earlyoom, gpu_clocks, host_tuning), each on its own one-node lab; and vm (the VM lab:
# two qemu guests). By default in three lanes side by side, every line prefixed with its scenario (the walk's
# with "walk"): tp3 in the first (the longest), tp2 in the second, the 1-node roles, the walk and then vm
# one after the other in the third. Much of a scenario's time is spent waiting (boots, restarts, readiness),
# which the other lanes fill.
#   MOLECULE_SCENARIOS="tp3 earlyoom"   limits the set (the first one gets the first lane); naming a step of
#                                       the walk (e.g. ssh_trust) runs the walk from its start up to that
#                                       step, since each step stands on what the steps before it made
#   MOLECULE_PARALLEL=0                 one after the other
#   SPARKFLEET_LAB_PREFIX=xyz           lab names xyz-<scenario>, the walk's xyz-pair (default molecule)
# Every scenario's lab is removed, also on failure; the exit code is 1 if any scenario failed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH" ANSIBLE_CONFIG="$PWD/ansible.cfg"
# The walk's steps, in site.yml's order (molecule/default). The walk goes after the 1-node roles, so that its
# engine image build (in the nodes' nested Docker, the heaviest step of any scenario) comes after tp3 and tp2
# have built theirs; vm, the VM lab's scenario (qemu guests, README "The VM lab"), after the walk. vm_arm64
# (one emulated arm64 guest) is never in the default set: `make test-vm-arm64` runs it alone
# (MOLECULE_SCENARIOS=vm_arm64).
walk=(cluster_plan preflight network_links ssh_trust model_weights engine_image engine_service)
in_walk() { local w; for w in "${walk[@]}"; do [ "$w" = "$1" ] && return 0; done; return 1; }
singles=$(for d in molecule/*/molecule.yml; do
  s=$(basename "$(dirname "$d")")
  case $s in tp2|tp3|vm|vm_arm64|default) ;; *) in_walk "$s" || printf '%s ' "$s" ;; esac
done)
requested=${MOLECULE_SCENARIOS:-"tp3 tp2 $singles walk vm"}
# the units to run: a walk step named alone becomes the walk up to the last step named
walk_to=-1
scenarios=""
for s in $requested; do
  if [ "$s" = walk ] || in_walk "$s"; then
    for i in "${!walk[@]}"; do
      if [ "$s" = walk ] || [ "${walk[$i]}" = "$s" ]; then [ "$i" -le "$walk_to" ] || walk_to=$i; fi
    done
    case " $scenarios " in *" walk "*) ;; *) scenarios="$scenarios walk" ;; esac
  else
    scenarios="$scenarios $s"
  fi
done
[ "$walk_to" -lt 0 ] || [ "$walk_to" = $(( ${#walk[@]} - 1 )) ] ||
  echo "=== the walk up to ${walk[$walk_to]}: ${walk[*]:0:$(( walk_to + 1 ))}"
parallel=${MOLECULE_PARALLEL:-1}
prefix=${SPARKFLEET_LAB_PREFIX:-molecule}
logs=.cache/molecule
mkdir -p "$logs"

one() {  # one scenario (or the walk); its result goes to $logs/$s.rc and its time to $logs/$s.s
  local s=$1 start rc=0 lab args=() w
  start=$(date +%s)
  if [ "$s" = walk ]; then
    lab=$prefix-pair
    for w in "${walk[@]:0:$(( walk_to + 1 ))}"; do args+=(-s "$w"); done
    echo "=== molecule test ${args[*]} (the walk, on one lab: molecule/default)"
    # molecule/default's destroy: a lab (and molecule's state of it) left by an interrupted run goes first
    molecule destroy -s default >/dev/null 2>&1 || true
    molecule test "${args[@]}" || rc=$?
  else
    lab=$prefix-$s
    echo "=== molecule test -s $s"
    molecule test -s "$s" || rc=$?
  fi
  sparkfleet lab down --name "$lab" >/dev/null 2>&1 || true
  echo "$rc" > "$logs/$s.rc"
  echo "$(( $(date +%s) - start ))" > "$logs/$s.s"
}

lane() {  # scenarios one after the other, each line prefixed with its scenario
  local s
  for s in "$@"; do
    # line-buffered prefix; sed -u so a line shows when it is written. $logs/$s.log keeps the scenario's own
    # output for scripts/failure-digest.sh (CI removes the labs, and shows only the end of its output)
    one "$s" 2>&1 | tee "$logs/$s.log" | sed -u "s/^/[$s] /"
  done
}

rm -f "$logs"/*.rc "$logs"/*.s "$logs"/*.log
read -r -a all <<< "$scenarios"
if [ "$parallel" = 0 ]; then
  for s in "${all[@]}"; do one "$s" 2>&1 | tee "$logs/$s.log"; done
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
