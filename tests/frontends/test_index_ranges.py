"""Inputs that index a table (token ids into an embedding): an index outside the table is an input error naming
the input and its range, as onnxruntime rejects it. Before, BERT's input_ids = 10**9 read outside the embedding
table and the process died (a segfault in Model.run, and in `kiln serve` the server); the compiled Gather now
clamps (TVM's clip mode), so an index computed inside the model cannot read outside its table either."""

import numpy as np
import pytest
from helpers import make_model, ort_run, rand
from onnx import TensorProto, helper

import kiln
from kiln.frontends.index_ranges import index_ranges


def _embedding():
    """ids (int32) -> Cast int64 -> Gather from a 10-row table, plus token types (int64) from a 2-row table, and a
    Gather of a run-time tensor's rows by `pick` (its rows are not a table: not checked)."""
    nodes = [
        helper.make_node("Cast", ["ids"], ["ids64"], to=TensorProto.INT64),
        helper.make_node("Gather", ["table", "ids64"], ["e"], name="word"),
        helper.make_node("Gather", ["types", "tt"], ["t"], name="type"),
        helper.make_node("Add", ["e", "t"], ["s"]),
        helper.make_node("Gather", ["s", "pick"], ["y"], axis=1, name="pick_rows"),
    ]
    feeds = {
        "ids": np.array([[1, 9, -10, 3]], np.int32),
        "tt": np.array([[0, 1, 1, -2]], np.int64),
        "pick": np.array([3, 0], np.int64),
    }
    inits = {"table": rand(10, 8, seed=1), "types": rand(2, 8, seed=2)}
    return make_model(nodes, feeds, ["y"], inits), feeds


def test_inputs_that_index_a_constant_table_get_its_range():
    model, _ = _embedding()
    assert index_ranges(model) == {"ids": [-10, 9, "word"], "tt": [-2, 1, "type"]}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    model, feeds = _embedding()
    path = tmp_path_factory.mktemp("ranges") / "m.kiln"
    kiln.compile(model, path)
    return model, feeds, kiln.load(path)


def test_indices_at_the_ends_of_the_range_match_onnxruntime(artifact):
    model, feeds, m = artifact
    np.testing.assert_allclose(m.run(feeds)["y"], ort_run(model, feeds)[0], rtol=1e-6)


@pytest.mark.parametrize("name, value", [("ids", 10), ("ids", -11), ("ids", 2**31 - 1), ("tt", 2), ("tt", -(10**12))])
def test_an_index_outside_its_table_is_an_input_error(artifact, name, value):
    _, feeds, m = artifact
    bad = dict(feeds, **{name: feeds[name].copy()})
    bad[name][0, 1] = value
    with pytest.raises(kiln.InputError, match=rf"input '{name}' holds {value}, outside"):
        m.run(bad)
    m.run(feeds)  # and the model runs on


def test_the_compiled_gather_clamps_what_the_check_does_not_see(artifact):
    """Past the input check (the VM entry called directly, as an index computed in the model would reach it), a
    row far outside the table is clamped to the table, never read outside it."""
    _, feeds, m = artifact
    arrays = m.validate(feeds)
    arrays[0] = np.full_like(arrays[0], 2**30)
    y = m._run_bucket(0, arrays)[0]
    assert y.shape == (1, 2, 8) and np.isfinite(y).all()


