"""The reference render tally's profiles are checked against (tests/it/pillow.rs): Pillow fits
the source inside WIDTHxHEIGHT (Image.resize with BICUBIC to the fitted size, rounded as tally
rounds), pads it centred on white and writes a baseline JPEG at QUALITY, 4:4:4.

Usage: reference.py SOURCE WIDTH HEIGHT QUALITY OUT
"""
import sys

from PIL import Image


def main():
    source, width, height, quality, out = sys.argv[1:6]
    width, height, quality = int(width), int(height), int(quality)
    img = Image.open(source).convert("RGB")
    w, h = img.size
    scale = min(width / w, height / h)
    nw = min(width, max(1, round(w * scale)))
    nh = min(height, max(1, round(h * scale)))
    fitted = img.resize((nw, nh), Image.Resampling.BICUBIC)
    canvas = Image.new("RGB", (width, height), (255, 255, 255))
    canvas.paste(fitted, ((width - nw) // 2, (height - nh) // 2))
    canvas.save(out, "JPEG", quality=quality, subsampling=0)
    print(f"{nw}x{nh} in {width}x{height}")


if __name__ == "__main__":
    main()
