#!/usr/bin/env bash
# Mutation testing (mutmut 3) of the decoders, the driver-version layout tables, the
# analyses and the renderers ([tool.mutmut] in pyproject.toml says which files and
# which tests). Runs in a scratch copy of HEAD, never in the working tree, and ends
# with the line `mutation score: K killed of N`.
#   bash scripts/mutation.sh                       # every mutant in scope (long)
#   bash scripts/mutation.sh 'gputrace.record.*'   # mutmut name globs: one area
# Env: MUTATION_DIR (reuse a scratch dir and its cached results), MUTATION_JOBS (2),
#      MUTATION_SAMPLE=0.01 (score a seeded sample: that share of each file's mutants),
#      MUTATION_MIN (at least this many per file, 5), MUTATION_SEED (2026).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
work=${MUTATION_DIR:-$(mktemp -d /tmp/gputrace-mutation.XXXXXX)}
mkdir -p "$work"
# Extract HEAD beside the scratch copy and copy over only files whose bytes differ:
# mutmut 3 regenerates every mutant of a source newer than its mutants and forgets
# their cached verdicts, so a plain re-extract into a reused MUTATION_DIR (new
# mtimes on every file) would throw the cache away and cost the generation again.
fresh=$(mktemp -d "${work%/}.head.XXXXXX")
git archive HEAD | tar -x -C "$fresh"
"$PY" - "$fresh" "$work" <<'PY'
import filecmp, shutil, sys
from pathlib import Path

src, dst = Path(sys.argv[1]), Path(sys.argv[2])
for f in src.rglob("*"):
    t = dst / f.relative_to(src)
    if f.is_dir():
        t.mkdir(parents=True, exist_ok=True)
    elif not t.exists() or not filecmp.cmp(f, t, shallow=False):
        shutil.copyfile(f, t)  # mtime now: newer than its old mutants
        shutil.copymode(f, t)
PY
rm -rf "$fresh"
cd "$work"
echo "mutation: scratch copy of $(git -C "$OLDPWD" rev-parse --short HEAD) in $work" >&2
# polars in each mutant's process: one thread (two mutants run side by side on 2 cores)
export POLARS_MAX_THREADS=${POLARS_MAX_THREADS:-1}
if [ -n "${MUTATION_SAMPLE:-}" ]; then
    # A seeded sample of the mutants in scope, a share of each source file's (at least MUTATION_MIN):
    # the analyses and renderers have ~17,000 mutants at ~5-10 s each on 2 cores.
    # A run whose filter matches nothing generates the mutants and their test stats, then stops.
    "$PY" -m mutmut run --max-children "${MUTATION_JOBS:-2}" 'no.such.mutant' > mutation-stats.log 2>&1 || true
    grep -q 'failed to collect stats' mutation-stats.log && { tail -5 mutation-stats.log >&2; exit 1; }
    "$PY" - "$MUTATION_SAMPLE" "${MUTATION_SEED:-2026}" "${MUTATION_MIN:-5}" "$@" > mutation-sample.txt <<'PY'
import fnmatch, json, math, random, sys
from pathlib import Path

frac, seed, least = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
globs = sys.argv[4:] or ["*"]
rng = random.Random(seed)
for meta in sorted(Path("mutants").rglob("*.meta")):
    names = sorted(n for n in json.loads(meta.read_text()).get("exit_code_by_key", {})
                   if any(fnmatch.fnmatch(n, g) for g in globs))
    for n in sorted(rng.sample(names, min(len(names), max(least, math.ceil(frac * len(names)))))):
        print(n)
PY
    echo "mutation: sample of $(wc -l < mutation-sample.txt) mutants (share $MUTATION_SAMPLE per file, seed ${MUTATION_SEED:-2026})" >&2
    set -- $(cat mutation-sample.txt)
fi
"$PY" -m mutmut run --max-children "${MUTATION_JOBS:-2}" "$@" || true
"$PY" -m mutmut results > mutation-results.txt 2>&1 || true
"$PY" - "$@" <<'PY'
import fnmatch, json, sys
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code

# mutmut 3 keeps each source file's verdicts (pytest exit codes) in mutants/<file>.meta
globs = sys.argv[1:] or ["*"]
status: Counter[str] = Counter()
lines = []
for meta in sorted(Path("mutants").rglob("*.meta")):
    data = json.loads(meta.read_text())
    for name, code in sorted(data.get("exit_code_by_key", {}).items()):
        if not any(fnmatch.fnmatch(name, g) for g in globs):
            continue
        st = status_by_exit_code[code]
        # a timeout or a type-check catch is a kill; anything else that is not a
        # kill (survived, no tests, not checked, suspicious) counts against the score
        st = "killed" if st in ("timeout", "caught by type check") else st
        status[st] += 1
        if st != "killed":
            lines.append(f"{st:<12} {name}")
Path("mutation-survivors.txt").write_text("\n".join(lines) + "\n")
print("by status: " + ", ".join(f"{k} {v}" for k, v in sorted(status.items())))
print(f"survivors and unrun mutants: {Path('mutation-survivors.txt').resolve()}")
print(f"mutation score: {status['killed']} killed of {sum(status.values())}")
PY
