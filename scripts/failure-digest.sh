#!/usr/bin/env bash
# failure-digest.sh LOG...: what failed, from each molecule scenario's own log (.cache/molecule/<scenario>.log,
# written by scripts/run-molecule.sh): a task's failure with up to 24 lines of its result (not the command, its
# times or the *_lines copies; nothing when Ansible ignored it), a failed test's name, first error lines, place
# and summary line, molecule's own errors, the lab's errors; the last 40 such lines of each log.
# scripts/test-all.sh prints it for every failed scenario at the very end of its output, because CI removes the
# labs after a run and keeps only the end of what it printed.
set -uo pipefail
for log in "$@"; do
  echo "--- $(basename "$log" .log): what failed (the last lines that say so; the whole log: $log)"
  # colours and molecule's box drawing off
  sed -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' -e 's/^ *│ \{0,1\}//' "$log" | awk '
    function flush() { if (blk != "") print blk; blk = ""; n = 0; cont = 0 }
    # molecule folds a long line at its frame width, the rest indented by two spaces: a failed test summary
    # line is joined back (folds split words and test ids alike; joined without a space, the ids come out whole)
    cont > 0 && /^  [^ ]/ { sub(/^  /, ""); blk = blk (blk ~ /^(FAILED|ERROR)$/ ? " " : sep) $0; cont--; next }
    cont > 0 { flush() }
    /FAILED - RETRYING/ { next }                        # a retry is not a failure
    /\.\.\.ignoring/ { blk = ""; n = 0; next }          # nor a failure the task ignores
    /fatal: \[|^failed: \[/ { flush(); blk = $0; n = 24; next }
    /^(TASK|PLAY|RUNNING HANDLER|HANDLER) / { flush() }  # "...ignoring" comes before the next task, if at all
    n > 0 && /^ *[a-z_]+_lines:/ { n = 0; next }        # stdout_lines, stderr_lines: the same text again
    n > 0 && /^  (cmd|delta|end|start):|^  - / { next } # the command and its times
    n > 0 { blk = blk "\n" $0; n--; next }
    /^(FAILED|ERROR)( [^ ]+::|$)/ { flush(); blk = $0; cont = 4; sep = ""; next }
    # a failed test in the FAILURES section of pytest: its name, its first 6 "E" lines (words folded), its place
    /^___+ [^ ]/ { flush(); t = $0; gsub(/^_+ | _+$/, "", t); print t ":"; e = 0; next }
    /^E  / { if (e++ < 6) { flush(); blk = $0; cont = 3; sep = " " } next }
    /^[^ ]+\.py:[0-9]+: [A-Za-z]+$/ { flush(); print; next }
    /^=+ .*[0-9]+ (failed|errors?)[ ,]|CRITICAL|^ERROR |Return code: [1-9]|sparkfleet lab: / { flush(); print; next }
    END { flush() }
  ' | tail -n 40
done
