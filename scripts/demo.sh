#!/usr/bin/env bash
# The main job on the bundled default trace: set-up (the package alone: no dev tools,
# no browser, no recording packages), then every report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck source=scripts/python.sh
source scripts/python.sh
pick_python
"$PY" -m gputrace.cli info fixtures/standin-cuda
exec "$PY" -m gputrace.cli analyze fixtures/standin-cuda "$@"
