#!/usr/bin/env python3
"""fanout's image decoding (image_tool) against Pillow's Image.open(f).convert("RGB"),
pixel for pixel, on files this script writes: JPEGs baseline and progressive,
4:2:0, 4:2:2 and 4:4:4, grayscale and CMYK; JPEGs decoded at 1/2, 1/4 and 1/8
against Pillow's draft mode (the same libjpeg scaling), and the loader's
jpeg-draft resize within two levels of torchvision's pixels; PNGs of every colour type
at 1 to 16 bits, palettes with and without transparency, alpha. Truncated and
corrupt files and files of another kind are one line naming the file, where
Pillow refuses them too; 200 random corruptions of a JPEG decoded or refused
as Pillow does, none disturbing the next file's decode."""
import io
import math
import os
import random
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np
from PIL import Image

TOOL = os.environ["IMAGE_TOOL"]
rng = np.random.default_rng(51)


def decode(path, scale=1):
    r = subprocess.run([TOOL, "decode", path, str(scale)], capture_output=True, timeout=60)
    if r.returncode != 0:
        return None, r.stderr.decode()
    head, _, rest = r.stdout.partition(b"\n")
    w, h = map(int, head.split())
    return np.frombuffer(rest, np.uint8).reshape(h, w, 3), ""


def smooth(h, w, c):
    """Gradients plus noise: content a JPEG keeps detail of, every value used."""
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1) + k * 40 + y * 3) % 256 for k in range(c)], -1)
    return np.clip(base + rng.integers(-30, 31, (h, w, c)), 0, 255).astype(np.uint8)


