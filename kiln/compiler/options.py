"""One frozen options object for the compile stage. Everything in it that changes the output goes
into the artifact's manifest (`to_json`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import OptionsError
from ..frontends.freeze import FrozenInput, parse_frozen_inputs
from ..frontends.shapes import BUCKETS_FLAG, parse_input_shapes, parse_shape_buckets
from ..optfield import option, with_defaults
from ..runtime.artifact import BUCKET_POLICIES
from ..target import Target
from .quantize.calibration import CALIB_METHODS

OPT_LEVELS = (0, 1, 2)  # the pipeline's rows go up to level 2 (tests/test_cli_newuser.py checks it)
QUANTIZE = ("int8",)
PRECISIONS = ("fp32", "fp16", "bf16")
LAYOUTS = ("NCHW", "NHWC", "NCHWc", "auto")


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """The compile options, parsed. Each field's default, choices and --flag help are declared here
    only: `make()` fills in the defaults and kiln.cli builds its flags from the fields."""

    target: Target = option(help="default: the host CPU, detected")
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = option(
        (), "repeatable: pin an input's shape", name="--input-shape", metavar="NAME:1x3x224x224", repeat=True
    )
    opt_level: int = option(2, "0: lowering only, 1: + graph clean-up, 2: + fusion", choices=OPT_LEVELS, type=int)
    disabled_passes: tuple[str, ...] = option(
        (),
        "repeatable: skip this pass, named in any case (kiln inspect --passes lists them)",
        name="--disable-pass",
        metavar="NAME",
        repeat=True,
    )
    layout: str = option(
        "NCHWc",
        "NCHWc: channels blocked by the vector width, NCHW, NHWC, or auto: measure all on this host",
        choices=LAYOUTS,
    )
    tuning_db: str | None = option(
        None,
        "apply tuned records from this database (kiln tune --db); default: the records Kiln ships in "
        "tuning_logs/ for this target or one with the same capabilities (the report's tuning_records says which); "
        "'none': default schedules only",
        metavar="DIR",
    )  # the target's folder of a tuning database (see resolve_tuning_db)
    # one function per bucket: ((input, dims), ...) per bucket, smallest first; () = one shape
    shape_buckets: tuple[tuple[tuple[str, tuple[int, ...]], ...], ...] = option(
        (),
        "one function per bucket (repeat per input; bucket i takes each input's i-th shape); the model must "
        "declare the bucketed dims symbolic",
        metavar="NAME:1x3x224x224,4x3x224x224",
        repeat=True,
    )
    bucket_policy: str = option(
        "pad",
        "inputs between buckets: pad to the next bucket (zeros, or --pad-value) and crop outputs, or refuse",
        choices=BUCKET_POLICIES,
    )
    max_memory: int | None = option(
        None,
        "refuse models whose planned memory (activations + weights) exceeds it, e.g. 512M, 2G "
        "(checked before building)",
        metavar="SIZE",
        type=str,
    )  # bytes
    quantize: str | None = option(None, "post-training static quantization (needs --calibration)", choices=QUANTIZE)
    calibration: str | None = option(
        None,
        "arrays keyed by input name, samples stacked on the batch axis (16x3x224x224 = 16 samples of 1x3x224x224): "
        "--quantize calibrates on them; with --precision bf16|fp16 the build is measured against float32 on them",
        metavar="DATA.npz|DIR",
    )
    calib_method: str = option("minmax", "how each tensor's range is chosen", choices=CALIB_METHODS)
    calib_samples: int | None = option(
        None,
        "calibrate on the first N samples, check accuracy on the rest (default: hold out a quarter)",
        metavar="N",
        type=int,
    )
    min_agreement: float | None = option(
        None,
        "fail unless top-1 agreement with the float model (cosine for non-classifiers) is at least X",
        metavar="X",
        type=float,
    )
    keep_float: tuple[str, ...] = option(
        (), "repeatable: keep this layer (ONNX node name) float", metavar="LAYER", repeat=True
    )
    precision: str = option(
        "fp32",
        "mixed precision with fp32 accumulation (kiln tune: tune the kernels of that build)",
        choices=PRECISIONS,
    )
    freeze_inputs: tuple[FrozenInput, ...] = option(
        (),
        "repeatable: compile this input in as a constant (a scalar or small array, e.g. sr=16000, axes=[0,2]); "
        "Ifs and shapes that depend on it fold away",
        name="--freeze-input",
        metavar="NAME=VALUE",
        repeat=True,
    )
    pad_values: tuple[tuple[str, float], ...] = option(
        (),
        "repeatable: what a bucketed input is padded with up to its bucket (token ids: the tokenizer's pad id; "
        "default 0, which is also what an attention mask needs)",
        name="--pad-value",
        metavar="NAME=VALUE",
        repeat=True,
    )

    # the target's backend (kiln/compiler/backends), resolved by make(); not an option of its own
    backend: object = dataclasses.field(default=None, compare=False, repr=False)  # a backends.Backend

    @staticmethod
    def make(**given) -> CompileOptions:
        """Parse and check raw options (shape strings, sizes like '2G', pass names in any case); the
        fields' defaults fill in what is not given (or given as None)."""
        o = with_defaults(CompileOptions, given)
        if o["opt_level"] not in OPT_LEVELS:
            raise OptionsError(
                f"opt level {o['opt_level']!r} is not valid", where="--opt-level", fix=f"use one of {list(OPT_LEVELS)}"
            )
        if o["layout"] not in LAYOUTS:
            raise OptionsError(
                f"layout {o['layout']!r} is not valid", where="--layout", fix=f"use one of {', '.join(LAYOUTS)}"
            )
        if o["bucket_policy"] not in BUCKET_POLICIES:
            raise OptionsError(
                f"bucket policy {o['bucket_policy']!r} is not valid",
                where="--bucket-policy",
                fix=f"use one of {', '.join(BUCKET_POLICIES)}",
            )
        shapes = parse_input_shapes(o["input_shapes"])
        buckets = parse_shape_buckets(o["shape_buckets"])
        frozen = parse_frozen_inputs(o["freeze_inputs"])
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
        quantize, calibration, precision = o["quantize"], o["calibration"], o["precision"]
        _check_quantize(
            quantize, calibration, o["calib_method"], o["calib_samples"], o["min_agreement"], precision, buckets
        )
        t = Target.parse(o.get("target"))
        from .backends import backend_for

        backend = backend_for(t)  # asked once: the options carry it to every stage
        backend.check_options(t, quantize, buckets, o["layout"])
        from .pipeline import resolve_pass_names

        return CompileOptions(
            t,
            tuple(sorted(shapes.items())),
            int(o["opt_level"]),
            resolve_pass_names(backend.all_rows(), o["disabled_passes"]),
            o["layout"],
            resolve_tuning_db(o["tuning_db"], t, backend),
            tuple(tuple(sorted(b.items())) for b in buckets),
            o["bucket_policy"],
            parse_size(o["max_memory"]),
            quantize,
            str(calibration) if calibration is not None else None,
            o["calib_method"],
            int(o["calib_samples"]) if o["calib_samples"] is not None else None,
            float(o["min_agreement"]) if o["min_agreement"] is not None else None,
            tuple(dict.fromkeys(o["keep_float"])),
            precision,
            frozen,
            _pad_values(o["pad_values"], {n for b in buckets for n in b}),
            backend,
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
            "input_shapes": {k: _shape_json(v) for k, v in self.input_shapes},
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
            "pad_values": dict(self.pad_values),
        }


