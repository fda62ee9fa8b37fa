"""`kiln run` and `kiln unpack`: execute an artifact, or lay its verified members out for kiln_run."""

from __future__ import annotations

import json

from ..errors import OptionsError
from .flags import trusted_key, trusted_keys

ORDER = 20
COMMANDS = {
    "run": "run an artifact on inputs from an .npz",
    "unpack": "verify an artifact and write its members into a folder (for the C++ runner kiln_run)",
}


def _run(a) -> int:
    import numpy as np

    from .._io import atomic_open
    from ..runtime import load
    from ..runtime.bench import read_inputs

    model = load(a.model, num_threads=a.threads, trusted_keys=trusted_keys(a))  # checked before the inputs are read
    feed = read_inputs(a.inputs)
    outs = model.run(feed)
    with atomic_open(a.output, "wb") as f:
        np.savez(f, **outs)
    print(f"wrote {a.output}: " + ", ".join(f"{k} {'x'.join(map(str, v.shape))} {v.dtype}" for k, v in outs.items()))
    return 0


def _unpack(a) -> int:
    """Verify an artifact and write its members into a folder (for kiln_run, the C++ runner)."""
    import shutil
    import tempfile
    from pathlib import Path

    from ..runtime import artifact as art

    manifest, members = art.read_artifact(a.model, trusted_keys=trusted_keys(a))  # checksums (and signature) verified
    out = Path(a.directory)
    if out.exists() and any(out.iterdir()):
        raise OptionsError(f"{out} is not empty", where=str(out), fix="give a new or empty folder")
    tmp = Path(tempfile.mkdtemp(prefix=".kiln-unpack-", dir=out.parent if out.parent.exists() else None))
    for name, data in members.items():
        (tmp / name).write_bytes(data)
    (tmp / art.MANIFEST).write_text(json.dumps(manifest, indent=2))
    if out.exists():
        out.rmdir()
    shutil.move(str(tmp), str(out))
    print(f"unpacked {len(members)} members and {art.MANIFEST} of {a.model} into {out}")
    return 0


def register(sub) -> None:
    r = sub.add_parser("run", help=COMMANDS["run"])
    r.add_argument("model")
    r.add_argument("--inputs", required=True, metavar="IN.npz")
    r.add_argument("-o", "--output", required=True, metavar="OUT.npz")
    r.add_argument("--threads", type=int, default=None, help="default: physical cores")
    trusted_key(r)
    r.set_defaults(fn=_run)
    u = sub.add_parser("unpack", help=COMMANDS["unpack"])
    u.add_argument("model", metavar="MODEL.kiln")
    u.add_argument("directory", metavar="DIR")
    trusted_key(u)
    u.set_defaults(fn=_unpack)
