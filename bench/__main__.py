"""`make bench`: run every bench/bench_*.py and print one ratio per measurement.

Each module exposes `run() -> list[dict]`; a dict has name, baseline, candidate (numbers),
unit, ratio (baseline / candidate unless the module says otherwise) and how (one line on how it
was measured). Both sides are measured in the same run, on the same machine, back to back;
no number is compared with a stored one.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
from pathlib import Path


def main(argv: list[str]) -> int:
    only = set(argv)
    here = Path(__file__).resolve().parent
    rows: list[dict] = []
    failed = []
    for path in sorted(here.glob("bench_*.py")):
        if only and path.stem not in only and path.stem.removeprefix("bench_") not in only:
            continue
        start = time.monotonic()
        print(f"== {path.stem}", flush=True)
        try:
            module = importlib.import_module(f"bench.{path.stem}")
            results = module.run()
        except Exception:
            traceback.print_exc()
            failed.append(path.stem)
            continue
        for r in results:
            r.setdefault("module", path.stem)
            rows.append(r)
            print(
                f"   {r['name']}: baseline {r['baseline']:.3f} {r['unit']}, candidate {r['candidate']:.3f} "
                f"{r['unit']} -> ratio {r['ratio']:.2f}x  ({r['how']})",
                flush=True,
            )
        print(f"   ({time.monotonic() - start:.0f} s)", flush=True)
    print("\nsummary")
    width = max((len(r["name"]) for r in rows), default=10)
    for r in rows:
        print(f"  {r['name']:<{width}}  {r['ratio']:8.2f}x")
    out = Path(".cache/bench.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))
    print(f"  (all numbers: {out})")
    if failed:
        print(f"bench: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
