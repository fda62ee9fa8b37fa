"""Which frontend reads a model file: decided by its content, checked against its suffix.

A .pt2 (torch.export.save) and a .kiln artifact are both zip archives: a .pt2 holds
`<name>/archive_format` = "pt2", an artifact a top-level manifest.json. A .tflite is a flatbuffer
whose file identifier (bytes 4-8) is "TFL3". ONNX has no magic number: a protobuf whose first byte
is a field tag Kiln expects (ir_version, opset_import, producer, graph...). A file whose content is
one format and whose suffix names another is refused: it was renamed or mixed up, and compiling it
as what it holds would hide the mistake."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from ..errors import ModelLoadError

FORMATS = {"onnx": "ONNX", "pt2": "PyTorch (torch.export)", "tflite": "TFLite", "kiln": "Kiln artifact"}
SUFFIXES = {".onnx": "onnx", ".pt2": "pt2", ".tflite": "tflite", ".kiln": "kiln"}
# first bytes of a ModelProto: field 1 ir_version (varint), 2 producer_name, 3 producer_version, 4 domain,
# 5 model_version, 6 doc_string, 7 graph, 8 opset_import, 14 metadata_props, 20 training_info, 25 functions
_ONNX_TAGS = {0x08, 0x12, 0x1A, 0x22, 0x28, 0x32, 0x3A, 0x42, 0x72, 0xA2, 0xCA}


def sniff(head: bytes, path: str | os.PathLike | None = None) -> str | None:
    """The format the bytes hold (the file at path, for zip archives), or None when none matches."""
    if len(head) >= 8 and head[4:8] == b"TFL3":
        return "tflite"
    if head[:4] == b"PK\x03\x04" and path is not None:
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
                if "manifest.json" in names:
                    return "kiln"
                fmt = [n for n in names if n.endswith("/archive_format") and n.count("/") == 1]
                if fmt and z.read(fmt[0]).strip() == b"pt2":
                    return "pt2"
        except (zipfile.BadZipFile, OSError, KeyError, ValueError, EOFError):
            return "zip"  # a damaged archive: the suffix decides which reader reports it
        return "zip"
    if head[:1] and head[0] in _ONNX_TAGS:
        return "onnx"
    return None


def detect_format(path: str | os.PathLike) -> str:
    """ "onnx", "pt2", "tflite" or "kiln" for the file at path; ModelLoadError when the content and
    the suffix disagree. An unknown suffix is read by content; unknown content by its suffix (the
    reader then says what is wrong with it); neither: ONNX, the reader Kiln always has."""
    p = Path(path)
    if not p.is_file():
        raise ModelLoadError(
            "no such model file", where=str(p), fix="give the path of an existing .onnx, .pt2 or .tflite file"
        )
    with open(p, "rb") as f:
        head = f.read(16)
    by_suffix = SUFFIXES.get(p.suffix.lower())
    by_content = sniff(head, p)
    if by_content == "zip":  # a zip that is neither: a broken .pt2 or .kiln, or something else
        by_content = by_suffix if by_suffix in ("pt2", "kiln") else None
        if by_content is None:
            raise ModelLoadError(
                "the file is a zip archive but neither a torch.export program (.pt2) nor a Kiln artifact",
                where=str(p),
                fix="give a .pt2 saved by torch.export.save, an .onnx or a .tflite model",
            )
    if by_content == "onnx" and by_suffix not in (None, "onnx"):
        by_content = None  # a protobuf-looking first byte is weak evidence: trust the suffix's reader
    if by_suffix and by_content and by_content != by_suffix:
        raise ModelLoadError(
            f"the file's suffix says {FORMATS[by_suffix]} but its content is {FORMATS[by_content]}",
            where=str(p),
            fix=f"rename it to {p.stem}{_suffix(by_content)} if that is what it is, or give the right file",
        )
    return by_content or by_suffix or "onnx"


def _suffix(fmt: str) -> str:
    return next(s for s, f in SUFFIXES.items() if f == fmt)
