#!/usr/bin/env bash
# The main job on the bundled default trace: set-up, then every report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
"${PYTHON:-python3}" -m gputrace.cli info fixtures/standin-cuda
exec "${PYTHON:-python3}" -m gputrace.cli analyze fixtures/standin-cuda "$@"
