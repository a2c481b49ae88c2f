#!/usr/bin/env python3
"""Checkpoints hold what PyTorch expects, not only the right names and shapes:
an independent NumPy forward pass over a checkpoint's tensors (read with
safetensors.numpy, laid out as torch's: conv weights (O, I, kH, kW), linear
weights (out, in) with y = x W^T + b, BatchNorm in eval mode with its running
statistics) must give the logits fanout computed with the same tensors.

fanout's logits are read through dp-train's evaluation, which reports the mean
cross-entropy and the accuracy over the test set in --metrics:
1. lenet (28x28 IDX files written here, read as fashion-mnist:DIR) and
   resnet18 (32x32x3, CIFAR-10 binary files, so every BasicBlock, with and
   without its downsample shortcut) train briefly and save a checkpoint;
   the test loss and accuracy dp-train reports with those tensors equal
   NumPy's over the same test images.
2. Each class's log-probability, -log_softmax(logits)[c], one image at a time:
   a run with --init-from the trained checkpoint, a learning rate too small to
   move it (1e-30: --lr must be positive) and a test set of that image
   labelled c reports exactly that as its test loss. Its saved checkpoint
   (resnet18's running statistics move with the one training step) is what
   NumPy evaluates; the ten runs must save the same tensors.
3. The comparison can fail: the same NumPy pass with one weight in the wrong
   order under the right shape (lenet: conv2's 5x5 kernels transposed;
   resnet18: layer1.0.conv1.weight's square (64, 64) out/in axes swapped) must
   miss the tolerance.

Usage: forward_interop.py [DP_TRAIN]   (or DP_TRAIN in the environment)
Needs: pip install safetensors numpy
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from interop import check, finish, require, tool_path  # noqa: E402  (the shared helpers)

require("forward_interop.py", "numpy", "safetensors")
import numpy as np  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

DP_TRAIN = tool_path("forward_interop.py", "DP_TRAIN", "dp-train")

# fanout computes in float32, the reference in float64.
TOL = {"lenet": (2e-5, 2e-5), "resnet18": (1e-4, 1e-4)}  # (absolute, relative)
# The constants dp-train normalizes with (runtime/data/idx.cpp, cifar10.cpp).
MEAN_STD = {"lenet": ([0.2860], [0.3530]),
            "resnet18": ([0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616])}

# --- data files dp-train reads ---------------------------------------------

def images(rng, n, c, hw):
    """n uint8 images (n, c, hw, hw) with labels: a class-dependent bright
    square on noise, so a few steps of training move the logits apart."""
    labels = rng.integers(0, 10, n)
    x = rng.integers(0, 96, (n, c, hw, hw))
    for i, y in enumerate(labels):
        r, q = divmod(int(y), 4)
        s = hw // 4
        x[i, :, r * s:(r + 1) * s, q * s:(q + 1) * s] += 150
    return x.astype(np.uint8), labels.astype(np.uint8)


def write_idx(d, split, x, y):
    n = len(y)
    with open(os.path.join(d, f"{split}-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">iiii", 0x803, n, x.shape[2], x.shape[3]) + x.tobytes())
    with open(os.path.join(d, f"{split}-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">ii", 0x801, n) + y.tobytes())


def write_cifar(path, x, y):
    with open(path, "wb") as f:
        for i in range(len(y)):
            f.write(bytes([int(y[i])]) + x[i].tobytes())


def write_data(model, d, train, test):
    """train, test: (images, labels). Returns the --data spec."""
    os.makedirs(d)
    if model == "lenet":
        write_idx(d, "train", *train)
        write_idx(d, "t10k", *test)
        return f"fashion-mnist:{d}"
    parts = np.array_split(np.arange(len(train[1])), 5)
    for k, idx in enumerate(parts):
        write_cifar(os.path.join(d, f"data_batch_{k + 1}.bin"), train[0][idx], train[1][idx])
    write_cifar(os.path.join(d, "test_batch.bin"), *test)
    return f"cifar10:{d}"


def dp_train(model, data, save_dir, metrics, batch, extra, epochs=1):
    """Trains; returns the last epoch's metrics and the checkpoint saved after it."""
    cmd = [DP_TRAIN, "--model", model, "--data", data, "--devices", "cpu", "--epochs", str(epochs), "--batch-size",
           str(batch), "--workers", "0", "--progress", "off", "--seed", "5", "--save-dir", save_dir, "--metrics",
           metrics] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited with {r.returncode}:\n{r.stdout}{r.stderr}")
    rows = [json.loads(line) for line in open(metrics)]
    assert len(rows) == epochs, rows
    return rows[-1], load_file(os.path.join(save_dir, f"epoch-{epochs:04d}.safetensors"))


