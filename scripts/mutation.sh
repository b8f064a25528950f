#!/usr/bin/env bash
# Mutation testing (mutmut 3) of the decoders, the driver-version layout tables, the
# analyses and the renderers ([tool.mutmut] in pyproject.toml says which files and
# which tests). Runs in a scratch copy of HEAD, never in the working tree, and ends
# with the line `mutation score: K killed of N`.
#   bash scripts/mutation.sh                       # every mutant in scope (long)
#   bash scripts/mutation.sh 'gputrace.record.*'   # mutmut name globs: one area
# Env: MUTATION_DIR (reuse a scratch dir and its cached results), MUTATION_JOBS (2).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
work=${MUTATION_DIR:-$(mktemp -d /tmp/gputrace-mutation.XXXXXX)}
mkdir -p "$work"
git archive HEAD | tar -x -C "$work"
cd "$work"
echo "mutation: scratch copy of $(git -C "$OLDPWD" rev-parse --short HEAD) in $work" >&2
"$PY" -m mutmut run --max-children "${MUTATION_JOBS:-2}" "$@" || true
"$PY" -m mutmut results > mutation-results.txt 2>&1 || true
"$PY" - "$@" <<'PY'
import fnmatch, json, sys
from pathlib import Path

# mutmut 3 keeps each source file's verdicts in mutants/<file>.meta (exit codes)
globs = sys.argv[1:] or ["*"]
killed = survived = other = 0
lines = []
for meta in sorted(Path("mutants").rglob("*.meta")):
    data = json.loads(meta.read_text())
    for name, code in data.get("exit_code_by_key", {}).items():
        if not any(fnmatch.fnmatch(name, g) for g in globs):
            continue
        if code is None:
            other += 1          # not run (no test covers it, or skipped)
            lines.append(f"not run   {name}")
        elif code == 0:
            survived += 1
            lines.append(f"survived  {name}")
        elif code in (1, 3, 36, 37, 152, -24, 24):
            killed += 1         # failed tests, or killed by the timeout
        else:
            other += 1
            lines.append(f"exit {code:<4} {name}")
Path("mutation-survivors.txt").write_text("\n".join(lines) + "\n")
print(f"survivors and unrun mutants: {Path('mutation-survivors.txt').resolve()}")
print(f"mutation score: {killed} killed of {killed + survived + other}")
PY
