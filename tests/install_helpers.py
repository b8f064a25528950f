"""Fresh virtual environments for the install tests, and the set-up scripts' own
shell functions (scripts/python.sh) run from Python."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "requirements" / "constraints.txt"
SYSTEM_BCC = Path("/usr/lib/python3/dist-packages/bcc")


def make_venv(where: Path, *, pip: bool = True) -> Path:
    """A new virtual environment at `where`, from this interpreter's base; its python."""
    subprocess.run([sys.executable, "-m", "venv", *([] if pip else ["--without-pip"]),
                    str(where)], check=True, capture_output=True)  # fmt: skip
    return where / "bin" / "python"


def python_sh(snippet: str, *args: str, env: dict[str, str] | None = None,
              ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`snippet` run by bash in the checkout after sourcing scripts/python.sh."""
    return subprocess.run(["bash", "-c", f"source scripts/python.sh && {snippet}", "_", *args],
                          cwd=ROOT, capture_output=True, text=True, env=env, check=False)
