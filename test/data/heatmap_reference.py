#!/usr/bin/env python3
"""fanout's landmark heatmaps (runtime/data/heatmap.h) against an independent
NumPy implementation of the definition (CenterNet's draw_gaussian in 2D and
3D): per landmark, exp(-|v - c|^2 / (2 sigma^2)) in float64 over the whole
volume (np.ogrid), c = floor(coord + 0.5), zero outside the (2r+1)^dims
window and below float32 epsilon times the peak, merged by np.maximum.

Random landmarks (inside, across each border, fully outside, on half voxels)
go to heatmap_tool as .npy files (np.save, read by io::load_npy); its output
(io::save_npy) comes back through np.load. fanout evaluates the Gaussian as a
product of per-axis float32 factors, so values agree to 5 * 2^-24 relative,
and zeros agree except within that distance of the threshold.

Usage: heatmap_reference.py [HEATMAP_TOOL]   (or HEATMAP_TOOL in the environment)
Needs: pip install numpy
"""
import functools
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from interop import check, finish, require, tool_path  # noqa: E402  (the shared helpers)

require("heatmap_reference.py", "numpy")
import numpy as np  # noqa: E402

EPS32 = float(np.finfo(np.float32).eps)
REL = 5 * 2.0**-24  # heatmap.h: three factor roundings, two products


def reference(landmarks, channels, c, size, radius, sigma):
    """(C, *size) float64: the definition, voxel by voxel over the whole volume;
    and where some landmark's value is too close to the threshold to call."""
    if sigma == 0:
        sigma = (2 * radius + 1) / 6.0
    out = np.zeros((c,) + tuple(size))
    near = np.zeros(out.shape, dtype=bool)
    grid = np.ogrid[tuple(slice(0, n) for n in size)]
    for coord, ch in zip(landmarks, channels):
        center = np.floor(coord.astype(np.float64) + 0.5)
        offsets = [g - ci for g, ci in zip(grid, center)]
        window = functools.reduce(np.logical_and, [np.abs(o) <= radius for o in offsets])
        g = np.exp(-sum(o * o for o in offsets) / (2 * sigma * sigma))
        peak = 1.0  # exp(0) at the center
        near[ch] |= window & (np.abs(g - EPS32 * peak) <= 2 * REL * EPS32 * peak)
        g = np.where(window & (g >= EPS32 * peak), g, 0.0)
        out[ch] = np.maximum(out[ch], g)
    return out, near


def random_landmarks(rng, k, size, radius):
    """(K, S) float32: the first inside, the rest a mixture of every case."""
    pts = np.empty((k, len(size)), dtype=np.float32)
    for i in range(k):
        for a, n in enumerate(size):
            case = 4 if i == 0 else rng.integers(0, 6)
            if case == 0:  # window across 0
                v = -radius - 0.5 + rng.random() * (radius + 1)
            elif case == 1:  # window across n - 1
                v = n - 0.5 + rng.random() * (radius + 1)
            elif case == 2:  # window entirely outside
                v = rng.choice([-1, 1]) * (n + radius + 2 + 10 * rng.random())
            elif case == 3:  # half voxel: rounds up
                v = rng.integers(0, n) + 0.5
            else:
                v = -0.49 + rng.random() * n
            pts[i, a] = v
    return pts


def run_case(tool, d, name, rng, size, radius, sigma=0.0, k=6, c=None, batch=None):
    shared = c is not None
    c = c if shared else k
    lm = (np.stack([random_landmarks(rng, k, size, radius) for _ in range(batch)]) if batch
          else random_landmarks(rng, k, size, radius))
    channels = rng.integers(0, c, size=k).astype(np.int32) if shared else np.arange(k, dtype=np.int32)
    lm_path = os.path.join(d, f"{name}_landmarks.npy")
    ch_path = os.path.join(d, f"{name}_channels.npy")
    out_path = os.path.join(d, f"{name}_out.npy")
    np.save(lm_path, lm)
    np.save(ch_path, channels)
    args = [tool, lm_path, ch_path if shared else "-", str(c), str(radius), repr(float(sigma)), out_path]
    r = subprocess.run(args + [str(n) for n in size], capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"{name}: heatmap_tool failed: {r.stderr}")
    if r.returncode != 0:
        return
    got = np.load(out_path, allow_pickle=False)
    refs = [reference(s, channels, c, size, radius, sigma) for s in (lm if batch else [lm])]
    want = np.stack([w for w, _ in refs]) if batch else refs[0][0]
    near = np.stack([n for _, n in refs]) if batch else refs[0][1]
    check(got.dtype == np.float32 and got.shape == want.shape, f"{name}: {got.dtype} {got.shape} vs {want.shape}")
    if got.shape != want.shape:
        return
    check(np.count_nonzero(want) > 0, f"{name}: the reference is all zero (bad case)")
    g = got.astype(np.float64)
    err = np.abs(g - want)
    bad = (err > REL * want) & ~near
    check(not bad.any(), f"{name}: {np.count_nonzero(bad)} voxels off by more than {REL:.3g} relative "
          f"(largest {np.max(np.where(bad, err, 0)):.3g} absolute)")
    mismatched = ((g == 0) != (want == 0)) & ~near
    check(not mismatched.any(), f"{name}: {np.count_nonzero(mismatched)} voxels zero in one and not the other")
    check(np.max(g) == 1.0, f"{name}: peak {np.max(g)}, expected 1")
    print(f"{name}: {got.shape} radius {radius} sigma {sigma or (2 * radius + 1) / 6:.3g}: "
          f"{np.count_nonzero(got)} non-zero voxels agree")


def main():
    tool = tool_path("heatmap_reference.py", "HEATMAP_TOOL", "heatmap_tool")
    rng = np.random.default_rng(2024)
    with tempfile.TemporaryDirectory(prefix="fanout_heatmap_") as d:
        for radius in (0, 1, 2, 7):
            run_case(tool, d, f"3d_r{radius}", rng, (13, 17, 11), radius)
        for radius in (0, 3, 10):
            run_case(tool, d, f"2d_r{radius}", rng, (31, 23), radius)
        run_case(tool, d, "3d_narrow_sigma", rng, (15, 12, 19), 5, sigma=0.6)
        run_case(tool, d, "2d_narrow_sigma", rng, (21, 25), 6, sigma=0.55)
        run_case(tool, d, "3d_shared_channels", rng, (11, 14, 9), 4, k=9, c=3)
        run_case(tool, d, "2d_shared_channels", rng, (27, 19), 5, k=8, c=2)
        run_case(tool, d, "3d_batch", rng, (9, 12, 10), 4, k=4, batch=3)
        run_case(tool, d, "3d_large", rng, (24, 40, 36), 10, k=8)
    return finish("heatmap_reference.py")


if __name__ == "__main__":
    sys.exit(main())