# --- the reference forward pass ---------------------------------------------

def normalize(model, x):
    """dp-train's input: (x / 255 - mean) / std per channel, as float32 x * scale + shift."""
    mean, std = MEAN_STD[model]
    out = np.empty(x.shape, np.float32)
    for ch in range(x.shape[1]):
        m, s = np.float32(mean[ch]), np.float32(std[ch])
        scale, shift = np.float32(1) / (np.float32(255) * s), -m / s
        out[:, ch] = x[:, ch].astype(np.float32) * scale + shift
    return out.astype(np.float64)


class Tensors:
    """A checkpoint's model tensors as float64; records which were read."""

    def __init__(self, st):
        self.t = {k: v for k, v in st.items() if not k.startswith("optimizer.")}
        self.used = set()

    def __getitem__(self, k):
        self.used.add(k)
        return self.t[k].astype(np.float64)

    def unused(self):
        return sorted(k for k in self.t if k not in self.used and not k.endswith("num_batches_tracked"))


def conv2d(x, w, b=None, stride=1, pad=0):
    """x (N, C, H, W), w (O, C, kH, kW): torch.nn.functional.conv2d."""
    kh, kw = w.shape[2:]
    assert x.shape[1] == w.shape[1], (x.shape, w.shape)
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::stride, ::stride]
    y = np.tensordot(win, w, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)  # (N, O, Ho, Wo)
    return y if b is None else y + b[None, :, None, None]


def linear(x, w, b):
    return x @ w.T + b


def relu(x):
    return np.maximum(x, 0)


