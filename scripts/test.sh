#!/usr/bin/env bash
# The whole test suite on a fresh machine: set-up, then pytest (extra args pass through).
# It installs the rest of what the demo does not: the dev tools and chromium and, as
# root, what the live BPF tests need (bcc, kernel headers, FUSE), so they run instead
# of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) -eq 0 && -f scripts/setup-record.sh ]]; then
    bash scripts/setup.sh --dev --record
else
    bash scripts/setup.sh --dev
fi
# shellcheck source=scripts/python.sh
source scripts/python.sh
pick_python
# Bytecode cached outside the tree, even where PYTHONDONTWRITEBYTECODE is set: the suite
# starts hundreds of python processes (CLI runs, recorders, pytest workers and sessions),
# and each would compile gputrace and rewrite the test modules again.
export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/gputrace/pycache}"
unset PYTHONDONTWRITEBYTECODE
# Parallel workers (pytest-xdist, docs/testing.md): one more than the cores, since the
# live tests spend a third of their time waiting (recorders, PyPI, terminals);
# GPUTRACE_TEST_WORKERS=N sets it, 0 runs in one process; a -n among the arguments
# overrides it.
exec "$PY" -m pytest -n "${GPUTRACE_TEST_WORKERS:-$(( $(nproc) + 1 ))}" "$@"
