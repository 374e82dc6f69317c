"""sparkfleet benchmarks: each measures a candidate against a baseline side by side in one run."""