def maxpool2(x):
    n, c, h, w = x.shape
    return x[:, :, :h // 2 * 2, :w // 2 * 2].reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def batchnorm(x, t, name):
    """Eval mode: the running statistics, eps 1e-5."""
    g, b = t[name + ".weight"], t[name + ".bias"]
    m, v = t[name + ".running_mean"], t[name + ".running_var"]
    return (x - m[None, :, None, None]) / np.sqrt(v + 1e-5)[None, :, None, None] * g[None, :, None, None] \
        + b[None, :, None, None]


def lenet(t, x):
    pad = (32 - x.shape[2] + 1) // 2 if x.shape[2] < 32 else 0  # 28x28 sees 32x32's geometry
    x = maxpool2(relu(conv2d(x, t["conv1.weight"], t["conv1.bias"], pad=pad)))
    x = maxpool2(relu(conv2d(x, t["conv2.weight"], t["conv2.bias"])))
    x = x.reshape(x.shape[0], -1)  # (C, H, W) order
    x = relu(linear(x, t["fc1.weight"], t["fc1.bias"]))
    x = relu(linear(x, t["fc2.weight"], t["fc2.bias"]))
    return linear(x, t["fc3.weight"], t["fc3.bias"])


def basic_block(t, p, x, cin, cout, stride):
    """torchvision's BasicBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))."""
    y = relu(batchnorm(conv2d(x, t[p + "conv1.weight"], stride=stride, pad=1), t, p + "bn1"))
    y = batchnorm(conv2d(y, t[p + "conv2.weight"], pad=1), t, p + "bn2")
    if stride != 1 or cin != cout:
        x = batchnorm(conv2d(x, t[p + "downsample.0.weight"], stride=stride), t, p + "downsample.1")
    return relu(y + x)


def resnet18(t, x):
    """CIFAR stem: conv1 3x3 stride 1, no max pool."""
    x = relu(batchnorm(conv2d(x, t["conv1.weight"], pad=1), t, "bn1"))
    c = 64
    for i, width in enumerate((64, 128, 256, 512)):
        x = basic_block(t, f"layer{i + 1}.0.", x, c, width, 1 if i == 0 else 2)
        x = basic_block(t, f"layer{i + 1}.1.", x, width, width, 1)
        c = width
    x = x.mean(axis=(2, 3))
    return linear(x, t["fc.weight"], t["fc.bias"])


FORWARD = {"lenet": lenet, "resnet18": resnet18}


def corrupt(model, st):
    """One weight in the wrong order under the right shape."""
    st = dict(st)
    if model == "lenet":
        st["conv2.weight"] = np.ascontiguousarray(st["conv2.weight"].transpose(0, 1, 3, 2))
    else:
        st["layer1.0.conv1.weight"] = np.ascontiguousarray(st["layer1.0.conv1.weight"].transpose(1, 0, 2, 3))
    return st


def logits(model, st, x):
    t = Tensors(st)
    z = FORWARD[model](t, normalize(model, x))
    left = t.unused()
    check(not left, f"{model}: checkpoint tensors the reference never read: {left}")
    return z


def neg_log_softmax(z):
    """(N, classes): -log_softmax, i.e. each class's cross-entropy."""
    m = z.max(axis=1, keepdims=True)
    return m + np.log(np.exp(z - m).sum(axis=1, keepdims=True)) - z


def close(a, b, model):
    atol, rtol = TOL[model]
    return bool(np.all(np.abs(np.asarray(a) - np.asarray(b)) <= atol + rtol * np.abs(np.asarray(b))))


# --- the checks ---------------------------------------------------------------

def run_model(model, work, rng):
    c, hw = (1, 28) if model == "lenet" else (3, 32)
    n_train, n_test, batch, epochs, lr = (512, 40, 32, 3, "0.05") if model == "lenet" else (100, 8, 10, 1, "0.01")
    train, test = images(rng, n_train, c, hw), images(rng, n_test, c, hw)

    # 1. A trained checkpoint; dp-train's test loss and accuracy over n_test images.
    d = os.path.join(work, model)
    data = write_data(model, d + "-data", train, test)
    row, st = dp_train(model, data, d + "-ckpt", d + ".jsonl", batch, ["--lr", lr], epochs)
    y = test[1].astype(np.int64)
    nls = neg_log_softmax(logits(model, st, test[0]))
    loss, acc = float(nls[np.arange(len(y)), y].mean()), float((nls.argmin(axis=1) == y).mean())
    print(f"{model}: test loss {row['test_loss']:.7f} (NumPy {loss:.7f}), accuracy {row['test_acc']:.4f} "
          f"(NumPy {acc:.4f}), {len(y)} images")
    check(close(row["test_loss"], loss, model), f"{model}: test loss {row['test_loss']} but NumPy gives {loss}")
    # A class whose log-probability is within the tolerance of the best may go either way.
    best = np.sort(nls, axis=1)
    ties = int(np.sum(best[:, 1] - best[:, 0] <= 2 * TOL[model][0]))
    check(abs(row["test_acc"] - acc) * len(y) <= ties + 1e-9,
          f"{model}: test accuracy {row['test_acc']} but NumPy gives {acc}")
    wrong = neg_log_softmax(logits(model, corrupt(model, st), test[0]))
    wrong_loss = float(wrong[np.arange(len(y)), y].mean())
    print(f"{model}: with the corrupted weight NumPy gives test loss {wrong_loss:.7f}")
    check(not close(row["test_loss"], wrong_loss, model), f"{model}: a corrupted weight still passes (test loss)")

    # 2. Every class's log-probability for two test images (resnet18: one).
    trained = os.path.join(d + "-ckpt", f"epoch-{epochs:04d}.safetensors")
    one = (train[0][:5], train[1][:5])  # one training batch
    for i in range(2 if model == "lenet" else 1):
        got, saved = [], None
        for label in range(10):
            e = os.path.join(work, f"{model}-img{i}-label{label}")
            data = write_data(model, e + "-data", one, (test[0][i:i + 1], np.array([label], np.uint8)))
            r, s = dp_train(model, data, e + "-ckpt", e + ".jsonl", 5,
                            ["--init-from", trained, "--lr", "1e-30", "--momentum", "0", "--weight-decay", "0"])
            got.append(r["test_loss"])
            if saved is None:
                saved = s
            else:  # the same tensors in every run, so the ten losses belong to one set of logits
                check(saved.keys() == s.keys() and all(saved[k].tobytes() == s[k].tobytes() for k in saved),
                      f"{model} image {i}: the run for label {label} saved other tensors")
        want = neg_log_softmax(logits(model, saved, test[0][i:i + 1]))[0]
        worst = float(np.max(np.abs(np.array(got) - want)))
        print(f"{model} image {i}: -log_softmax over 10 classes, largest difference {worst:.2e}")
        check(close(got, want, model),
              f"{model} image {i}: -log_softmax {got} but NumPy gives {[float(v) for v in want]}")
        bad = neg_log_softmax(logits(model, corrupt(model, saved), test[0][i:i + 1]))[0]
        print(f"{model} image {i}: with the corrupted weight, largest difference "
              f"{float(np.max(np.abs(np.array(got) - bad))):.2e}")
        check(not close(got, bad, model), f"{model} image {i}: a corrupted weight still passes (-log_softmax)")


def main():
    rng = np.random.default_rng(29)
    with tempfile.TemporaryDirectory() as work:
        for model in ("lenet", "resnet18"):
            run_model(model, work, rng)
    sys.exit(finish("forward_interop.py"))


if __name__ == "__main__":
    main()
