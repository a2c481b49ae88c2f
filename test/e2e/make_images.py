#!/usr/bin/env python3
"""make_images.py DIR [--train N] [--val N] [--min-side A] [--max-side B] [--size WxH] [--quality Q] [--png P]
[--seed S]: writes a 10-class image folder in torchvision's ImageFolder layout,
DIR/{train,val}/<class>/<i>.jpg, that a small network can learn under random
crops and flips: each class is a texture (stripes across or along, checks,
dots, speckle) in one of two palettes, at a random scale, phase and size,
with noise. --png: the fraction of files written as PNG instead of JPEG."""
import argparse
import os

import numpy as np
from PIL import Image

PATTERNS = ("across", "along", "checks", "dots", "speckle")
PALETTES = (((200, 60, 40), (250, 210, 80)), ((30, 70, 190), (120, 220, 230)))


def texture(kind, h, w, period, phase, rng):
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    if kind == "across":
        t = np.sin(2 * np.pi * (y + phase) / period)
    elif kind == "along":
        t = np.sin(2 * np.pi * (x + phase) / period)
    elif kind == "checks":
        t = np.sin(2 * np.pi * (x + phase) / period) * np.sin(2 * np.pi * (y + phase) / period)
    elif kind == "dots":
        t = np.cos(2 * np.pi * (x + phase) / period) + np.cos(2 * np.pi * (y + phase) / period) - 1
    else:
        t = rng.uniform(-1, 1, (h, w))
    return (t > 0).astype(np.float64)


def image(label, h, w, rng):
    kind = PATTERNS[label % 5]
    a, b = (np.array(c, np.float64) for c in PALETTES[label // 5])
    t = texture(kind, h, w, rng.uniform(6, 12), rng.uniform(0, 12), rng)
    img = a * (1 - t[..., None]) + b * t[..., None] + rng.normal(0, 12, (h, w, 3))
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--train", type=int, default=40, help="images per class in train")
    p.add_argument("--val", type=int, default=10, help="images per class in val")
    p.add_argument("--min-side", type=int, default=40)
    p.add_argument("--max-side", type=int, default=80)
    p.add_argument("--size", help="WxH for every image (instead of random sides)")
    p.add_argument("--quality", type=int, default=90)
    p.add_argument("--png", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    fixed = tuple(int(v) for v in a.size.split("x")) if a.size else None
    for split, n in (("train", a.train), ("val", a.val)):
        for label in range(10):
            folder = os.path.join(a.dir, split, f"class{label}")
            os.makedirs(folder, exist_ok=True)
            for i in range(n):
                w, h = fixed or rng.integers(a.min_side, a.max_side + 1, 2)
                im = image(label, int(h), int(w), rng)
                if rng.uniform() < a.png:
                    im.save(os.path.join(folder, f"{i:05d}.png"))
                else:
                    im.save(os.path.join(folder, f"{i:05d}.jpg"), quality=a.quality)


if __name__ == "__main__":
    main()
