"""fanout's model zoo (models/zoo/zoo.cpp) in PyTorch, layer for layer and
with the same parameter names, for the benchmarks under bench/pytorch.
Initialization is PyTorch's default (fanout's matches it, except resnet18's
convolutions: Kaiming normal, fan-out, as torchvision)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def _conv_out(x, k, s, p):
    return (x + 2 * p - k) // s + 1


class LeNet(nn.Module):
    """lenet: conv1 5x5 -> 6 (padding 2 for 28x28 input), relu, maxpool 2,
    conv2 5x5 -> 16, relu, maxpool 2, fc1 -> 120, relu, fc2 -> 84, relu,
    fc3 -> classes."""

    def __init__(self, shape=(1, 28, 28), classes=10):
        super().__init__()
        c, h, w = shape
        pad = (32 - h + 1) // 2 if h < 32 else 0
        oh = _conv_out(_conv_out(_conv_out(_conv_out(h, 5, 1, pad), 2, 2, 0), 5, 1, 0), 2, 2, 0)
        ow = _conv_out(_conv_out(_conv_out(_conv_out(w, 5, 1, pad), 2, 2, 0), 5, 1, 0), 2, 2, 0)
        self.conv1 = nn.Conv2d(c, 6, 5, padding=pad)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * oh * ow, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class Mlp(nn.Module):
    """mlp: flatten, fc1 -> 512, relu, fc2 -> 256, relu, fc3 -> classes."""

    def __init__(self, shape=(1, 28, 28), classes=10):
        super().__init__()
        n = 1
        for s in shape:
            n *= s
        self.fc1 = nn.Linear(n, 512)
        self.fc2 = nn.Linear(512, 256)
        self.fc3 = nn.Linear(256, classes)

    def forward(self, x):
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class Cnn(nn.Module):
    """cnn: three blocks of conv 3x3 (no bias) -> BatchNorm -> relu ->
    maxpool 2 with 32, 64, 128 channels, then fc1 -> 256, relu, fc2."""

    def __init__(self, shape=(1, 28, 28), classes=10):
        super().__init__()
        c, h, w = shape
        for i, width in enumerate((32, 64, 128), start=1):
            setattr(self, f"conv{i}", nn.Conv2d(c, width, 3, 1, 1, bias=False))
            setattr(self, f"bn{i}", nn.BatchNorm2d(width))
            c, h, w = width, h // 2, w // 2
        self.fc1 = nn.Linear(c * h * w, 256)
        self.fc2 = nn.Linear(256, classes)

    def forward(self, x):
        for i in (1, 2, 3):
            x = F.max_pool2d(F.relu(getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(x))), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


class BasicBlock(nn.Module):
    """torchvision's BasicBlock, for machines without torchvision."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18Cifar(nn.Module):
    """torchvision resnet18 layout with the CIFAR stem, written out by hand."""

    def __init__(self, in_channels=3, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.Identity()
        layers, cin = [], 64
        for i, cout in enumerate((64, 128, 256, 512)):
            stride = 1 if i == 0 else 2
            layers.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18_cifar(in_channels=3, classes=10):
    """(model, source): torchvision's resnet18 with conv1 3x3/1 and no max
    pool when torchvision imports, else the hand-written copy."""
    try:
        import torchvision

        m = torchvision.models.resnet18(num_classes=classes)
        m.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(m.conv1.weight, mode="fan_out", nonlinearity="relu")
        m.maxpool = nn.Identity()
        return m, "torchvision " + torchvision.__version__
    except ImportError:
        return ResNet18Cifar(in_channels, classes), "hand-written (no torchvision)"


class Heatmap3d(nn.Module):
    """heatmap3d: a 3-D encoder-decoder drawing one heatmap per landmark,
    blocks of Conv3d 3x3x3 (no bias) -> BatchNorm3d -> relu at widths 8, 16,
    32, 16, 8 with max pools 2 after the first two and nearest upsampling 2
    before the last two, then a 1x1x1 head to `landmarks` channels."""

    def __init__(self, shape=(1, 32, 32, 32), landmarks=4, width=8):
        super().__init__()
        widths = (width, 2 * width, 4 * width, 2 * width, width)
        c = shape[0]
        for i, w in enumerate(widths, start=1):
            setattr(self, f"conv{i}", nn.Conv3d(c, w, 3, 1, 1, bias=False))
            setattr(self, f"bn{i}", nn.BatchNorm3d(w))
            c = w
        self.head = nn.Conv3d(width, landmarks, 1)

    def block(self, i, x):
        return F.relu(getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(x)), inplace=True)

    def forward(self, x):
        x = F.max_pool3d(self.block(1, x), 2)
        x = F.max_pool3d(self.block(2, x), 2)
        x = F.interpolate(self.block(3, x), scale_factor=2, mode="nearest")
        x = F.interpolate(self.block(4, x), scale_factor=2, mode="nearest")
        return self.head(self.block(5, x))


