"""Real converter output for benchmarks/frontends.md's TFLite table: Keras applications (random weights,
seeded; no hub) converted by TensorFlow's own TFLiteConverter, once in float32 and once full-integer
(int8 weights, activations and I/O, calibrated on 8 seeded inputs in [-1, 1]), the files a TFLite user
ships. Logits out (no softmax); BatchNorm statistics set from the same 8 inputs, so outputs are not ~0.
Runs in its own venv, never in Kiln's:

    python3.11 -m venv .venv-tf && .venv-tf/bin/pip install 'tensorflow-cpu==2.21.*'
    .venv-tf/bin/python benchmarks/frontends/keras_tflite.py [--out build/tflite_models] [--only a,b]

then `.venv/bin/python benchmarks/frontends/tflite_models.py --only keras_...` measures them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SEED, CALIB = 0, 8
# name -> (keras.applications constructor, input size); the constructors' own preprocessing is kept
MODELS = {
    "mobilenet_v2": ("MobileNetV2", 160),
    "mobilenet_v3_small": ("MobileNetV3Small", 160),
    "efficientnet_b0": ("EfficientNetB0", 160),
    "resnet50": ("ResNet50", 160),
}


def convert(name: str, out: Path) -> dict:
    import tensorflow as tf

    ctor, size = MODELS[name]
    tf.keras.utils.set_random_seed(SEED)
    # logits out: a softmax over 1000 classes of a random-weight net is about 1/1000 everywhere, one int8 value
    model = getattr(tf.keras.applications, ctor)(weights=None, input_shape=(size, size, 3), classifier_activation=None)
    rng = np.random.default_rng(SEED)
    samples = [rng.uniform(-1, 1, (1, size, size, 3)).astype(np.float32) for _ in range(CALIB)]
    # random weights with BatchNorm's initial statistics (mean 0, variance 1) shrink or blow up the
    # activations layer by layer (MobileNetV2's logits came out near 1e-17): give every BatchNorm the
    # statistics of one batch of the calibration inputs (momentum 0: one training-mode pass sets them)
    for layer in model.layers:
        if isinstance(layer, tf.keras.layers.BatchNormalization):
            layer.momentum = 0.0
    model(np.concatenate(samples), training=True)
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    (out / f"keras_{name}_float.tflite").write_bytes(conv.convert())
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = lambda: ([s] for s in samples)
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = conv.inference_output_type = tf.int8
    (out / f"keras_{name}_int8.tflite").write_bytes(conv.convert())
    return {"name": name, "keras": ctor, "size": size, "tensorflow": tf.__version__, "params": model.count_params()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "build" / "tflite_models"))
    ap.add_argument("--only", default="")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in [m for m in MODELS if not a.only or m in a.only.split(",")]:
        print(json.dumps(convert(name, out)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
