import numpy as np
import onnx
import onnxruntime as ort

import dynashape
from dynashape.cli import main
from dynashape.demo_model import HEAD_DIM, HEADS, build_demo_model


def test_demo_model_decode_loop_matches_onnxruntime():
    model = build_demo_model()
    ds = dynashape.InferenceSession(model)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for batch in (1, 3):
        ids = rng.integers(0, 256, (batch, 5)).astype(np.int64)
        pk = rng.standard_normal((batch, HEADS, 2, HEAD_DIM)).astype(np.float32)
        pv = rng.standard_normal((batch, HEADS, 2, HEAD_DIM)).astype(np.float32)
        for _ in range(6):  # the cache grows by one position per step
            feeds = {"input_ids": ids, "past_key": pk, "past_value": pv}
            got, want = ds.run(None, feeds), ref.run(None, feeds)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
            ids = got[0][:, -1:].argmax(-1).astype(np.int64)
            pk, pv = got[1], got[2]
        assert pk.shape[2] == 2 + 5 + 5


def test_cli_demo_and_run(tmp_path, capsys):
    assert main(["demo", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "[1, 4, 10, 16]" in out  # prompt 8 + 1 initial position + 1 step
    path = tmp_path / "demo.onnx"
    onnx.save(build_demo_model(), path)
    assert main(["run", str(path), "--shape", "input_ids=2x3", "--shape", "past_key=2x4x5x16",
                 "--shape", "past_value=2x4x5x16", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "logits" in out and "[2, 3, 256]" in out and "[2, 4, 8, 16]" in out
    # a dynamic input without --shape is a clear error
    import pytest
    with pytest.raises(SystemExit, match="--shape input_ids"):
        main(["run", str(path)])
    # a shape outside the model's range is a typed error, reported with exit code 2
    np.savez(tmp_path / "in.npz", input_ids=np.zeros((1, 2), np.float32),
             past_key=np.ones((1, 4, 1, 16), np.float32), past_value=np.ones((1, 4, 1, 16), np.float32))
    assert main(["run", str(path), "--inputs", str(tmp_path / "in.npz")]) == 2
    assert "InputTypeError" in capsys.readouterr().err
