"""The JSON report document: stable (sorted keys, rounded floats), see docs/json-report.md."""

from __future__ import annotations

import json
import math
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return None
        # Six decimals keep output stable; a value they would turn into 0 (a 1 ns
        # window is 1e-9 s) keeps six significant digits instead.
        r = round(value, 6)
        return r if r or not value else float(f"{value:.6g}")
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def render_json(document: dict[str, Any]) -> str:
    """The document as indented JSON with sorted keys and a final newline."""
    return json.dumps(_clean(document), indent=2, sort_keys=True, allow_nan=False) + "\n"
