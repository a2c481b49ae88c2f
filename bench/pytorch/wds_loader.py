#!/usr/bin/env python3
"""WebDataset's own loader on tar shards, images per second for each worker
count: the reference for loader-bench on wds:DIR. The pipeline of
WebDataset's ImageNet example: shards shuffled, a 1,000-sample shuffle
buffer, Pillow decoding, RandomResizedCrop + flip + ToTensor + ImageNet
Normalize, batches of --batch-size through torch's DataLoader with
--workers-list workers (each worker reads its own shards), every batch
touched.

  python wds_loader.py DIR [--size 224] [--batch-size 64] [--workers-list 1,2]
  python wds_loader.py --make-shards FOLDER DIR [--shards 8]   (FOLDER/{train,val}/<class>/... to DIR/{train,val}-*.tar)
"""
import argparse
import glob
import io
import os
import tarfile


def make_shards(folder, dst, n):
    """torchvision's ImageFolder layout to WebDataset shards: KEY.jpg/.png beside KEY.cls (the class index)."""
    os.makedirs(dst, exist_ok=True)
    for split in ("train", "val"):
        classes = sorted(d for d in os.listdir(os.path.join(folder, split)) if not d.startswith("."))
        items = [(os.path.join(folder, split, c, f), i) for i, c in enumerate(classes)
                 for f in sorted(os.listdir(os.path.join(folder, split, c))) if not f.startswith(".")]
        for k in range(n):
            with tarfile.open(os.path.join(dst, f"{split}-{k:06d}.tar"), "w") as t:
                for i, (path, label) in enumerate(items[k::n]):
                    key = f"s{k:03d}{i:06d}"
                    t.add(path, key + os.path.splitext(path)[1].lower())
                    cls = f"{label}\n".encode()
                    info = tarfile.TarInfo(key + ".cls")
                    info.size = len(cls)
                    t.addfile(info, io.BytesIO(cls))
        print(f"{split}: {len(items)} samples in {n} shards")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir", nargs="?")
    p.add_argument("--make-shards", nargs=2, metavar=("FOLDER", "DIR"))
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers-list", default="1,2")
    a = p.parse_args()
    if a.make_shards:
        return make_shards(*a.make_shards, a.shards)
    if not a.dir:
        p.error("give DIR (or --make-shards FOLDER DIR)")
    import torch
    import webdataset as wds
    from imagefolder_loader import timed, train_transform

    torch.set_num_threads(1)
    tf = train_transform(a.size)
    urls = sorted(glob.glob(os.path.join(a.dir, "train-*.tar")))
    count = sum(1 for u in urls for m in tarfile.open(u).getnames() if m.endswith(".cls"))
    print(f"webdataset {wds.__version__}, torch {torch.__version__}: {len(urls)} shards, {count} samples, "
          f"RandomResizedCrop({a.size}) + flip + ToTensor + Normalize, shuffle buffer 1000, batch {a.batch_size}")
    print(f"{'workers':>8} {'images/s':>12} {'seconds':>10}")
    for w in (int(v) for v in a.workers_list.split(",")):
        ds = (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.single_node_only,
                             workersplitter=wds.split_by_worker, empty_check=False)
              .shuffle(1000).decode("pil").to_tuple("jpg;png", "cls").map_tuple(tf, int)
              .batched(a.batch_size, partial=True))
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=w)
        images, s = timed(loader)
        print(f"{w:>8} {images / s:>12.0f} {s:>10.3f}  ({images} images)")


if __name__ == "__main__":
    main()
