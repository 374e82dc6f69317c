#!/usr/bin/env bash
# `make test`: the lab images first (debootstrap + docker import, skipped when cached), then the lab
# tests (labctl, then the molecule scenarios) in the foreground, with lint and the unit tests beside
# them. Lint and unit are CPU work; the lab tests spend much of their time waiting (boots, restarts,
# readiness), which they fill. Their output goes to .cache/checks.log, shown at the end; one line
# says when they finish. The exit code is non-zero if either side failed; both always run to the end.
#   TEST_PARALLEL=0   lint and unit first, then the lab tests (one thing at a time)
set -uo pipefail
cd "$(dirname "$0")/.." || exit
mkdir -p .cache
rm -f .cache/checks.rc
make=(make --no-print-directory)
log=.cache/checks.log

# other labs running on this machine (a dev lab left up) take the CPU the tests' labs need: say so
others=$(docker ps --format '{{.Names}}' 2>/dev/null | sed -n 's/^sparkfleet-lab-\(.*\)-spark[0-9]*$/\1/p' | sort -u)
if [ -n "$others" ]; then
  echo "=== note: other labs are running here and will slow the tests down: ${others//$'\n'/ }" \
    "(sparkfleet lab down --name NAME removes one)"
fi

if [ "${TEST_PARALLEL:-1}" = 0 ]; then
  "${make[@]}" checks && "${make[@]}" images labctl molecule
  exit $?
fi

# the image build is mostly downloads and unpacking: lint and unit run beside it too
(
  start=$(date +%s)
  if "${make[@]}" checks > "$log" 2>&1; then rc=0; else rc=$?; fi
  echo "$rc" > .cache/checks.rc
  if [ "$rc" = 0 ]; then word=passed; else word="FAILED (exit $rc)"; fi
  echo "=== lint + unit tests: $word in $(( $(date +%s) - start )) s (output at the end)"
) &
checks=$!

lab_rc=0
"${make[@]}" images labctl molecule || lab_rc=$?
wait "$checks"
checks_rc=$(cat .cache/checks.rc 2>/dev/null || echo missing)

echo "=== lint + unit tests output (.cache/checks.log):"
if [ "$checks_rc" = 0 ]; then tail -n 15 "$log"; else cat "$log"; fi
# what failed in each failed molecule scenario, last: CI shows only the end of this output
failed_logs=()
for rc_file in .cache/molecule/*.rc; do
  [ -e "$rc_file" ] && [ "$(cat "$rc_file")" != 0 ] && [ -f "${rc_file%.rc}.log" ] && failed_logs+=("${rc_file%.rc}.log")
done
if [ "$lab_rc" != 0 ] && [ "${#failed_logs[@]}" -gt 0 ]; then
  echo "=== what failed (scripts/failure-digest.sh):"
  scripts/failure-digest.sh "${failed_logs[@]}"
fi
echo "=== lint + unit: $([ "$checks_rc" = 0 ] && echo passed || echo "FAILED ($checks_rc)");" \
  "lab tests: $([ "$lab_rc" = 0 ] && echo passed || echo "FAILED ($lab_rc)")"
[ "$checks_rc" = 0 ] && [ "$lab_rc" = 0 ]
