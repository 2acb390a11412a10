"""Rebuild ``src/vramplan/facts/data/transformers_model_types.json``: the first transformers release whose
AutoConfig knows each ``model_type``, read from the release wheels on PyPI.

    python benchmarks/transformers_first_release.py --wheels /tmp/tfwheels [--download]

``--download`` fetches the ``.0`` wheel of every minor release from 4.26 to the newest listed below with
``pip download --no-deps`` (about 10 MB each).  For each wheel the model types are the keys of
``CONFIG_MAPPING_NAMES`` in ``transformers/models/auto/configuration_auto.py`` (``auto_mappings.py`` from
5.6.0, which also began listing sub-configurations: a type first listed there is kept only when its own
``transformers/models/<type>/`` folder is new in 5.6.0 too).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

RELEASES = [f"4.{m}.0" for m in range(26, 58)] + [f"5.{m}.0" for m in range(25) if m != 10] + ["5.10.1"]
OUT = Path(__file__).resolve().parents[1] / "src/vramplan/facts/data/transformers_model_types.json"
PAIR = re.compile(r'\(\s*"([A-Za-z0-9_\-]+)"\s*,\s*"[A-Za-z0-9_]+"\s*\)')


def _key(path: str) -> tuple[int, ...]:
    return tuple(int(x) for x in os.path.basename(path).split("-")[1].split("."))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheels", required=True, help="folder of transformers-*.whl files")
    ap.add_argument("--download", action="store_true", help="pip download the missing release wheels first")
    args = ap.parse_args()
    if args.download:
        for v in RELEASES:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"transformers=={v}",
                            "-d", args.wheels], check=False)
    first: dict[str, str] = {}
    folder_first: dict[str, str] = {}
    wheels = sorted(glob.glob(os.path.join(args.wheels, "transformers-*.whl")), key=_key)
    for w in wheels:
        version = os.path.basename(w).split("-")[1]
        z = zipfile.ZipFile(w)
        names = z.namelist()
        src = "transformers/models/auto/auto_mappings.py"
        if src not in names:
            src = "transformers/models/auto/configuration_auto.py"
        text = z.read(src).decode()
        start = text.index("CONFIG_MAPPING_NAMES = OrderedDict")
        for t in PAIR.findall(text[start:text.index("\n)", start)]):
            first.setdefault(t, version)
        for n in names:
            m = re.match(r"transformers/models/([a-z0-9_]+)/__init__\.py$", n)
            if m:
                folder_first.setdefault(m.group(1), version)
    kept = {t: v for t, v in first.items() if not (v == "5.6.0" and folder_first.get(t, "5.6.0") != "5.6.0")}
    doc = json.loads(OUT.read_text())
    doc["first_release"] = dict(sorted(kept.items()))
    doc["oldest_release_read"] = os.path.basename(wheels[0]).split("-")[1]
    doc["newest_release_read"] = os.path.basename(wheels[-1]).split("-")[1]
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(kept)} model types from {len(wheels)} wheels -> {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
