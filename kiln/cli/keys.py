"""`kiln keygen` and `kiln sign`: Ed25519 keys, and signing an artifact's manifest with one."""

from __future__ import annotations

ORDER = 50
COMMANDS = {
    "keygen": "make an Ed25519 key pair for signing artifacts",
    "sign": "sign an artifact's manifest (kiln run/bench/serve --trusted-key check it)",
}


def _keygen(a) -> int:
    from ..sign import keygen

    kid = keygen(a.private, a.public)
    print(
        f"wrote {a.private} (private, mode 600: keep it secret) and {a.public} (public: give it to loaders); "
        f"key id {kid}"
    )
    return 0


def _sign(a) -> int:
    from ..sign import sign

    kid = sign(a.model, a.key)
    print(f"signed {a.model} with key {kid}")
    return 0


def register(sub) -> None:
    k = sub.add_parser("keygen", help=COMMANDS["keygen"])
    k.add_argument("private", metavar="PRIVATE")
    k.add_argument("public", metavar="PUBLIC")
    k.set_defaults(fn=_keygen)
    g = sub.add_parser("sign", help=COMMANDS["sign"])
    g.add_argument("model", metavar="MODEL.kiln")
    g.add_argument("--key", required=True, metavar="PRIVATE")
    g.set_defaults(fn=_sign)
