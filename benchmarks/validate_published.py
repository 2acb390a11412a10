"""Score the engines and the rules of thumb on validation/published.yaml and keep the results.

A thin wrapper around ``vramplan validate`` (the same code path); it writes
``benchmarks/validation_results.md`` (the markdown tables, as ``--markdown`` prints them)
and ``benchmarks/validation_results.json`` (the full result, as ``--json`` prints it).

Run from the repository root::

    PYTHONPATH=src python benchmarks/validate_published.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vramplan.validate import to_markdown, validate

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "PYTHONPATH=src python benchmarks/validate_published.py  (= vramplan validate validation/published.yaml --engine all)"


def main() -> None:
    result = validate(ROOT / "validation" / "published.yaml", engine="all")
    md = to_markdown(result, worst=20).replace(str(ROOT) + "/", "")
    (ROOT / "benchmarks" / "validation_results.md").write_text(
        f"<!-- made by: {COMMAND} -->\n\n" + md, encoding="utf-8")
    data = result.to_json_dict()
    data["dataset"] = "validation/published.yaml"
    data["command"] = COMMAND
    (ROOT / "benchmarks" / "validation_results.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    sys.stdout.write(md)


if __name__ == "__main__":
    main()
