"""GPT in PyTorch as nanoGPT's model.py builds it (GPT-2's architecture), with
nanoGPT's parameter names, so that fanout's GPT (models/zoo/gpt.h) and this
one load each other's weights: token and position embeddings
(transformer.wte, transformer.wpe), dropout, n_layer pre-LayerNorm Blocks
(ln_1, attn (one c_attn projecting to q, k, v; causal
F.scaled_dot_product_attention; c_proj), ln_2, mlp (c_fc, exact GELU,
c_proj)), a final LayerNorm (transformer.ln_f) and lm_head, whose weight is
wte's (tied). LayerNorm and Linear take bias=False together (config.bias).

Initialization as nanoGPT's: N(0, 0.02) weights, N(0, 0.02 / sqrt(2 n_layer))
for the residual projections (c_proj), zero biases, LayerNorm weights 1.

fanout's state_dict has the tied weight once (transformer.wte.weight);
load_fanout_state() takes such a dict.

  import gpt
  model = gpt.GPT(gpt.GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=50))
  logits, loss = model(idx, targets)
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


# fanout's presets (models/zoo/gpt.cpp): gpt2, and nanoGPT's shakespeare_char (vocab from the data).
PRESETS = {
    "gpt2": GPTConfig(),
    "gpt-char": GPTConfig(block_size=256, vocab_size=65, n_layer=6, n_head=6, n_embd=384, dropout=0.2, bias=False),
}


def parse_config(spec, vocab_size=None):
    """fanout's model spec "gpt:PRESET,KEY=VALUE,..." (or its part after
    "gpt:") as a GPTConfig; vocab_size, when given, where the spec leaves it."""
    if spec.startswith("gpt"):
        spec = spec[4:]
    items = [s for s in spec.split(",") if s]
    preset = "gpt2"
    if items and "=" not in items[0]:
        preset, items = items[0], items[1:]
    kv = dict(s.split("=", 1) for s in items)
    preset = kv.pop("preset", preset)
    c = GPTConfig(**vars(PRESETS[preset]))
    if vocab_size is not None and "vocab_size" not in kv and preset != "gpt2":
        c.vocab_size = vocab_size
    for k, v in kv.items():
        if k == "dropout":
            c.dropout = float(v)
        elif k == "bias":
            c.bias = v in ("true", "1")
        elif hasattr(c, k):
            setattr(c, k, int(v))
        else:
            raise ValueError(f"gpt: unknown config key {k!r}")
    return c


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension with an optional bias (eps 1e-5)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x):
        b, t, e = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        # (B, T, E) -> (B, heads, T, head size)
        q = q.view(b, t, self.n_head, e // self.n_head).transpose(1, 2)
        k = k.view(b, t, self.n_head, e // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, e // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None,
                                           dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, e)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def num_params(self, non_embedding=True):
        """Parameters (the tied weight once), without the position embedding by default."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def forward(self, idx, targets=None):
        b, t = idx.size()
        assert t <= self.config.block_size, f"a sequence of {t} tokens is longer than block_size"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def optimizer_groups(self, weight_decay):
        """nanoGPT's two AdamW groups: weight decay on every parameter of two
        or more dimensions (matrices, embeddings), none on the others (biases,
        LayerNorm weights)."""
        params = [p for p in self.parameters() if p.requires_grad]
        return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]

    def load_fanout_state(self, state):
        """Loads fanout's state_dict (the tied weight only as transformer.wte.weight)."""
        state = dict(state)
        state.setdefault("lm_head.weight", state["transformer.wte.weight"])
        self.load_state_dict(state)