@pytest.mark.parametrize("op", ["GatherElements", "GatherND", "ScatterElements", "ScatterND"])
def test_element_and_nd_indices_outside_the_data_are_clamped(tmp_path, op):
    """Run-time indices of 10**9 and -10**9 read or write the data's last and first rows, never outside it (each
    was a segfault); in-range ones, negative included, match onnxruntime."""
    x = rand(3, 5)
    if op == "GatherElements":
        node, i, extra = helper.make_node(op, ["x", "i"], ["y"], axis=1), np.array([[0, -1], [2, 4], [1, 3]]), {}
    elif op == "GatherND":
        node, i, extra = helper.make_node(op, ["x", "i"], ["y"]), np.array([[0, 4], [-1, 2]]), {}
    elif op == "ScatterElements":
        node = helper.make_node(op, ["x", "i", "u"], ["y"], axis=1)
        i, extra = np.array([[0, -1], [2, 4], [1, 3]]), {"u": rand(3, 2, seed=5)}
    else:
        node = helper.make_node(op, ["x", "i", "u"], ["y"])
        i, extra = np.array([[0, 4], [-1, 2]]), {"u": rand(2, seed=5)}
    feeds = {"x": x, "i": i.astype(np.int64), **extra}
    model = make_model([node], feeds, ["y"], {})
    kiln.compile(model, tmp_path / "m.kiln")
    m = kiln.load(tmp_path / "m.kiln")
    np.testing.assert_allclose(m.run(feeds)["y"], ort_run(model, feeds)[0], rtol=1e-6)
    far = feeds["i"].copy()
    far[0, 0], far[1, -1] = 10**9, -(10**9)
    clamped = far.copy()
    clamped[0, 0] = 4 if op.endswith("Elements") else 2  # the last index of the axis the slot addresses
    clamped[1, -1] = 0
    ref = ort_run(model, dict(feeds, i=clamped))[0]
    np.testing.assert_allclose(m.run(dict(feeds, i=far))["y"], ref, rtol=1e-6)


def test_roi_align_batch_index_and_max_unpool_indices_outside_are_clamped(tmp_path):
    """RoiAlign's batch index and MaxUnpool's indices were unchecked (a segfault at 10**9): clamped into the
    batch and the output now, in-range ones unchanged against onnxruntime."""
    roi = helper.make_node("RoiAlign", ["x", "rois", "bi"], ["r"], output_height=2, output_width=2)
    unpool = helper.make_node("MaxUnpool", ["u", "ui"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    feeds = {
        "x": rand(2, 4, 8, 8),
        "rois": np.array([[0, 0, 4, 4], [1, 1, 6, 6]], np.float32),
        "bi": np.array([0, 1], np.int64),
        "u": rand(1, 1, 2, 2, seed=3),
        "ui": np.array([[[[0, 3], [8, 15]]]], np.int64),
    }
    model = make_model([roi, unpool], feeds, ["r", "y"], {})
    kiln.compile(model, tmp_path / "m.kiln")
    m = kiln.load(tmp_path / "m.kiln")
    for got, ref in zip(m.run(feeds).values(), ort_run(model, feeds)):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    far = dict(feeds, bi=np.array([10**9, 1], np.int64), ui=np.array([[[[0, 10**9], [8, 15]]]], np.int64))
    near = dict(feeds, bi=np.array([1, 1], np.int64), ui=np.array([[[[0, 15], [8, 15]]]], np.int64))
    r, y = m.run(far).values()
    np.testing.assert_allclose(r, ort_run(model, near)[0], rtol=1e-5, atol=1e-6)
    assert y.shape == (1, 1, 4, 4) and y[0, 0, 0, 0] == feeds["u"][0, 0, 0, 0]


def test_an_embedding_from_torch_export_clamps_a_token_past_its_table(tmp_path):
    """ClipTakeIndices clamps every frontend's gathers: an nn.Embedding exported with torch.export read outside its
    table at token 10**9 (a segfault); now it answers for the last row."""
    torch = pytest.importorskip("torch")

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.e = torch.nn.Embedding(100, 16)

        def forward(self, ids):
            return self.e(ids).sum(1)

    module = Embed().eval()
    torch.export.save(torch.export.export(module, (torch.zeros(1, 8, dtype=torch.long),)), tmp_path / "e.pt2")
    r = kiln.compile(tmp_path / "e.pt2", tmp_path / "e.kiln")
    assert r.report["takes_clipped"] >= 1
    m = kiln.load(tmp_path / "e.kiln")
    ids = np.zeros((1, 8), np.int64)
    ids[0, 0] = 10**9
    with torch.no_grad():
        ref = module(torch.from_numpy(np.where(ids > 99, 99, ids))).numpy()
    np.testing.assert_allclose(m.run({m.inputs[0].name: ids})[m.outputs[0].name], ref, rtol=1e-5, atol=1e-6)
