"""Exports real-size transformer models for benchmarks/transformers.py: published `transformers` architectures
built from their configs with random weights (offline, no hub), at the sizes users deploy, through
`torch.onnx.export` with the TorchScript exporter (dynamo=False, opset 17) and, where it exports, the dynamo
exporter (dynamo=True, onnxscript). Also onnxruntime's `quantize_dynamic` output of each TorchScript export
(int8 weights, per-token activation scales at run time), as users make it.

Runs in the exporters' venv (`make .venv-corpus/.installed`: torch, transformers, onnx, onnxscript,
onnxruntime), never Kiln's. For each model: NAME.onnx, NAME.inputs.npz (seeded inputs: token ids inside the
vocabulary, an all-ones attention mask) and a record in manifest.json. Existing files are kept unless --force.

    .venv-corpus/bin/python benchmarks/corpus/export_transformers.py [--out build/transformers] [--only a,b] [--force]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SEED = 0


def _hf_wrap(model, keys):
    import torch

    class Wrap(torch.nn.Module):
        """Positional inputs -> the model's first output (the last hidden state) as a plain tensor."""

        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, *args):
            return self.m(**dict(zip(keys, args)), return_dict=False)[0]

    return Wrap().eval()


def _bert():
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(), add_pooling_layer=False)  # bert-base-uncased's config: 12 x 768, 30522 tokens


def _distilbert():
    from transformers import DistilBertConfig, DistilBertModel

    return DistilBertModel(DistilBertConfig())  # distilbert-base-uncased: 6 x 768


def _minilm():
    from transformers import BertConfig, BertModel

    # all-MiniLM-L6-v2's config: 6 layers, hidden 384, 12 heads, FFN 1536
    c = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
    return BertModel(c, add_pooling_layer=False)


def _gpt2():
    from transformers import GPT2Config, GPT2Model

    return GPT2Model(GPT2Config(use_cache=False))  # gpt2 (small): 12 x 768


def _t5_encoder():
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8))  # t5-small


def _vit():
    from transformers import ViTConfig, ViTModel

    return ViTModel(ViTConfig(), add_pooling_layer=False)  # ViT-B/16 at 224: 197 tokens


def _whisper(d_model, layers, heads):
    def build():
        from transformers import WhisperConfig, WhisperModel

        c = WhisperConfig(
            d_model=d_model,
            encoder_layers=layers,
            encoder_attention_heads=heads,
            decoder_layers=layers,
            decoder_attention_heads=heads,
            encoder_ffn_dim=4 * d_model,
            decoder_ffn_dim=4 * d_model,
        )
        return WhisperModel(c).get_encoder()  # 3000 mel frames -> 1500 tokens

    return build


def _clip_vision():
    from transformers import CLIPVisionConfig, CLIPVisionModel

    return CLIPVisionModel(CLIPVisionConfig(patch_size=32))  # ViT-B/32: 50 tokens


def _clip_text():
    from transformers import CLIPTextConfig, CLIPTextModel

    return CLIPTextModel(CLIPTextConfig())  # 77 tokens, 12 x 512, causal mask


def _text(seq, vocab, types=False):
    feed = {"input_ids": ((1, seq), "int64", vocab), "attention_mask": ((1, seq), "int64", 1)}
    return feed | ({"token_type_ids": ((1, seq), "int64", 0)} if types else {})


