"""One frozen options object for the compile stage. Everything in it that changes the output goes
into the artifact's manifest (`to_json`)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ..errors import OptionsError
from ..frontends.freeze import FrozenInput, parse_frozen_inputs
from ..frontends.shapes import BUCKETS_FLAG, parse_input_shapes, parse_shape_buckets
from ..runtime.artifact import BUCKET_POLICIES
from ..target import Target

OPT_LEVELS = (0, 1, 2, 3)
QUANTIZE = ("int8",)
PRECISIONS = ("fp32", "fp16", "bf16")
LAYOUTS = ("NCHW", "NHWC", "NCHWc", "auto")


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    target: Target
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    opt_level: int = 2
    disabled_passes: tuple[str, ...] = ()
    layout: str = "NCHWc"
    tuning_db: str | None = None  # the target's folder of a tuning database (see resolve_tuning_db)
    # one function per bucket: ((input, dims), ...) per bucket, smallest first; () = one shape
    shape_buckets: tuple[tuple[tuple[str, tuple[int, ...]], ...], ...] = ()
    bucket_policy: str = "pad"  # the runtime's default for inputs between buckets: pad | error
    max_memory: int | None = None  # bytes: refuse (before building) a model whose planned memory exceeds it
    quantize: str | None = None  # "int8": post-training static quantization (needs calibration)
    calibration: str | None = None  # .npz or folder of .npz, samples stacked on the batch axis
    calib_method: str = "minmax"
    calib_samples: int | None = None  # the first N calibrate, the rest are held out for the accuracy check
    min_agreement: float | None = None  # fail the compile below this top-1 agreement (cosine for non-classifiers)
    keep_float: tuple[str, ...] = ()  # layer (ONNX node) names that stay float
    precision: str = "fp32"  # fp16 | bf16: mixed precision, fp32 accumulation
    freeze_inputs: tuple[FrozenInput, ...] = ()  # inputs compiled in as constants (--freeze-input NAME=VALUE)

    @staticmethod
    def make(
        target=None,
        input_shapes=None,
        opt_level: int = 2,
        disabled_passes=(),
        layout: str = "NCHWc",
        tuning_db=None,
        shape_buckets=None,
        bucket_policy: str = "pad",
        max_memory=None,
        quantize=None,
        calibration=None,
        calib_method: str = "minmax",
        calib_samples=None,
        min_agreement=None,
        keep_float=(),
        precision: str = "fp32",
        freeze_inputs=(),
    ) -> CompileOptions:
        if opt_level not in OPT_LEVELS:
            raise OptionsError(
                f"opt level {opt_level!r} is not valid", where="--opt-level", fix=f"use one of {list(OPT_LEVELS)}"
            )
        if layout not in LAYOUTS:
            raise OptionsError(
                f"layout {layout!r} is not valid", where="--layout", fix=f"use one of {', '.join(LAYOUTS)}"
            )
        if bucket_policy not in BUCKET_POLICIES:
            raise OptionsError(
                f"bucket policy {bucket_policy!r} is not valid",
                where="--bucket-policy",
                fix=f"use one of {', '.join(BUCKET_POLICIES)}",
            )
        shapes = parse_input_shapes(input_shapes)
        buckets = parse_shape_buckets(shape_buckets)
        frozen = parse_frozen_inputs(freeze_inputs)
        shaped = sorted(({n for b in buckets for n in b} | set(shapes)) & {f.name for f in frozen})
        if shaped:
            raise OptionsError(
                f"input(s) {shaped} are both frozen and given a shape",
                where="--freeze-input",
                fix="a frozen input is a constant: its shape is its value's",
            )
        both = sorted({n for b in buckets for n in b} & set(shapes))
        if both:
            raise OptionsError(
                f"input(s) {both} given both --input-shape and {BUCKETS_FLAG}",
                where="--input-shape / --shape-buckets",
                fix=f"bucketed inputs take their shapes from {BUCKETS_FLAG} only",
            )
        _check_quantize(quantize, calibration, calib_method, calib_samples, min_agreement, precision, buckets)
        t = Target.parse(target)
        if t.accel and (quantize != "int8" or buckets or layout == "auto"):
            raise OptionsError(
                f"target {t.accel} runs int8 convolutions: it needs --quantize int8 --calibration DATA"
                + (" and no shape buckets or --layout auto" if buckets or layout == "auto" else ""),
                where="--target",
                fix=f"kiln compile MODEL --target {t.accel} --quantize int8 --calibration DATA.npz",
            )
        return CompileOptions(
            t,
            tuple(sorted(shapes.items())),
            int(opt_level),
            tuple(dict.fromkeys(disabled_passes)),
            layout,
            resolve_tuning_db(tuning_db, t),
            tuple(tuple(sorted(b.items())) for b in buckets),
            bucket_policy,
            parse_size(max_memory),
            quantize,
            str(calibration) if calibration is not None else None,
            calib_method,
            int(calib_samples) if calib_samples is not None else None,
            float(min_agreement) if min_agreement is not None else None,
            tuple(dict.fromkeys(keep_float)),
            precision,
            frozen,
        )

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self.input_shapes)

    def bucket_shapes(self) -> list[dict[str, tuple[int, ...]]]:
        """The input shapes of each function to build: one per bucket, or just the pinned shapes."""
        return [dict(self.input_shapes, **dict(b)) for b in self.shape_buckets] or [self.shapes]

    def to_json(self) -> dict:
        return {
            "target": str(self.target),
            "input_shapes": {k: list(v) for k, v in self.input_shapes},
            "shape_buckets": [{k: list(v) for k, v in b} for b in self.shape_buckets],
            "bucket_policy": self.bucket_policy,
            "max_memory": self.max_memory,
            "opt_level": self.opt_level,
            "disabled_passes": list(self.disabled_passes),
            "layout": self.layout,
            "tuning_db": self.tuning_db,
            "tuning_db_sha256": _db_digest(self.tuning_db),
            "quantize": self.quantize,
            "calibration_sha256": _calibration_digest(self.calibration),
            "calib_method": self.calib_method,
            "calib_samples": self.calib_samples,
            "min_agreement": self.min_agreement,
            "keep_float": list(self.keep_float),
            "precision": self.precision,
            "freeze_inputs": {f.name: f.to_json() for f in self.freeze_inputs},
        }


def _check_quantize(quantize, calibration, method, samples, min_agreement, precision, buckets) -> None:
    from .quantize.calibration import CALIB_METHODS

    if quantize is not None and quantize not in QUANTIZE:
        raise OptionsError(
            f"quantization {quantize!r} is not supported", where="--quantize", fix=f"use one of {', '.join(QUANTIZE)}"
        )
    if precision not in PRECISIONS:
        raise OptionsError(
            f"precision {precision!r} is not valid", where="--precision", fix=f"use one of {', '.join(PRECISIONS)}"
        )
    if method not in CALIB_METHODS:
        raise OptionsError(
            f"calibration method {method!r} is not valid",
            where="--calib-method",
            fix=f"use one of {', '.join(CALIB_METHODS)}",
        )
    if quantize is None:
        if calibration is not None or min_agreement is not None:
            raise OptionsError(
                "--calibration and --min-agreement only apply to a quantized compile",
                where="--quantize",
                fix="add --quantize int8",
            )
        return
    if calibration is None:
        raise OptionsError(
            "--quantize int8 needs calibration data",
            where="--calibration",
            fix="give --calibration DATA.npz (arrays keyed by input name, samples stacked on the batch axis) or a folder of them",
        )
    if precision != "fp32":
        raise OptionsError(
            f"--quantize int8 and --precision {precision} cannot be combined",
            where="--precision",
            fix="choose one: int8 layers with float32 elsewhere, or mixed precision",
        )
    if buckets:
        raise OptionsError(
            "--quantize with --shape-buckets is not supported yet",
            where="--shape-buckets",
            fix="compile one quantized artifact per shape",
        )
    if samples is not None and int(samples) < 1:
        raise OptionsError(
            f"--calib-samples must be at least 1, got {samples}", where="--calib-samples", fix="e.g. --calib-samples 64"
        )
    if min_agreement is not None and not 0.0 <= float(min_agreement) <= 1.0:
        raise OptionsError(
            f"--min-agreement must be in [0, 1], got {min_agreement}",
            where="--min-agreement",
            fix="e.g. --min-agreement 0.99",
        )


def _calibration_digest(path) -> str | None:
    """Calibration data changes the output: its digest goes into the manifest and cache keys."""
    if path is None:
        return None
    from .quantize.calibration import calibration_digest

    return calibration_digest(path)


SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kb": 2**10,
    "m": 2**20,
    "mb": 2**20,
    "g": 2**30,
    "gb": 2**30,
    "t": 2**40,
    "tb": 2**40,
}


def parse_size(text) -> int | None:
    """'512M', '2G', '1.5GB', 1048576 -> bytes (binary units)."""
    if text is None or isinstance(text, int) and not isinstance(text, bool):
        if text is not None and text <= 0:
            raise OptionsError(
                f"memory size must be positive, got {text}", where="--max-memory", fix="e.g. --max-memory 2G"
            )
        return text
    t = str(text).strip().lower()
    num = t.rstrip("kmgtb")
    try:
        value = float(num) * SIZE_UNITS[t[len(num) :]]
    except (ValueError, KeyError):
        raise OptionsError(
            f"bad memory size {text!r}", where="--max-memory", fix="write it like 512M, 2G or 1.5GB"
        ) from None
    if value <= 0:
        raise OptionsError(
            f"memory size must be positive, got {text!r}", where="--max-memory", fix="e.g. --max-memory 2G"
        )
    return int(value)


SHIPPED_TUNING_LOGS = Path(__file__).resolve().parents[2] / "tuning_logs"  # records Kiln ships, per target key
SHIPPED_ENV = "KILN_TUNING_LOGS"  # another folder to look for shipped records in, or "none" (the test suite sets it)


def shipped_tuning_logs() -> Path | None:
    env = os.environ.get(SHIPPED_ENV)
    if env is None:
        return SHIPPED_TUNING_LOGS
    return None if env.strip().lower() == "none" else Path(env)


def resolve_tuning_db(path, target: Target) -> str | None:
    """A tuning database root (holding one folder per target key) or a target's folder itself.
    None (the default): the records Kiln ships in tuning_logs/ for exactly this target, if any, so
    a compile on a machine whose records ship gets tuned kernels with no tuning run; "none": no
    database. A root without this target's folder is an error naming the key."""
    from ..schedules.database import FILES, target_key

    if path is None:
        root = shipped_tuning_logs()
        if root is None:
            return None
        shipped = root / target_key(target)
        return str(shipped) if (shipped / FILES[0]).exists() and (shipped / FILES[1]).exists() else None
    if str(path).lower() == "none":
        return None
    p = Path(path)
    if (p / FILES[0]).exists():
        return str(p)
    if (p / target_key(target) / FILES[0]).exists():
        return str(p / target_key(target))
    raise OptionsError(
        f"no tuning records for target {str(target)!r} in {p}",
        where=str(p),
        fix=f"run `kiln tune ... --db {p}` first (records live in {p}/{target_key(target)}/), or pass --tuning-db none",
    )


def _db_digest(path) -> str | None:
    """Records change the output: the manifest and cache keys carry their digest."""
    if path is None:
        return None
    import hashlib

    from ..schedules.database import FILES

    h = hashlib.sha256()
    for name in FILES:
        f = Path(path) / name
        if f.exists():
            h.update(f.read_bytes())
    return h.hexdigest()
