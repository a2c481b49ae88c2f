#!/usr/bin/env python3
"""Interop between fanout's safetensors I/O and the reference implementation
(the Python `safetensors` package, the one PyTorch users load weights with).

1. st_tool writes a file; safetensors.numpy.load_file reads it: names, dtypes,
   shapes, values and metadata must be what st_tool wrote.
2. safetensors.numpy.save_file writes a file; `st_tool dump` reads it: every
   value must come back bit for bit.
3. float16 files read back exactly; files the reference writes but fanout
   does not support (I16) or truncated files make st_tool fail with a
   message, not a crash.
4. `st_tool npy` writes the same tensors with io::save_npy; numpy.load reads
   them back exactly.
5. numpy.save (format 1.0) and np.lib.format.write_array (versions 2.0 and
   3.0) write arrays; `st_tool npyload` (io::load_npy) reads them back
   exactly (float16 included). Fortran-order, big-endian, int16 and object arrays fail with a
   one-line message naming the file.

Usage: safetensors_interop.py [ST_TOOL]   (or ST_TOOL in the environment)
Needs: pip install safetensors numpy
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from interop import check, finish, require, tool_path  # noqa: E402  (the shared helpers)

require("safetensors_interop.py", "numpy", "safetensors")
import numpy as np  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

DTYPES = {"F32": np.float32, "I32": np.int32, "I64": np.int64, "U8": np.uint8, "F64": np.float64, "F16": np.float16}
FLOATS = (np.float16, np.float32, np.float64)


def sample(dtype, shape):
    """The values st_tool writes (see sample_value in st_tool.cpp)."""
    i = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    if dtype == np.float32:
        v = i * 0.25 - 3.0
    elif dtype == np.int32:
        v = i * 7 - 20
    elif dtype == np.int64:
        v = 1_000_000_000_000 * (i + 1) + i
    elif dtype == np.float64:
        v = i / 3.0 - 1.0
    else:
        v = (i * 37) % 256
    return v.astype(dtype).reshape(shape)


# What `st_tool write` writes, in its order.
WRITTEN = [
    ("layer1.0.conv1.weight", np.float32, (4, 3, 2, 2)),
    ("fc.bias", np.float32, (10,)),
    ("bn.num_batches_tracked", np.int64, ()),
    ("labels", np.int32, (2, 3)),
    ("pixels", np.uint8, (2, 2, 3)),
    ("counts", np.int64, (3,)),
    ("doubles", np.float64, (2, 3)),
    ("empty", np.float32, (0, 3)),
    ("five_d", np.float32, (1, 2, 1, 2, 2)),
    ("\u00fcnicode.weight", np.float32, (2,)),
]
WRITTEN_METADATA = {"format": "pt", "note": "fanout \u2713"}

def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def st_tool(tool, *args):
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=60)


def cpp_to_python(tool, d):
    path = os.path.join(d, "from_cpp.safetensors")
    r = st_tool(tool, "write", path)
    check(r.returncode == 0, f"st_tool write failed: {r.stderr}")
    if r.returncode != 0:
        return
    loaded = load_file(path)  # the reference validates the layout strictly
    check(sorted(loaded) == sorted(n for n, _, _ in WRITTEN), f"names: {sorted(loaded)}")
    for name, dtype, shape in WRITTEN:
        if name not in loaded:
            continue
        a = loaded[name]
        check(a.dtype == dtype, f"{name}: dtype {a.dtype}, expected {np.dtype(dtype)}")
        check(a.shape == shape, f"{name}: shape {a.shape}, expected {shape}")
        check(same(a, sample(dtype, shape)), f"{name}: values differ: {a.ravel()[:8]}")
    with safe_open(path, framework="np") as f:
        check(f.metadata() == WRITTEN_METADATA, f"metadata {f.metadata()}")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
    check(n % 8 == 0, f"header length {n} is not a multiple of 8")
    print(f"C++ -> Python: {len(loaded)} tensors read by safetensors.numpy.load_file")


def edge_arrays(rng, floats, ints, longs, nbytes):
    """float32 of shape `floats` whose first row starts with a signed zero, a
    subnormal and the largest float; random int32, int64 and uint8 arrays."""
    f = rng.standard_normal(floats).astype(np.float32)
    f[0, :3] = [-0.0, 1e-40, np.finfo(np.float32).max]
    return {
        "floats": f,
        "ints": rng.integers(-2**31, 2**31, size=ints, dtype=np.int32),
        "longs": rng.integers(-2**63, 2**63 - 1, size=longs, dtype=np.int64),
        "bytes": rng.integers(0, 256, size=nbytes, dtype=np.uint8),
    }


def check_printed(t, want, what):
    """A tensor st_tool printed as JSON (dtype, shape, values) equals want, bit
    for bit in C order; False when any part differs."""
    dtype = DTYPES.get(t["dtype"])
    ok = dtype is not None and np.dtype(dtype) == want.dtype
    check(ok, f"{what}: dtype {t['dtype']} vs {want.dtype}")
    check(tuple(t["shape"]) == want.shape, f"{what}: shape {t['shape']} vs {want.shape}")
    if not ok or tuple(t["shape"]) != want.shape:
        return False
    values = np.array(t["values"], dtype=np.float64 if dtype in FLOATS else object)
    equal = same(values.astype(dtype).reshape(t["shape"]), want)
    check(equal, f"{what}: values differ")
    return equal


def python_to_cpp(tool, d):
    rng = np.random.default_rng(0)
    tensors = {
        **edge_arrays(rng, (3, 5), (4, 7), (5,), (3, 1, 5)),
        "conv.weight": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
        "bn.num_batches_tracked": np.array(123456789012345, dtype=np.int64),
        "doubles": rng.standard_normal((2, 3)),
        "vol": rng.standard_normal((2, 1, 3, 2, 2)).astype(np.float32),
        "nothing": np.zeros((0, 4), dtype=np.float32),
    }
    meta = {"format": "np", "step": "1200", "\u00e9": "\u2713"}
    path = os.path.join(d, "from_py.safetensors")
    save_file(tensors, path, metadata=meta)
    r = st_tool(tool, "dump", path)
    check(r.returncode == 0, f"st_tool dump failed: {r.stderr}")
    if r.returncode != 0:
        return
    out = json.loads(r.stdout)
    check(out["metadata"] == meta, f"metadata {out['metadata']}")
    got = {t["name"]: t for t in out["tensors"]}
    check(sorted(got) == sorted(tensors), f"names {sorted(got)}")
    for name, want in tensors.items():
        if name not in got:
            continue
        check_printed(got[name], want, name)
    # The reference orders data by alignment then name; fanout reports data order.
    print(f"Python -> C++: {len(got)} tensors read by st_tool")


def bad_files(tool, d):
    # float16 (what torch saves for half-precision models) reads back exactly.
    path = os.path.join(d, "f16.safetensors")
    half = (np.arange(-6, 6, dtype=np.float32) * 0.375).astype(np.float16).reshape(3, 4)
    half[0, 0] = np.float16(6.0e-8)  # a subnormal
    save_file({"half": half}, path)
    r = st_tool(tool, "dump", path)
    ok = r.returncode == 0
    if ok:
        t = json.loads(r.stdout)["tensors"][0]
        ok = t["dtype"] == "F16" and tuple(t["shape"]) == (3, 4) and same(
            np.array(t["values"], dtype=np.float64).astype(np.float16).reshape(3, 4), half)
    check(ok, f"F16 file: rc {r.returncode}, {r.stdout[:200]!r} {r.stderr!r}")

    # A dtype the reference writes but fanout does not support.
    path = os.path.join(d, "i16.safetensors")
    save_file({"short": np.ones((2, 2), dtype=np.int16)}, path)
    r = st_tool(tool, "dump", path)
    check(r.returncode == 1 and "I16" in r.stderr and path in r.stderr, f"I16 file: rc {r.returncode}, {r.stderr!r}")

    # Truncated copies of a valid file.
    good = os.path.join(d, "from_cpp.safetensors")
    with open(good, "rb") as f:
        data = f.read()
    for keep in (0, 6, 8, 40, len(data) - 1):
        path = os.path.join(d, f"cut{keep}.safetensors")
        with open(path, "wb") as f:
            f.write(data[:keep])
        r = st_tool(tool, "dump", path)
        check(r.returncode == 1 and path in r.stderr and r.stderr.count("\n") == 1,
              f"truncated to {keep} bytes: rc {r.returncode}, {r.stderr!r}")
    print("bad files: clear errors")


def npy_to_numpy(tool, d):
    """io::save_npy's files load with numpy.load: dtype, shape, values, and
    data starting on a 64-byte boundary."""
    out = os.path.join(d, "npy")
    os.makedirs(out)
    r = st_tool(tool, "npy", out)
    check(r.returncode == 0, f"st_tool npy failed: {r.stderr}")
    if r.returncode != 0:
        return
    for i, (name, dtype, shape) in enumerate(WRITTEN):
        path = os.path.join(out, f"{i}.npy")
        a = np.load(path, allow_pickle=False)
        check(a.dtype == dtype and a.shape == shape, f"{name}.npy: {a.dtype} {a.shape}, expected {np.dtype(dtype)} {shape}")
        check(same(a, sample(dtype, shape)), f"{name}.npy: values differ: {a.ravel()[:8]}")
        with open(path, "rb") as f:
            head = f.read(10)
        check(head[:8] == b"\x93NUMPY\x01\x00" and (10 + int.from_bytes(head[8:10], "little")) % 64 == 0,
              f"{name}.npy: header {head!r}")
    print(f"C++ -> numpy: {len(WRITTEN)} .npy files read by numpy.load")


def numpy_to_cpp(tool, d):
    """Files numpy writes load with io::load_npy: dtype, shape and every bit."""
    rng = np.random.default_rng(1)
    arrays = {
        **edge_arrays(rng, (4, 6), (5, 3), (7,), (2, 1, 9)),
        "vol": rng.standard_normal((2, 3, 4, 5, 2)).astype(np.float32),
        "doubles": rng.standard_normal((3, 2)),
        "halves": rng.standard_normal((3, 5)).astype(np.float16),
        "scalar": np.array(-2.5, dtype=np.float64),
        "scalar_long": np.array(123456789012345, dtype=np.int64),
        "empty": np.zeros((0,), dtype=np.float32),
        "empty_mid": np.zeros((3, 0, 2), dtype=np.int32),
        "strided": rng.standard_normal((6, 8)).astype(np.float32)[::2, 1::3],  # saved in C order
    }
    count = 0
    for version in (None, (2, 0), (3, 0)):
        for name, want in arrays.items():
            path = os.path.join(d, f"{name}_{version[0] if version else 1}.npy")
            if version is None:
                np.save(path, want)
            else:
                with open(path, "wb") as f:
                    np.lib.format.write_array(f, want, version=version)
            with open(path, "rb") as f:
                head = f.read(8)
            check(head == b"\x93NUMPY" + bytes([version[0] if version else 1, 0]), f"{path}: header {head!r}")
            r = st_tool(tool, "npyload", path)
            check(r.returncode == 0, f"st_tool npyload {path} failed: {r.stderr}")
            if r.returncode != 0:
                continue
            if check_printed(json.loads(r.stdout), want, path):
                count += 1

    # What numpy writes but fanout refuses, each with one line naming the file.
    refused = {
        "fortran": (np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)), "fortran_order is True"),
        "big_endian": (np.arange(4, dtype=">f4"), "big-endian"),
        "short": (np.ones(3, dtype=np.int16), "'<i2' is not supported"),
        "bool": (np.ones(3, dtype=bool), "'|b1' is not supported"),
        "object": (np.array([1, "a"], dtype=object), "object array"),
        "structured": (np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]), "structured dtype"),
    }
    for name, (arr, needle) in refused.items():
        path = os.path.join(d, f"refused_{name}.npy")
        np.save(path, arr, allow_pickle=True)
        r = st_tool(tool, "npyload", path)
        check(r.returncode == 1 and needle in r.stderr and path in r.stderr and r.stderr.count("\n") == 1,
              f"{name}: rc {r.returncode}, {r.stderr!r}")
    print(f"numpy -> C++: {count} .npy files (versions 1.0, 2.0, 3.0) read by io::load_npy, "
          f"{len(refused)} refused with one line")


def main():
    tool = tool_path("safetensors_interop.py", "ST_TOOL", "st_tool")
    with tempfile.TemporaryDirectory(prefix="fanout_interop_") as d:
        cpp_to_python(tool, d)
        python_to_cpp(tool, d)
        bad_files(tool, d)
        npy_to_numpy(tool, d)
        numpy_to_cpp(tool, d)
    return finish("safetensors_interop.py")


if __name__ == "__main__":
    sys.exit(main())