def crop_box(h, w, r):
    """torchvision's RandomResizedCrop.get_params with the default scale and ratio."""
    for _ in range(10):
        area = h * w * r.uniform(0.08, 1.0)
        ratio = math.exp(r.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = int(round(math.sqrt(area * ratio))), int(round(math.sqrt(area / ratio)))
        if 0 < cw <= w and 0 < ch <= h:
            return r.randint(0, h - ch), r.randint(0, w - cw), ch, cw
    return 0, 0, h, w


def check_jpeg_draft(work):
    """jpeg-draft (the loader's DCT-domain downscaling) against torchvision's pixels (Pillow: full decode, crop,
    resize) on JPEGs with the most high-frequency content: noise, fine gratings, one-pixel checks and hard edges.
    The issue's bound: within two levels (the mean absolute difference over a resized crop); where no scale
    applies the pixels are torchvision's exactly. Every scale must be exercised."""
    h, w = 900, 1200
    y, x = np.mgrid[0:h, 0:w]
    images = {
        "noise": rng.integers(0, 256, (h, w, 3)),
        "grating": np.stack([127 + 120 * np.sin(2 * np.pi * (x / p + y / (1.7 * p))) for p in (3.1, 4.3, 7.7)], -1),
        "checks": np.stack([(x // 2 + y // 2) % 2 * 255] * 3, -1) + rng.integers(-20, 21, (h, w, 3)),
        "edges": smooth(h, w, 3),  # the modulo wraps: 255-level steps
    }
    r = random.Random(54)
    failures, seen, worst = 0, set(), (0.0, 0.0, 0)
    for name, a in images.items():
        for sub in (0, 2):
            path = os.path.join(work, f"draft-{name}-{sub}.jpg")
            Image.fromarray(np.clip(a, 0, 255).astype(np.uint8), "RGB").save(path, quality=90, subsampling=sub)
            full = Image.open(path).convert("RGB")
            for k in range(24):
                top, left, ch, cw = crop_box(h, w, r)
                side = (16, 32, 64, 112, 224)[k % 5]
                p = subprocess.run([TOOL, "draft", path, *map(str, (top, left, ch, cw, side, side))],
                                   capture_output=True, timeout=60)
                head, _, rest = p.stdout.partition(b"\n")
                got = np.frombuffer(rest, np.uint8).reshape(side, side, 3).astype(int)
                scale = int(p.stderr.split()[1])
                want = np.asarray(full.crop((left, top, left + cw, top + ch)).resize((side, side), Image.BILINEAR))
                diff = np.abs(got - want.astype(int))
                seen.add(scale)
                if scale == 1:
                    bad = diff.max() != 0
                else:
                    bad = diff.mean() > 2.0
                    worst = max(worst[0], diff.mean()), max(worst[1], np.percentile(diff, 99)), max(worst[2], diff.max())
                if bad:
                    failures += 1
                    print(f"FAIL jpeg-draft {name} 4:{4 - sub * 2}... box ({top},{left},{ch},{cw}) to {side} at "
                          f"1/{scale}: mean difference {diff.mean():.2f}, at most {diff.max()}")
    if seen != {1, 2, 4, 8}:
        failures += 1
        print(f"FAIL jpeg-draft: scales {sorted(seen)} used, not every one of 1, 2, 4 and 8")
    print(f"ok   jpeg-draft at 1/2, 1/4, 1/8: mean difference at most {worst[0]:.2f} levels (99th percentile "
          f"{worst[1]:.0f}, largest {worst[2]}); torchvision's pixels where no scale applies")
    return failures


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def write_png(path, rows, width, height, depth, color_type, extra=b""):
    """A PNG from already packed scanlines (filter 0), for modes Pillow does not write."""
    raw = b"".join(b"\x00" + r for r in rows)
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + extra + png_chunk(b"IDAT", zlib.compress(raw)) +
                png_chunk(b"IEND", b""))


def pack_bits(values, depth):
    out = bytearray()
    per = 8 // depth
    for i in range(0, len(values), per):
        b = 0
        for j, v in enumerate(values[i:i + per]):
            b |= int(v) << (8 - depth * (j + 1))
        out.append(b)
    return bytes(out)


def main():
    with tempfile.TemporaryDirectory(prefix="image-ref-") as work:
        run(work)


def run(work):
    cases = []  # (name, path)

    def save(name, im, **kw):
        path = os.path.join(work, name)
        im.save(path, **kw)
        cases.append((name, path))

    rgb = Image.fromarray(smooth(37, 53, 3), "RGB")  # odd sizes: partial MCUs
    save("baseline-420.jpg", rgb, quality=90, subsampling=2)
    save("baseline-422.jpg", rgb, quality=90, subsampling=1)
    save("baseline-444.jpg", rgb, quality=90, subsampling=0)
    save("progressive-420.jpg", rgb, quality=90, subsampling=2, progressive=True)
    save("progressive-444.jpg", rgb, quality=75, subsampling=0, progressive=True)
    save("gray.jpg", Image.fromarray(smooth(41, 29, 1)[..., 0], "L"), quality=90)
    save("cmyk.jpg", Image.fromarray(smooth(33, 47, 4), "CMYK"), quality=90)
    save("UPPER.JPEG", rgb, quality=60)

    save("rgb.png", rgb)
    save("rgba.png", Image.fromarray(smooth(19, 23, 4), "RGBA"))
    save("gray.png", Image.fromarray(smooth(19, 23, 1)[..., 0], "L"))
    save("gray-alpha.png", Image.fromarray(smooth(19, 23, 2), "LA"))
    pal = Image.fromarray(smooth(21, 17, 3), "RGB").quantize(colors=37)
    save("palette.png", pal)
    pal_t = pal.copy()
    pal_t.info["transparency"] = 5
    save("palette-trns.png", pal_t, transparency=5)
    save("palette-4bit.png", Image.fromarray(smooth(21, 17, 3), "RGB").quantize(colors=16), bits=4)
    save("bilevel.png", Image.fromarray(smooth(13, 29, 1)[..., 0] > 127))
    save("gray16.png", Image.fromarray(smooth(11, 13, 1)[..., 0].astype(np.uint16) * 3))
    # Modes Pillow does not write: 16-bit colour and alpha, 2- and 4-bit gray, gray with tRNS.
    for name, ctype, chans in (("rgb16.png", 2, 3), ("rgba16.png", 6, 4), ("gray-alpha16.png", 4, 2)):
        v = rng.integers(0, 65536, (9, 14, chans), dtype=np.uint16)
        write_png(os.path.join(work, name), [r.astype(">u2").tobytes() for r in v], 14, 9, 16, ctype)
        cases.append((name, os.path.join(work, name)))
    for depth in (1, 2, 4):
        v = rng.integers(0, 1 << depth, (7, 19))
        name = f"gray{depth}bit.png"
        write_png(os.path.join(work, name), [pack_bits(r, depth) for r in v], 19, 7, depth, 0)
        cases.append((name, os.path.join(work, name)))
    v = rng.integers(0, 256, (6, 10, 3), dtype=np.uint8)
    write_png(os.path.join(work, "rgb-trns.png"), [r.tobytes() for r in v], 10, 6, 8, 2,
              extra=png_chunk(b"tRNS", struct.pack(">HHH", *[int(c) for c in v[0, 0]])))
    cases.append(("rgb-trns.png", os.path.join(work, "rgb-trns.png")))

    failures = 0
    for name, path in cases:
        want = np.asarray(Image.open(path).convert("RGB"))
        got, err = decode(path)
        if got is None or got.shape != want.shape or not np.array_equal(got, want):
            failures += 1
            detail = err.strip() if got is None else (
                f"shape {got.shape} vs {want.shape}" if got.shape != want.shape else
                f"{int((got != want).sum())} values differ, at most by {int(np.abs(got.astype(int) - want).max())}")
            print(f"FAIL {name}: {detail}")
        else:
            print(f"ok   {name}: {want.shape[1]}x{want.shape[0]} equal to Pillow")
        size = subprocess.run([TOOL, "size", path], capture_output=True, text=True).stdout.split()
        if [int(s) for s in size] != list(Image.open(path).size):
            failures += 1
            print(f"FAIL {name}: header size {size} vs Pillow's {Image.open(path).size}")

    # DCT-domain scaling: the same libjpeg scaling as Pillow's draft mode.
    big = Image.fromarray(smooth(384, 512, 3), "RGB")
    for sub in (0, 2):
        path = os.path.join(work, f"big-{sub}.jpg")
        big.save(path, quality=90, subsampling=sub)
        for denom in (1, 2, 4, 8):
            got, err = decode(path, denom)
            ref = Image.open(path)
            ref.draft("RGB", (512 // denom, 384 // denom))
            want = np.asarray(ref.convert("RGB"))
            if got is None or got.shape != want.shape or not np.array_equal(got, want):
                failures += 1
                print(f"FAIL big-{sub}.jpg at 1/{denom}: {err or (got.shape, want.shape)}")
            else:
                print(f"ok   big-{sub}.jpg at 1/{denom} ({want.shape[1]}x{want.shape[0]}) "
                      "equal to Pillow's draft")

    # Resizing: torchvision crops, then Pillow resizes with its bilinear filter: the same pixels.
    src = os.path.join(work, "resize-src.png")
    Image.fromarray(smooth(75, 100, 3), "RGB").save(src)
    for top, left, h, w, oh, ow in ((0, 0, 75, 100, 32, 32), (0, 0, 75, 100, 150, 200), (10, 20, 40, 50, 224, 224),
                                    (5, 7, 61, 83, 20, 27), (0, 0, 75, 100, 75, 100), (30, 40, 3, 2, 9, 9),
                                    (0, 0, 75, 100, 10, 90), (0, 0, 75, 100, 75, 40), (0, 0, 75, 100, 30, 100)):
        r = subprocess.run([TOOL, "resize", src, *map(str, (top, left, h, w, oh, ow))], capture_output=True, timeout=60)
        head, _, rest = r.stdout.partition(b"\n")
        got = np.frombuffer(rest, np.uint8).reshape(oh, ow, 3).astype(int)
        want = np.asarray(Image.open(src).convert("RGB").crop((left, top, left + w, top + h))
                          .resize((ow, oh), Image.BILINEAR)).astype(int)
        if not np.array_equal(got, want):
            failures += 1
            print(f"FAIL resize ({top},{left},{h},{w}) to {oh}x{ow}: {int((got != want).sum())} values differ from "
                  f"Pillow's, at most by {int(np.abs(got - want).max())}")
        else:
            print(f"ok   resize ({top},{left},{h},{w}) to {oh}x{ow}: equal to Pillow's")

    # Regions with fractional edges: Pillow's resize of the pixels they touch, with the region as its box.
    for top, left, bottom, right, oh, ow in ((2.5, 3.25, 70.5, 96.75, 16, 24), (0, 0.5, 75, 99.5, 40, 60),
                                             (10.125, 20.875, 30.5, 33.0, 31, 17), (0, 0, 75, 100, 20, 20)):
        r = subprocess.run([TOOL, "region", src, *map(str, (top, left, bottom, right, oh, ow))], capture_output=True,
                           timeout=60)
        head, _, rest = r.stdout.partition(b"\n")
        got = np.frombuffer(rest, np.uint8).reshape(oh, ow, 3).astype(int)
        y0, x0 = math.floor(top), math.floor(left)
        want = np.asarray(Image.open(src).convert("RGB").crop((x0, y0, math.ceil(right), math.ceil(bottom)))
                          .resize((ow, oh), Image.BILINEAR, box=(left - x0, top - y0, right - x0, bottom - y0)))
        if not np.array_equal(got, want.astype(int)):
            failures += 1
            print(f"FAIL region ({top},{left})-({bottom},{right}) to {oh}x{ow}: {int((got != want).sum())} values "
                  f"differ from Pillow's, at most by {int(np.abs(got - want).max())}")
        else:
            print(f"ok   region ({top},{left})-({bottom},{right}) to {oh}x{ow}: equal to Pillow's")

    failures += check_jpeg_draft(work)

    # Bad files: one line naming the file, where Pillow refuses them as well.
    data = open(os.path.join(work, "baseline-420.jpg"), "rb").read()
    png = open(os.path.join(work, "rgb.png"), "rb").read()
    # Headers that claim more pixels than Pillow's decompression-bomb bound (refused before any allocation).
    ihdr = b"IHDR" + struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0)
    huge_png = png[:8] + struct.pack(">I", 13) + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + png[33:]
    sof = data.index(b"\xff\xc0")  # baseline SOF0: length (2), precision (1), height (2), width (2)
    huge_jpg = data[: sof + 5] + struct.pack(">HH", 65000, 65000) + data[sof + 9 :]
    bad = {
        "huge.png": huge_png,
        "huge.jpg": huge_jpg,
        "truncated.jpg": data[: len(data) * 2 // 3],
        "corrupt-header.jpg": data[:4] + bytes(rng.integers(0, 256, 60, dtype=np.uint8)) + data[64:],
        "truncated.png": png[: len(png) // 2],
        "bad-idat-crc.png": png[:41] + bytes([png[41] ^ 0xFF]) + png[42:],  # IDAT's first data byte
        "text.jpg": b"this is not an image\n",
        "empty.png": b"",
    }
    for name, blob in bad.items():
        path = os.path.join(work, name)
        open(path, "wb").write(blob)
        try:
            Image.open(path).convert("RGB")
            pillow = "decodes it"
        except Exception as e:  # noqa: BLE001 (any refusal)
            pillow = f"refuses it ({type(e).__name__})"
        got, err = decode(path)
        lines = err.strip().splitlines()
        if got is not None or len(lines) != 1 or path not in lines[0] or "cannot decode image" not in lines[0]:
            failures += 1
            print(f"FAIL {name}: expected one line naming the file, got {err!r} (Pillow {pillow})")
        else:
            print(f"ok   {name}: {lines[0]} (Pillow {pillow})")
    failures += check_corruptions(work)
    if failures:
        sys.exit(f"{failures} image case(s) differ from Pillow")
    print("image decoding equals Pillow's")


def fnv1a64(data):
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def check_corruptions(work):
    """200 seeded corruptions of a baseline JPEG (a run of random bytes somewhere in it): fanout decodes exactly
    the ones Pillow decodes, to Pillow's pixels, and refuses the others (Pillow ignores libjpeg's warnings, refuses
    its errors and data that ends before the last row). All in one process, each followed by a good file: a refused
    file leaves nothing behind that changes the next decode."""
    r = np.random.default_rng(7)
    b = io.BytesIO()
    Image.fromarray(r.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(b, "JPEG", quality=85)
    src = b.getvalue()
    good = os.path.join(work, "after.jpg")
    Image.fromarray(smooth(30, 30, 3), "RGB").save(good, quality=90)
    files, want = [], []
    for t in range(200):
        k = bytearray(src)
        start, n = int(r.integers(2, len(k) - 2)), int(r.integers(1, 300))
        for p in range(start, min(start + n, len(k) - 2)):
            k[p] = int(r.integers(0, 256))
        path = os.path.join(work, f"corrupt-{t:03d}.jpg")
        open(path, "wb").write(bytes(k))
        try:
            pixels = np.asarray(Image.open(path).convert("RGB"))
            want.append(f"ok {pixels.shape[1]} {pixels.shape[0]} {fnv1a64(pixels.tobytes())}")
        except Exception:  # noqa: BLE001 (any refusal)
            want.append("error")
        files += [path, good]
    out = subprocess.run([TOOL, "decode-seq"] + files, capture_output=True, text=True, timeout=120).stdout.splitlines()
    alone = subprocess.run([TOOL, "decode-seq", good], capture_output=True, text=True, timeout=60).stdout.strip()
    failures, refused = 0, 0
    for t, w in enumerate(want):
        got, after = out[2 * t], out[2 * t + 1]
        name = os.path.basename(files[2 * t])
        if (got.split(":")[0] if got.startswith("error") else got) != w:
            failures += 1
            print(f"FAIL {name}: Pillow {w!r}, fanout {got!r}")
        if after != alone:
            failures += 1
            print(f"FAIL the good file after {name}: {after!r}, alone {alone!r}")
        refused += w == "error"
    if not 20 <= refused <= 180:
        failures += 1
        print(f"FAIL the corruptions should include files both kinds: Pillow refuses {refused} of 200")
    if not failures:
        print(f"ok   200 corrupted JPEGs: the same {200 - refused} decoded (same pixels) and {refused} refused as "
              "Pillow; a good file decodes alike after each")
    return failures


if __name__ == "__main__":
    main()
