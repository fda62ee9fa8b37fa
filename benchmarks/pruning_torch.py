"""The PyTorch half of benchmarks/pruning.py, run in a venv that has torch (.venv-corpus), not Kiln:

export-ln OUTDIR   a VGG-style CNN and torchvision's ResNet-18 (random weights, BN statistics and
                   affine randomized so pruned channels are nonzero constants), exported to ONNX
                   as they are and after torch.nn.utils.prune.ln_structured (30% of each conv's
                   output channels by L2 norm, zeros left in place, prune.remove to bake them in)
finetune IN OUT DATA.npz [--epochs N]
                   fine-tune the pruned digits CNN (kiln prune's output) on the training split,
                   writing the new weights into a copy of the ONNX file (Kiln itself does not train)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# benchmarks/profile.py would shadow the standard library's `profile` (torch imports cProfile)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import torch  # noqa: E402
from onnx import numpy_helper  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.utils import prune  # noqa: E402


def vgg_style() -> nn.Module:
    layers, cin = [], 3
    for v in (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M"):
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(cin, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU()]
            cin = v
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000))


def _randomize_bn(model: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(c, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(c, generator=g) * 0.1)


def _export(model: nn.Module, x: torch.Tensor, path: Path) -> None:
    torch.onnx.export(model, (x,), str(path), input_names=["input"], output_names=["output"], dynamo=True)
    m = onnx.load(str(path))
    onnx.save(m, str(path))  # external data folded back into one file
    Path(f"{path}.data").unlink(missing_ok=True)


def export_ln(out: Path) -> None:
    import torchvision

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    for name, model, size in (("vgg", vgg_style(), 160), ("resnet18", torchvision.models.resnet18(), 224)):
        _randomize_bn(model, 1)
        model.eval()
        x = torch.randn(1, 3, size, size)
        _export(model, x, out / f"{name}.onnx")
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                prune.ln_structured(m, "weight", amount=0.3, n=2, dim=0)
                prune.remove(m, "weight")
        _export(model, x, out / f"{name}_ln30.onnx")
        print(f"wrote {out / name}.onnx and {out / name}_ln30.onnx")


def finetune(src: Path, dst: Path, data: Path, epochs: int) -> None:
    m = onnx.load(str(src))
    w = {i.name: torch.tensor(numpy_helper.to_array(i).copy()) for i in m.graph.initializer}
    p = nn.ParameterDict({k: nn.Parameter(v) for k, v in w.items()})
    d = np.load(data)
    x, y = torch.tensor(d["x"]), torch.tensor(d["y"])

    def forward(x):
        a = torch.relu(nn.functional.conv2d(x, p["w1"], p["b1"], padding=1))
        a = torch.relu(nn.functional.conv2d(a, p["w2"], p["b2"], padding=1))
        f = nn.functional.max_pool2d(a, 2).flatten(1)
        return torch.relu(f @ p["w3"] + p["b3"]) @ p["w4"] + p["b4"]

    opt = torch.optim.Adam(p.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=g)
        for s in range(0, len(x), 64):
            i = order[s : s + 64]
            loss = nn.functional.cross_entropy(forward(x[i]), y[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
    for init in m.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(p[init.name].detach().numpy(), init.name))
    onnx.save(m, str(dst))
    print(f"fine-tuned {epochs} epochs -> {dst}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export-ln")
    e.add_argument("out", type=Path)
    f = sub.add_parser("finetune")
    f.add_argument("src", type=Path)
    f.add_argument("dst", type=Path)
    f.add_argument("data", type=Path)
    f.add_argument("--epochs", type=int, default=5)
    a = ap.parse_args(argv)
    if a.cmd == "export-ln":
        export_ln(a.out)
    else:
        finetune(a.src, a.dst, a.data, a.epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