MODELS = ("mlp", "lenet", "cnn", "resnet18", "heatmap3d")
# The sample shape each model is measured on by default: (C, H, W), or (C, D, H, W).
SAMPLE_SHAPE = {"mlp": (1, 28, 28), "lenet": (1, 28, 28), "cnn": (1, 28, 28), "resnet18": (3, 32, 32),
                "heatmap3d": (1, 32, 32, 32)}
# Models whose output is dense (a map per landmark) and whose loss is the mean squared error.
DENSE = ("heatmap3d",)


def build(name, shape, classes=10):
    """(model, source) for a zoo name and a sample shape (C, H, W), or
    (C, D, H, W) for heatmap3d (`classes`: its landmarks)."""
    if name == "heatmap3d":
        return Heatmap3d(shape, classes), "hand-written"
    if name == "mlp":
        return Mlp(shape, classes), "hand-written"
    if name == "lenet":
        return LeNet(shape, classes), "hand-written"
    if name == "cnn":
        return Cnn(shape, classes), "hand-written"
    if name == "resnet18":
        return resnet18_cifar(shape[0], classes)
    raise SystemExit(f"unknown model {name!r} (known: {', '.join(MODELS)})")


def add_optimizer_args(p, lr=0.02):
    """The optimizer flags dp-train and dp-bench take, with their defaults."""
    p.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="sgd")
    p.add_argument("--betas", default="0.9,0.999", help="Adam/AdamW: BETA1,BETA2")
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--amsgrad", action="store_true")
    p.add_argument("--no-decay-norm-bias", action="store_true",
                   help="no weight decay on biases and parameters of at most one dimension")
    p.add_argument("--clip-grad-norm", type=float, default=0.0, help="clip_grad_norm_ before each step (0: off)")
    p.add_argument("--clip-grad-value", type=float, default=0.0, help="clip_grad_value_ before each step (0: off)")


def make_optimizer(model, args, momentum=0.9, weight_decay=5e-4):
    """The torch.optim object dp-train builds for the same flags: groups by
    name (biases and parameters of at most one dimension without decay),
    foreach/fused left at torch's defaults."""
    named = list(model.named_parameters())
    if args.no_decay_norm_bias:
        no = [p for n, p in named if n.endswith(".bias") or p.ndim <= 1]
        yes = [p for n, p in named if not (n.endswith(".bias") or p.ndim <= 1)]
        params = [{"params": yes, "weight_decay": weight_decay}, {"params": no, "weight_decay": 0.0}]
    else:
        params = [p for _, p in named]
    if args.optimizer == "sgd":
        return torch.optim.SGD(params, lr=args.lr, momentum=momentum, weight_decay=weight_decay)
    b1, b2 = (float(v) for v in args.betas.split(","))
    cls = torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.Adam
    return cls(params, lr=args.lr, betas=(b1, b2), eps=args.eps, weight_decay=weight_decay, amsgrad=args.amsgrad)


class MixedStep:
    """One training step as dp-train takes it, under --precision: forward and
    loss in torch.autocast (bf16-mixed, 16-mixed), backward (through a
    GradScaler for 16-mixed, unscaled before clipping), clipping by norm and
    by value, then the optimizer's step (skipped by the scaler on inf/NaN)."""

    def __init__(self, device, precision, clip_grad_norm=0.0, clip_grad_value=0.0):
        self.device_type = device.type
        self.dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
        self.scaler = torch.amp.GradScaler(device.type) if precision == "16-mixed" else None
        self.clip_norm, self.clip_value = clip_grad_norm, clip_grad_value

    def autocast(self):
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype is not None)

    def __call__(self, net, model, opt, loss_fn, x, y):
        with self.autocast():
            loss = loss_fn(net(x), y)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(opt)
        else:
            loss.backward()
        if self.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.clip_norm)
        if self.clip_value > 0:
            torch.nn.utils.clip_grad_value_(model.parameters(), self.clip_value)
        if self.scaler is not None:
            self.scaler.step(opt)
            self.scaler.update()
        else:
            opt.step()
        return loss
