#!/usr/bin/env bash
# The whole test suite on a fresh machine: set-up, then pytest (extra args pass through).
# As root it also installs what the live BPF tests need, so they run instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) -eq 0 && -f scripts/setup-record.sh ]]; then
    bash scripts/setup.sh --record
else
    bash scripts/setup.sh
fi
# Parallel workers (pytest-xdist, docs/testing.md): GPUTRACE_TEST_WORKERS=0 runs in one
# process; a -n among the arguments overrides it.
exec "${PYTHON:-python3}" -m pytest -n "${GPUTRACE_TEST_WORKERS:-auto}" "$@"
