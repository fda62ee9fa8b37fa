"""ResNet-18/50 and MobileNetV2, as torchvision defines them, in NCHW float32."""

from __future__ import annotations

from .builder import GraphBuilder


def _input(batch, size):
    return [("input", [batch if batch else "N", 3, size, size])]


def resnet(depth: int = 18, size: int = 224, classes: int = 1000, batch: int | None = 1, seed: int = 0):
    blocks = {18: ([2, 2, 2, 2], False), 34: ([3, 4, 6, 3], False), 50: ([3, 4, 6, 3], True)}[depth]
    layers, bottleneck = blocks
    b = GraphBuilder(f"resnet{depth}", seed)
    x = b.relu(b.bn(b.conv("input", 3, 64, 7, 2), 64))
    x = b.node("MaxPool", [x], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin, exp = 64, 4 if bottleneck else 1
    for stage, n in enumerate(layers):
        width = 64 * 2**stage
        for i in range(n):
            stride = 2 if stage > 0 and i == 0 else 1
            if bottleneck:
                y = b.relu(b.bn(b.conv(x, cin, width, 1), width))
                y = b.relu(b.bn(b.conv(y, width, width, 3, stride), width))
                y = b.bn(b.conv(y, width, width * exp, 1), width * exp, gamma_scale=0.3)
            else:
                y = b.relu(b.bn(b.conv(x, cin, width, 3, stride), width))
                y = b.bn(b.conv(y, width, width, 3), width, gamma_scale=0.3)
            if stride != 1 or cin != width * exp:
                x = b.bn(b.conv(x, cin, width * exp, 1, stride), width * exp)
            x = b.relu(b.add(y, x))
            cin = width * exp
    return b.model(_input(batch, size), b.classifier(x, cin, classes), [batch or "N", classes])


def resnet18(**kw):
    return resnet(18, **kw)


def resnet50(**kw):
    return resnet(50, **kw)


MBV2_CONFIG = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
]


def mobilenet_v2(size: int = 224, classes: int = 1000, batch: int | None = 1, seed: int = 0):
    b = GraphBuilder("mobilenet_v2", seed)
    x = b.relu6(b.bn(b.conv("input", 3, 32, 3, 2), 32))
    cin = 32
    for t, c, n, s in MBV2_CONFIG:
        for i in range(n):
            stride, hidden = (s if i == 0 else 1), cin * t
            y = x
            if t != 1:
                y = b.relu6(b.bn(b.conv(y, cin, hidden, 1), hidden))
            y = b.relu6(b.bn(b.conv(y, hidden, hidden, 3, stride, group=hidden), hidden))
            y = b.bn(b.conv(y, hidden, c, 1), c, gamma_scale=0.5)
            x = b.add(x, y) if stride == 1 and cin == c else y
            cin = c
    x = b.relu6(b.bn(b.conv(x, cin, 1280, 1), 1280))
    return b.model(_input(batch, size), b.classifier(x, 1280, classes), [batch or "N", classes])
