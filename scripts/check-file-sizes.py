#!/usr/bin/env python3
"""No source file past 600 lines without a sentence in its header saying why.

Checks every .rs, .js, .css and .py file under src/, tests/ and scripts/: one longer than 600
lines must say so in its opening comment (its first 40 lines mention "600"). Exit 1 with the
list otherwise. Run by .ci/run's first stage.
"""
import pathlib
import sys

LIMIT = 600
root = pathlib.Path(__file__).resolve().parent.parent
bad = []
for top in ("src", "tests", "scripts"):
    for path in sorted((root / top).rglob("*")):
        if path.suffix not in (".rs", ".js", ".css", ".py") or not path.is_file():
            continue
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        if len(lines) > LIMIT and not any("600" in line for line in lines[:40]):
            bad.append(f"{path.relative_to(root)}: {len(lines)} lines, and its header does not say why")
if bad:
    print("files past 600 lines with no reason in their header:")
    print("\n".join("  " + b for b in bad))
    sys.exit(1)
print(f"file sizes: every file past {LIMIT} lines says why in its header")