# name -> (builder, inputs {name: (shape, dtype, kind)}, description); kind: an int = the vocabulary (token ids
# below it) for input_ids, else a constant; "normal" = standard normal floats
MODELS = {
    "bert_base_128": (_bert, _text(128, 30522, True), "BERT-base (bert-base-uncased config), seq 128"),
    "bert_base_384": (_bert, _text(384, 30522, True), "BERT-base, seq 384"),
    "distilbert_128": (_distilbert, _text(128, 30522), "DistilBERT-base, seq 128"),
    "minilm_l6_128": (_minilm, _text(128, 30522, True), "MiniLM-L6 sentence encoder (6 x 384), seq 128"),
    "gpt2_128": (_gpt2, _text(128, 50257), "GPT-2 small, prefill 128"),
    "t5_small_enc_128": (_t5_encoder, _text(128, 32128), "T5-small encoder, seq 128"),
    "vit_b16_224": (_vit, {"pixel_values": ((1, 3, 224, 224), "float32", "normal")}, "ViT-B/16 224 (197 tokens)"),
    "whisper_tiny_enc": (
        _whisper(384, 4, 6),
        {"input_features": ((1, 80, 3000), "float32", "normal")},
        "Whisper-tiny encoder, 30 s (1500 tokens)",
    ),
    "whisper_base_enc": (
        _whisper(512, 6, 8),
        {"input_features": ((1, 80, 3000), "float32", "normal")},
        "Whisper-base encoder, 30 s (1500 tokens)",
    ),
    "clip_b32_vision": (
        _clip_vision,
        {"pixel_values": ((1, 3, 224, 224), "float32", "normal")},
        "CLIP ViT-B/32 vision tower (50 tokens)",
    ),
    "clip_text": (_clip_text, {"input_ids": ((1, 77), "int64", 49408)}, "CLIP text tower (77 tokens, causal)"),
}
DYNAMO = ("bert_base_128", "vit_b16_224", "minilm_l6_128")  # also through the dynamo exporter (NAME_dynamo)
QUANTIZED = ("bert_base_128", "vit_b16_224", "whisper_tiny_enc", "minilm_l6_128", "gpt2_128")  # NAME_qdynamic


def make_feed(inputs: dict) -> dict:
    rng = np.random.default_rng(SEED)
    feed = {}
    for name, (shape, dtype, kind) in inputs.items():
        if kind == "normal":
            feed[name] = rng.standard_normal(shape).astype(dtype)
        elif name == "input_ids":
            feed[name] = rng.integers(0, kind, shape).astype(dtype)
        else:
            feed[name] = np.full(shape, kind, dtype=dtype)
    return feed


def export_torch(name: str, out: Path, dynamo: bool) -> dict:
    import torch

    torch.manual_seed(SEED)
    builder, inputs, what = MODELS[name]
    feed = make_feed(inputs)
    model = _hf_wrap(builder().eval(), list(feed))
    args = tuple(torch.from_numpy(v) for v in feed.values())
    path = out / f"{name}{'_dynamo' if dynamo else ''}.onnx"
    with torch.no_grad():
        if dynamo:
            torch.onnx.export(model, args, str(path), dynamo=True, external_data=False, input_names=list(feed))
        else:
            torch.onnx.export(model, args, str(path), dynamo=False, opset_version=17, input_names=list(feed))
    exporter = f"torch.onnx.export({'dynamo' if dynamo else 'torchscript'}) torch {torch.__version__}"
    return {"feed": feed, "source": what, "exporter": exporter}


def export_quantized(name: str, out: Path) -> dict:
    import onnxruntime
    from onnxruntime import quantization as q

    with tempfile.TemporaryDirectory() as tmp:
        pre = Path(tmp) / "pre.onnx"
        q.quant_pre_process(str(out / f"{name}.onnx"), str(pre), skip_symbolic_shape=True)
        q.quantize_dynamic(str(pre), str(out / f"{name}_qdynamic.onnx"), weight_type=q.QuantType.QInt8)
    return {
        "feed": dict(np.load(out / f"{name}.inputs.npz")),
        "source": f"{MODELS[name][2]}, int8",
        "exporter": f"onnxruntime {onnxruntime.__version__} quantization.quantize_dynamic",
        "float": name,
    }


def jobs(only: set) -> list[tuple[str, object]]:
    out = [(n, lambda d, n=n: export_torch(n, d, False)) for n in MODELS]
    out += [(f"{n}_dynamo", lambda d, n=n: export_torch(n, d, True)) for n in DYNAMO]
    out += [(f"{n}_qdynamic", lambda d, n=n: export_quantized(n, d)) for n in QUANTIZED]
    return [(n, f) for n, f in out if not only or n in only or n.rsplit("_", 1)[0] in only]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "build" / "transformers"))
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for name, export in jobs({s for s in args.only.split(",") if s}):
        if (out / f"{name}.onnx").exists() and name in manifest and "error" not in manifest[name] and not args.force:
            continue
        t = time.perf_counter()
        try:
            rec = export(out)
            np.savez(out / f"{name}.inputs.npz", **rec.pop("feed"))
            rec["seconds"] = round(time.perf_counter() - t, 1)
        except Exception as e:  # recorded, so the benchmark lists the model instead of dropping it
            rec = {
                "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}",
                "trace": traceback.format_exc()[-2000:],
            }
        manifest[name] = rec
        manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
        print(name, "error: " + rec["error"] if "error" in rec else f"{rec['seconds']} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
