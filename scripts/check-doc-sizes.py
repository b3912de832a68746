#!/usr/bin/env python3
"""The documents stay readable by the reader they are for (issue #42 "docs by reader").

Fails (exit 1, with the list) when README.md is past 20,000 bytes, ARCHITECTURE.md past 25,000
or BENCHMARKS.md past 20,000 (`wc -c`), when DEVELOPING.md is missing, or when docs/ holds
fewer than 4 Markdown pages for a reader (docs/**/*.md but docs/internals/, which does not count: it holds the
mechanisms ARCHITECTURE.md points to, not pages for a reader to start from). What no longer
fits moves: the dated benchmark logs to bench-results/, mechanisms to the doc comment where the
rule is enforced or to docs/internals/. Run by .ci/run's first stage.
"""
import pathlib
import sys

LIMITS = {"README.md": 20_000, "ARCHITECTURE.md": 25_000, "BENCHMARKS.md": 20_000}
MIN_DOCS_PAGES = 4
root = pathlib.Path(__file__).resolve().parent.parent
bad = []
for name, limit in LIMITS.items():
    path = root / name
    if not path.is_file():
        bad.append(f"{name}: missing")
        continue
    size = path.stat().st_size
    if size > limit:
        bad.append(f"{name}: {size:,} bytes, more than {limit:,}")
if not (root / "DEVELOPING.md").is_file():
    bad.append("DEVELOPING.md: missing")
pages = sorted(
    str(p.relative_to(root / "docs"))
    for p in (root / "docs").rglob("*.md")
    if p.is_file() and "internals" not in p.relative_to(root / "docs").parts
)
if len(pages) < MIN_DOCS_PAGES:
    bad.append(f"docs/: {len(pages)} Markdown page(s) ({', '.join(pages) or 'none'}), fewer than {MIN_DOCS_PAGES}")
if bad:
    print("documents past their limits:")
    print("\n".join("  " + b for b in bad))
    sys.exit(1)
print("doc sizes: " + ", ".join(f"{n} {(root / n).stat().st_size:,} bytes" for n in LIMITS) + f"; docs/ has {len(pages)} pages")
