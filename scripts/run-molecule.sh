#!/usr/bin/env bash
# Run the molecule scenarios: the cluster scenarios tp3 and tp2 (site.yml end to end, the fault tests), each
# on a lab of its own; the walk: the 2-node role scenarios one after the other on one shared two-node lab
# (molecule/default makes it and removes it; each keeps its converge, idempotence, check and verify); the
# 1-node role scenarios (earlyoom, gpu_clocks, host_tuning), each on its own one-node lab; and vm (the VM lab:
# two qemu guests). By default in three lanes side by side, every line prefixed with its scenario (the walk's
# with "walk"): tp3 in the first (the longest), tp2 and then the 1-node roles in the second, vm and then the
# walk in the third (below: why). Much of a scenario's time is spent waiting (boots, restarts, readiness),
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
# The walk's steps, in site.yml's order (molecule/default). vm_arm64 (one emulated arm64 guest) is never in the
# default set: `make test-vm-arm64` runs it alone (MOLECULE_SCENARIOS=vm_arm64).
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
# The lanes. The whole set: tp3 alone (the longest); tp2, then the 1-node roles; vm, then the walk. Measured in
# the rehearsals (README "What `make test` runs"), tp3 takes about 3600 s, tp2 3150, the 1-node roles 600, vm 2800
# and the walk 850: so the three lanes come out about even, where a third lane of the 1-node roles, the walk and
# vm (4250 s) ended every run alone, its last 11 minutes on one core. vm goes first in its lane and the walk
# last, so that the walk's engine image build (the heaviest step of any scenario) comes after tp3's and tp2's.
# A set named in MOLECULE_SCENARIOS: the first in one lane, the second in another, the rest in a third.
if [ -z "${MOLECULE_SCENARIOS:-}" ]; then
  lanes=("tp3" "tp2 $singles" "vm walk")
else
  lanes=("${all[0]}")
  [ "${#all[@]}" -lt 2 ] || lanes+=("${all[1]}")
  [ "${#all[@]}" -lt 3 ] || lanes+=("${all[*]:2}")
fi
if [ "$parallel" = 0 ]; then
  for s in "${all[@]}"; do one "$s" 2>&1 | tee "$logs/$s.log"; done
else
  pids=()
  for spec in "${lanes[@]}"; do
    [ "${#pids[@]}" = 0 ] || sleep 5  # a lab takes its slot (networks) before the next one looks for a free one
    read -r -a members <<< "$spec"
    lane "${members[@]}" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || true; done
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
