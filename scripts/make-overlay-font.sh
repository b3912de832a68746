#!/usr/bin/env bash
# Makes assets/fonts/NotoSansSC-Bold-subset.otf, the font tally draws a shot's overlay with
# (src/delivery/overlay.rs), and assets/fonts/OFL.txt, its licence.
#
# Source: Noto Sans CJK SC Bold (SIL OFL 1.1), the "Noto Sans CJK SC" face of
# NotoSansCJK-Bold.ttc in Debian bookworm's `fonts-noto-cjk` package. Subset with fontTools to
# ASCII, Latin-1, general punctuation, CJK symbols and punctuation, fullwidth forms, every Han
# character of GB 2312, and a few signs (¥ € ℃ × ÷ · • ★ ✓). Output: an OTF (CFF outlines).
#
# Needs apt-get (Debian package mirror) and python3 with venv (PyPI for fontTools).
# Reproducible: same package version and fontTools version give the same file.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=assets/fonts
WORK="${TMPDIR:-/tmp}/tally-overlay-font"
FONTTOOLS_VERSION="${FONTTOOLS_VERSION:-4.68.0}"
# The Debian package version (bookworm's); another gives another font file.
NOTO_VERSION="${NOTO_VERSION:-1:20220127+repack1-1}"
mkdir -p "$WORK" "$OUT"

if ! ls "$WORK"/fonts-noto-cjk_*.deb >/dev/null 2>&1; then
    (cd "$WORK" && apt-get download "fonts-noto-cjk=$NOTO_VERSION")
fi
rm -rf "$WORK/x"
dpkg-deb -x "$(ls "$WORK"/fonts-noto-cjk_*.deb | head -n 1)" "$WORK/x"
TTC="$WORK/x/usr/share/fonts/opentype/noto/NotoSansCJK-Bold.ttc"
COPYRIGHT="$WORK/x/usr/share/doc/fonts-noto-cjk/copyright"

if [ ! -x "$WORK/venv/bin/python" ]; then
    python3 -m venv "$WORK/venv"
    "$WORK/venv/bin/pip" install -q "fonttools==$FONTTOOLS_VERSION"
fi

"$WORK/venv/bin/python" - "$TTC" "$OUT/NotoSansSC-Bold-subset.otf" <<'PY'
import sys
from fontTools.ttLib import TTCollection
from fontTools import subset

ttc, out = sys.argv[1], sys.argv[2]
faces = [f for f in TTCollection(ttc).fonts if f["name"].getDebugName(1) == "Noto Sans CJK SC"]
if len(faces) != 1:
    sys.exit("expected exactly one face named 'Noto Sans CJK SC'")
font = faces[0]

cps = set(range(0x20, 0x7F)) | set(range(0xA0, 0x100))
cps |= set(range(0x2000, 0x2070)) | set(range(0x3000, 0x3040)) | set(range(0xFF00, 0xFFF0))
for hi in range(0xB0, 0xF8):
    for lo in range(0xA1, 0xFF):
        try:
            cps.update(ord(c) for c in bytes([hi, lo]).decode("gb2312"))
        except UnicodeDecodeError:
            pass
cps |= {ord(c) for c in "¥€℃×÷·•★✓0123456789"}

opts = subset.Options()
opts.hinting = False
opts.layout_features = ["kern", "palt", "vert", "locl"]
opts.name_IDs = ["*"]
opts.name_languages = ["*"]
opts.notdef_outline = True
opts.recalc_timestamp = False
sub = subset.Subsetter(opts)
sub.populate(unicodes=sorted(cps))
sub.subset(font)
font.recalcTimestamp = False  # keep the source's date: the same input gives the same bytes
font.save(out)
print(out, "with", len(font.getBestCmap()), "code points mapped")
PY

# The licence: the font's own copyright line, then the SIL OFL 1.1 text as Debian carries it.
{
    echo "Noto Sans CJK: Copyright 2014-2021 Adobe (http://www.adobe.com/), with Reserved Font Name 'Source'."
    echo
    awk 'on && /^[^ ]/ {exit} on {print} prev == "" && /^License: SIL-1.1$/ {on=1} {prev=$0}' "$COPYRIGHT" |
        sed -e 's/^ //' -e 's/^\.$//' | sed -e :a -e '/^\n*$/{$d;N;ba' -e '}'
} >"$OUT/OFL.txt"
ls -l "$OUT"
