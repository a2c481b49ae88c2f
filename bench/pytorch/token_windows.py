"""A token split as fanout's windows, for PyTorch trainers (nanogpt_train.py,
train_epochs.py): the file is nanoGPT's flat uint16, or an llm.c shard (256
int32 of header: magic 20240520, version, token count; then uint16 ids).
Window i is tokens [i * block, i * block + block + 1): x its first block
tokens, y the block after the first; (len - 1) // block windows."""
import os

import torch

import window_order

LLMC_MAGIC = 20240520


def read_tokens(path):
    """The file's token ids as an int64 tensor."""
    size = os.path.getsize(path)
    skip, count = 0, size // 2
    if size >= 1024:
        with open(path, "rb") as f:
            head = [int.from_bytes(f.read(4), "little", signed=True) for _ in range(3)]
        if head[0] == LLMC_MAGIC:
            skip, count = 512, head[2]
    data = torch.from_file(path, shared=False, size=skip + count, dtype=torch.int16)[skip:]
    # uint16 ids stored as int16: back to 0..65535.
    return data.to(torch.int64) & 0xFFFF


class Windows:
    """A split's windows as x and y rows; by index list (a whole batch) through
    batch() or [], as a DataLoader with a BatchSampler asks."""

    def __init__(self, path, block):
        tokens = read_tokens(path)
        self.n = window_order.num_windows(tokens.numel(), block)
        if self.n < 1:
            raise SystemExit(f"{path}: {tokens.numel()} tokens, shorter than one window of {block + 1}")
        self.x = tokens[:self.n * block].view(self.n, block)
        self.y = tokens[1:self.n * block + 1].view(self.n, block)

    def __len__(self):
        return self.n

    def batch(self, indices):
        i = torch.as_tensor(indices, dtype=torch.int64)
        return self.x[i], self.y[i]

    __getitem__ = batch
