"""One loaded model used from many threads at once: every output correct."""

import concurrent.futures

import numpy as np
from helpers import rand

import kiln


def test_eight_threads_hammer_one_model(small_artifact):
    model = kiln.load(small_artifact)
    xs = [rand(1, 3, 8, 8, seed=i) for i in range(16)]
    refs = [model.run({"input": x})["output"] for x in xs]

    def work(t):
        bad = 0
        for k in range(50):
            i = (t * 7 + k) % len(xs)
            out = model.run({"input": xs[i]})["output"]
            bad += not np.array_equal(out, refs[i])
        return bad

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(work, range(8))) == [0] * 8


def test_threads_on_several_models_and_buckets(tmp_path, small_conv_model):
    kiln.compile(small_conv_model, tmp_path / "b.kiln", shape_buckets="input:1x3x8x8,4x3x8x8")
    models = [kiln.load(tmp_path / "b.kiln"), kiln.load(tmp_path / "b.kiln")]
    xs = [rand(n, 3, 8, 8, seed=n) for n in (1, 2, 3, 4)]
    refs = [models[0].run({"input": x})["output"] for x in xs]

    def work(t):
        return all(
            np.array_equal(models[t % 2].run({"input": xs[(t + k) % 4]})["output"], refs[(t + k) % 4])
            for k in range(40)
        )

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert all(pool.map(work, range(8)))
