"""Models built by code (no downloads), deterministic per seed. MODELS maps a name to its builder
and the input shape to pin when compiling it."""

from __future__ import annotations

from .cnn import mobilenet_v2, resnet18, resnet50
from .transformer import transformer_encoder

MODELS = {
    "resnet18": (resnet18, "input:1x3x224x224"),
    "resnet50": (resnet50, "input:1x3x224x224"),
    "mobilenet_v2": (mobilenet_v2, "input:1x3x224x224"),
    "transformer_encoder": (transformer_encoder, "input:1x128x128"),
}
DEFAULT_MODEL = "mobilenet_v2"


def build(name: str, **kwargs):
    from ..errors import OptionsError

    if name not in MODELS:
        raise OptionsError(f"unknown zoo model {name!r}", where="zoo", fix=f"choose one of {sorted(MODELS)}")
    return MODELS[name][0](**kwargs)


__all__ = ["MODELS", "DEFAULT_MODEL", "build", "resnet18", "resnet50", "mobilenet_v2", "transformer_encoder"]
