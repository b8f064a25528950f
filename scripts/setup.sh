#!/usr/bin/env bash
# Install what gputrace needs on a fresh Debian machine of this kind.
#   scripts/setup.sh            the package: analysis and reports (what demo.sh needs)
#   scripts/setup.sh --dev      also the dev and test tools ([dev]: pytest, mypy, ruff,
#                               mutmut, duckdb, moto, the fleet and record extras) and,
#                               as root, Debian's chromium for the HTML report's test
#   scripts/setup.sh --record   also the system packages recording needs (root, apt):
#                               bcc, kernel headers, FUSE, strace, bpftrace
# Python packages come pinned by requirements/constraints.txt (no resolver
# backtracking; scripts/lock.sh regenerates it). PYTHON picks the interpreter; one
# that refuses installs (PEP 668) gets a virtual environment in .venv
# (scripts/python.sh), which sees Debian's bcc.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/python.sh
source scripts/python.sh
dev=0 record=0
for arg in "$@"; do
    case $arg in
        --dev) dev=1 ;;
        --record) record=1 ;;
        *) echo "setup.sh: unknown option $arg (use --dev, --record)" >&2; exit 2 ;;
    esac
done
if [[ $record -eq 1 && $(id -u) -ne 0 ]]; then
    echo "setup.sh: --record needs root (apt-get, kernel header links)" >&2
    exit 1
fi
pick_python
if [[ $PY != "$BASE_PY" && ! -x $PY ]]; then
    # Debian's python3 makes no virtual environment without python3-venv (ensurepip).
    if ! "$BASE_PY" -m venv "$GPUTRACE_VENV" 2>/dev/null; then
        if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
            export DEBIAN_FRONTEND=noninteractive
            apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
            rm -rf "$GPUTRACE_VENV"
            "$BASE_PY" -m venv "$GPUTRACE_VENV"
        else
            echo "setup.sh: $BASE_PY refuses installs (PEP 668) and cannot make a virtual environment: install python3-venv, or set PYTHON to a virtual environment's python" >&2
            exit 1
        fi
    fi
    echo "setup.sh: installing into $GPUTRACE_VENV ($BASE_PY refuses installs)"
fi
if [[ $record -eq 1 ]]; then
    bash scripts/setup-record.sh
fi
extras=()
[[ $dev -eq 1 ]] && extras+=(dev)
[[ $record -eq 1 ]] && extras+=(record)
target=.
if [[ ${#extras[@]} -gt 0 ]]; then
    target=".[$(IFS=,; echo "${extras[*]}")]"
fi
# --no-compile: byte-compiling every installed module (plotly alone has thousands)
# took most of the demo's set-up; Python compiles what it imports, when it does.
"$PY" -m pip install --quiet --disable-pip-version-check --no-compile \
    -c requirements/constraints.txt -e "$target"
bcc_visible "$PY"
# The HTML report's browser test opens it in Debian's headless chromium (root only).
if [[ $dev -eq 1 && $(id -u) -eq 0 && ! -x /usr/bin/chromium ]]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
