"""FuseAttention's bf16 builds (--precision bf16 on AVX512-BF16): Q Kᵀ and P V on vdpbf16ps, or on AMX tiles where
the CPU has AMX-BF16, the softmax in float32. Numerics against a float64 reference with the kernel's bf16 roundings
(Q, K, V and P) and against onnxruntime fp32, with masks and lengths that leave partial key blocks and query tiles
(on this host's build: AMX where it has it); the AMX build against the vdpbf16ps one; which targets, precisions and
head sizes take which build."""

import ml_dtypes
import numpy as np
import pytest
from helpers import ort_run, target_cpu_flags
from test_fuse_attention import _attention

import kiln
from kiln.runtime.hostinfo import host_cpu_flags, missing_cpu_features

needs_bf16 = pytest.mark.skipif(
    "avx512_bf16" not in target_cpu_flags(), reason="running it needs AVX512-BF16 (host and target)"
)
AMX_MISSING = missing_cpu_features(["amx-tile", "amx-bf16", "avx512bf16"])
SPR = "llvm -mcpu=sapphirerapids -mtriple=x86_64-linux-gnu"


def _bf16(a):
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def _reference(feeds, dim: int, causal_keys: int | None = None):
    q, k, v = (_bf16(feeds[n]) for n in "qkv")
    s = q @ np.swapaxes(k, -1, -2) * np.float64(np.float32(dim**-0.5))
    if "mask" in feeds:
        s = s + feeds["mask"]
    if causal_keys is not None:
        seq = s.shape[-2]
        s = s + np.triu(np.full((seq, causal_keys), -np.inf), k=causal_keys - seq + 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    # the kernel rounds the unnormalized probabilities to bf16 for P V and divides by their float32 sum
    return (_bf16(p) @ v) / p.sum(-1, keepdims=True)


CASES = [
    (seq, keys, mask) for seq, keys in [(197, None), (31, None), (5, None)] for mask in ("none", "padding", "causal")
]
CASES += [(20, 300, "none"), (20, 300, "padding")]  # cross attention: more keys than queries, a partial last block


@needs_bf16
@pytest.mark.parametrize("seq, keys, mask", CASES)
def test_bf16_attention_matches_a_bf16_reference(tmp_path, seq, keys, mask):
    model, feeds = _attention(seq, mask=mask, keys=keys)
    r = kiln.compile(model, tmp_path / "m.kiln", precision="bf16")
    assert r.report["attention_fused"] == 1 and r.report["attention_bf16"] == 1
    out = kiln.load(tmp_path / "m.kiln").run(feeds)["output"]
    ref = _reference(feeds, 64, causal_keys=seq if mask == "causal" else None)
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-3 * np.abs(ref).max())
    fp32 = ort_run(model, feeds)[0]
    assert float((out.ravel() @ fp32.ravel()) / np.linalg.norm(out) / np.linalg.norm(fp32)) > 0.9999


@pytest.mark.parametrize(
    "target, precision, bf16",
    [
        ("llvm -mcpu=znver4", "bf16", 1),
        ("llvm -mcpu=znver4", "fp32", 0),
        ("llvm -mcpu=skylake-avx512", "bf16", 0),  # AVX-512 without BF16: no bf16 kernel
    ],
)
def test_which_builds_take_bf16(tmp_path, target, precision, bf16):
    model, _ = _attention(16)
    r = kiln.compile(model, tmp_path / "m.kiln", target=target, precision=precision)
    assert r.report["attention_bf16"] == bf16
    if bf16:
        assert r.report["attention_fused"] == 1


@pytest.mark.parametrize(
    "target, dim, c_kernel",
    [
        (SPR, 64, "attention_amx"),
        (SPR, 80, "attention_bf16"),  # a head of 80 features is no whole number of 32-feature A tiles
        ("llvm -mcpu=znver4", 64, "attention_bf16"),
    ],
)
def test_which_bf16_build_a_head_takes(tmp_path, target, dim, c_kernel):
    model, _ = _attention(16, dim=dim)
    r = kiln.compile(model, tmp_path / "m.kiln", target=target, precision="bf16")
    assert r.report["attention_bf16"] == 1
    (info,) = [v for v in r.manifest["buckets"][0]["kernel_info"].values() if v["kind"] == "attention"]
    unit = "amx-bf16 tdpbf16ps" if c_kernel == "attention_amx" else "avx512-bf16 vdpbf16ps"
    assert info["unit"] == unit, info


@pytest.mark.skipif(bool(AMX_MISSING), reason=f"needs AMX-BF16 (this host lacks {', '.join(AMX_MISSING)})")
@pytest.mark.parametrize("seq, keys, mask", [(197, None, "padding"), (33, None, "causal"), (20, 300, "none")])
def test_amx_build_matches_the_vdpbf16ps_build(tmp_path, seq, keys, mask):
    """The same bf16 products and float32 softmax, summed in another order: within float32 rounding of each other."""
    model, feeds = _attention(seq, mask=mask, keys=keys)
    kiln.compile(model, tmp_path / "amx.kiln", precision="bf16", target="host")
    kiln.compile(model, tmp_path / "avx.kiln", precision="bf16", target="llvm -mcpu=znver4")
    got = kiln.load(tmp_path / "amx.kiln").run(feeds)["output"]
    other = kiln.load(tmp_path / "avx.kiln").run(feeds)["output"]
    np.testing.assert_allclose(got, other, rtol=0, atol=1e-4 * np.abs(other).max())


def test_key_block_agrees_with_the_c_build():
    import ctypes

    from kiln.compiler.passes.fuse_attention import KERNELS
    from kiln.schedules.kernels import build

    if "avx512_bf16" not in host_cpu_flags():
        pytest.skip("loading the bf16 build needs AVX512-BF16")
    for isa in ("avx512_bf16",) + (() if AMX_MISSING else ("amx_bf16",)):
        function, source, _, kb = KERNELS[isa]
        assert getattr(ctypes.CDLL(build(source)[1]), f"{function}_key_block")() == kb
