#!/usr/bin/env python3
"""torchvision's ImageFolder + DataLoader on an image folder, images per second
for each worker count: the same transforms as fanout's loader-bench
(RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize with ImageNet's
statistics), shuffled, every batch touched. The reference for loader-bench on
imagefolder:DIR.
  python imagefolder_loader.py DIR [--size 224] [--batch-size 64] [--workers-list 1,2] [--epochs 1]"""
import argparse
import time

import torch
from torchvision import datasets, transforms


def train_transform(size):
    """RandomResizedCrop(size), a flip, ToTensor, ImageNet's Normalize: loader-bench's augmentation."""
    return transforms.Compose([
        transforms.RandomResizedCrop(size),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    ])


def timed(loader, epochs=1):
    """(images, seconds) of `epochs` passes over loader, each batch touched."""
    images, total = 0, 0.0
    t0 = time.perf_counter()
    for _ in range(epochs):
        for x, y in loader:
            total += float(x[0, 0, 0, 0])
            images += x.shape[0]
    return images, time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers-list", default="1,2")
    p.add_argument("--epochs", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(1)
    ds = datasets.ImageFolder(f"{a.dir}/train", train_transform(a.size))
    print(f"torchvision {__import__('torchvision').__version__}, torch {torch.__version__}: ImageFolder {a.dir}/train, "
          f"{len(ds)} images, RandomResizedCrop({a.size}) + flip + ToTensor + Normalize, batch {a.batch_size}")
    print(f"{'workers':>8} {'images/s':>12} {'seconds':>10}")
    for w in (int(v) for v in a.workers_list.split(",")):
        loader = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=w,
                                             persistent_workers=False)
        images, s = timed(loader, a.epochs)
        print(f"{w:>8} {images / s:>12.0f} {s:>10.3f}")


if __name__ == "__main__":
    main()
