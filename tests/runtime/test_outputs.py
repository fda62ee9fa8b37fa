"""A run's outputs (kiln/runtime/outputs.py): after a bucket's first two runs, outputs the VM allocates afresh leave
as views of its tensors; an input or a constant returned as it is, and one tensor returned twice, still leave as
copies, so no later run and no write of the caller's changes another run's arrays."""

import numpy as np
from helpers import aligned, make_model
from onnx import helper

import kiln


def _load(tmp_path, nodes, x, outputs, inits):
    model = make_model(nodes, {"x": x}, outputs, inits)
    kiln.compile(model, tmp_path / "m.kiln")
    return kiln.load(tmp_path / "m.kiln", num_threads=1)


def test_computed_outputs_become_views_each_of_its_own(tmp_path):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    m = _load(tmp_path, [helper.make_node("Add", ["x", "one"], ["y"])], x, ["y"], {"one": np.ones(1, np.float32)})
    runs = [m.run({"x": x + k})["y"] for k in range(5)]
    for k, y in enumerate(runs):  # every run's array kept its own values
        np.testing.assert_array_equal(y, x + k + 1)
    assert runs[0].flags.owndata and runs[1].flags.owndata  # the first two runs: copies
    assert not runs[2].flags.owndata and not runs[4].flags.owndata  # then views of the VM's tensors
    assert not any(np.shares_memory(a, b) for i, a in enumerate(runs) for b in runs[i + 1 :])
    runs[4][...] = -1  # a caller writing its array changes no other run's
    np.testing.assert_array_equal(m.run({"x": x})["y"], x + 1)


def test_inputs_and_constants_returned_as_they_are_stay_copies(tmp_path):
    """Identity of the input, the same computed tensor twice, and a constant output: after the probe runs too."""
    x = np.array([[1.5, -2.0, 3.25]], np.float32)
    c = np.array([[4.0, 5.0, 6.0]], np.float32)
    nodes = [
        helper.make_node("Identity", ["x"], ["same"]),
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Identity", ["r"], ["r2"]),
        helper.make_node("Identity", ["c"], ["const"]),
    ]
    m = _load(tmp_path, nodes, x, ["same", "r", "r2", "const"], {"c": c})
    for _ in range(4):
        feed = x.copy()
        out = m.run({"x": feed})
        feed[...] = 7  # the caller reuses its input array
        np.testing.assert_array_equal(out["same"], x)
        assert not np.shares_memory(out["r"], out["r2"])
        out["r2"][...] = -9
        np.testing.assert_array_equal(out["r"], np.maximum(x, 0))
        out["const"][...] = 0  # a caller writing the constant's array changes no later run's
    np.testing.assert_array_equal(m.run({"x": x})["const"], c)


def test_an_input_taken_in_place_and_returned_is_copied(tmp_path):
    """A large aligned input is the VM's argument itself (a new address each run, unlike a constant): returned as it
    is, the output must still not be the caller's array."""
    x = np.linspace(-1, 1, 8192, dtype=np.float32).reshape(1, 8192)
    nodes = [helper.make_node("Identity", ["x"], ["same"]), helper.make_node("Relu", ["x"], ["r"])]
    m = _load(tmp_path, nodes, x, ["same", "r"], {})
    for k in range(4):
        feed = aligned(x + k)
        out = m.run({"x": feed})
        assert not np.shares_memory(out["same"], feed)
        feed[...] = 7
        np.testing.assert_array_equal(out["same"], x + k)
        np.testing.assert_array_equal(out["r"], np.maximum(x + k, 0))


def test_an_output_numpy_cannot_take_over_dlpack_is_copied():
    """bfloat16 has no numpy dtype: the first try over DLPack fails, the output leaves through Tensor.numpy(), and
    later runs go there directly (no DLPack try per run)."""
    import tvm

    from kiln.runtime.outputs import OutputViews

    views = OutputViews()
    t = tvm.runtime.tensor(np.arange(4, dtype=np.float32)).copyto(tvm.cpu())
    bf = tvm.runtime.empty((4,), "bfloat16", tvm.cpu())
    for _ in range(3):
        a, b = views.arrays(0, [t, bf], [], [])
        np.testing.assert_array_equal(a, np.arange(4, dtype=np.float32))
        assert b.shape == (4,) and b.dtype != np.float32
    assert views._dlpack == {(0, 1): False}
