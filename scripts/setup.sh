#!/usr/bin/env bash
# Install everything gputrace needs on a fresh Debian machine of this kind.
#   scripts/setup.sh            Python package and dev tools (analysis, tests)
#   scripts/setup.sh --record   also the system packages recording needs (root):
#                               bcc, kernel headers, FUSE, strace, bpftrace
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m pip install --quiet --disable-pip-version-check -e '.[dev]'
if [[ "${1:-}" == "--record" ]]; then
    if [[ $(id -u) -ne 0 ]]; then
        echo "setup.sh: --record needs root (apt-get, kernel header links)" >&2
        exit 1
    fi
    bash scripts/setup-record.sh
fi
# The HTML report's browser test opens it in Debian's headless chromium (root only).
if [[ $(id -u) -eq 0 && ! -x /usr/bin/chromium ]]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
