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
exec "$PY" -m pytest "$@"
