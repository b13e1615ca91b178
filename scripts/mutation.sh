#!/bin/sh
# Mutation testing of the core modules listed in [tool.mutmut] (pyproject.toml); not run in CI.
# Usage: scripts/mutation.sh [python]   (default: python3 with mutmut installed, e.g. .[fuzz])
# Prints mutmut's per-mutant results and a killed/total line per module.
set -eu
cd "$(dirname "$0")/.."
PYTHON="${1:-python3}"
rm -rf mutants
"$PYTHON" -m mutmut run --max-children "$(nproc 2>/dev/null || echo 2)" || true
"$PYTHON" -m mutmut results --all true > mutants/results.txt || true
"$PYTHON" - <<'PY'
import collections, re
counts = collections.defaultdict(collections.Counter)
for line in open("mutants/results.txt", encoding="utf-8"):
    found = re.match(r"\s*(disagg_transforms\.[\w.]+?)\.x.*?: (\w[\w ]*)$", line.strip())
    if found:
        counts[found.group(1)][found.group(2)] += 1
for module, states in sorted(counts.items()):
    total = sum(states.values())
    killed = states["killed"] + states["timeout"]
    print(f"{module}: {killed}/{total} killed ({100 * killed / total:.1f}%)  {dict(states)}")
PY