def _pad_values(specs, bucketed: set) -> tuple[tuple[str, float], ...]:
    """["input_ids=0", ...] or {name: value} -> ((name, value), ...) sorted; each name a bucketed input."""
    items = list(specs.items()) if isinstance(specs, dict) else [str(s).split("=", 1) for s in specs or ()]
    out = {}
    for item in items:
        if len(item) != 2:
            raise OptionsError(f"pad value {item[0]!r} is not NAME=VALUE", where="--pad-value", fix="e.g. input_ids=0")
        name, value = str(item[0]).strip(), item[1]
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise OptionsError(
                f"pad value {value!r} for {name!r} is not a number", where="--pad-value", fix="e.g. input_ids=0"
            ) from None
        if name not in bucketed:
            raise OptionsError(
                f"--pad-value names {name!r}, which has no --shape-buckets",
                where="--pad-value",
                fix=f"pad values are for bucketed inputs: {', '.join(sorted(bucketed)) or 'there are none'}",
            )
        out[name] = value
    return tuple(sorted(out.items()))


def _check_quantize(quantize, calibration, method, samples, min_agreement, precision, buckets) -> None:
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
        if min_agreement is not None or (calibration is not None and precision == "fp32"):
            raise OptionsError(
                "--calibration applies to a quantized compile (or checks --precision bf16/fp16 against float32); "
                "--min-agreement to a quantized compile",
                where="--quantize",
                fix="add --quantize int8, or --precision bf16 to check it against float32 on the samples",
            )
        return
    if calibration is None:
        raise OptionsError(
            "--quantize int8 needs calibration data",
            where="--calibration",
            fix="give --calibration DATA.npz (arrays keyed by input name, samples stacked on the batch axis) "
            "or a folder of them",
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


def resolve_tuning_db(path, target: Target, backend) -> str | None:
    """A tuning database root (holding one folder per target key) or a target's folder itself, resolved by
    the target's backend (kiln/compiler/backends: MetaSchedule records, or an accelerator's own)."""
    return backend.tuning_db(path, target)


def _db_digest(path) -> str | None:
    """Records change the output: the manifest and cache keys carry their digest."""
    if path is None:
        return None
    import hashlib

    from ..accel.vta.records import FILE as VTA_FILE
    from ..schedules.tuning.database import CHECKED, DEFAULTS, FILES

    h = hashlib.sha256()
    for name in (*FILES, DEFAULTS, CHECKED, VTA_FILE):  # the ledgers decide which records apply
        f = Path(path) / name
        if f.exists():
            h.update(f.read_bytes())
    return h.hexdigest()


def _shape_json(dims):
    """A pinned shape as JSON: a tensor's dims, a sequence's element shapes (lists), null for an absent optional."""
    if dims is None:
        return None
    return [d if isinstance(d, int) else list(d) for d in dims]
