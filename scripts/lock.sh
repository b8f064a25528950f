#!/usr/bin/env bash
# Regenerate requirements/constraints.txt: exact pins of every package the dev and
# test set-up installs (all extras), for Python 3.10 and newer on any platform
# (`uv pip compile --universal`). Pins already in the file are kept unless a range in
# pyproject.toml excludes them; pass --upgrade (or --upgrade-package NAME) to move them.
# uv comes from PyPI (`pip install uv`) into a scratch environment when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
uv=${UV:-uv}
if ! command -v "$uv" >/dev/null 2>&1; then
    tools=${TMPDIR:-/tmp}/gputrace-uv
    [[ -x $tools/bin/uv ]] || { python3 -m venv "$tools" && "$tools/bin/pip" install --quiet uv; }
    uv=$tools/bin/uv
fi
exec "$uv" pip compile pyproject.toml --all-extras --universal --python-version 3.10 \
    --custom-compile-command "bash scripts/lock.sh" -o requirements/constraints.txt "$@"
