"""onnxruntime's uint8 x int8 pair-sum saturation: the switch, and the probe that asks onnxruntime.

onnxruntime's CPU kernels for uint8 x int8 on AVX2 / AVX512BW machines without VNNI add pairs
of products with vpmaddubsw, which saturates the pair sum to int16: their MatMulInteger /
DynamicQuantizeMatMul / DynamicQuantizeLSTM / QLinearMatMul results are then not the exact
products the ONNX spec defines. With VNNI (vpdpbusd: four products summed into int32, as on this
project's AVX-512 VNNI machines) onnxruntime's products are exact, as ours. The default here is
the exact product; ``set_u8s8_saturation(True)`` (or DYNASHAPE_U8S8_SATURATE=1) reproduces the
saturation bit for bit, for comparing with an onnxruntime that saturates; ``"auto"`` (or
DYNASHAPE_U8S8_SATURATE=auto) asks onnxruntime on this CPU (``onnxruntime_saturates``: one tiny
MatMulInteger, once a process) and follows it, so that one setting matches onnxruntime on every
CPU instead of emulating one CPU's kernels everywhere.

The switch is read by every integer product (integer_gemm.py, qgemm.py, the quantized ops). A
session's ``u8s8_saturate`` option (dynashape/options.py) holds for its runs only: a ContextVar set
per run (request_state.py, as the loop limit), which a build queued by the run carries to the
compile worker (impls/context.py), so concurrent sessions with different settings each get
theirs. Where a session leaves it unset (None), the process's setting serves: what
``dynashape.ops.linalg.set_u8s8_saturation`` set, else DYNASHAPE_U8S8_SATURATE (an operator's
override of the default, read at import), else the exact product.
"""

from __future__ import annotations

import contextlib
import contextvars
import os

from ..errors import OptionsError

_AUTO = "auto"


def _setting(raw) -> bool | str:
    if isinstance(raw, str):
        text = raw.strip().lower()
        return _AUTO if text == _AUTO else text not in ("", "0", "false", "no", "off")
    return bool(raw)


_U8S8_SATURATE: bool | str = _setting(os.environ.get("DYNASHAPE_U8S8_SATURATE", "0"))

# the session's setting for the run in progress: True, False or "auto"; None leaves the process's
SESSION_SATURATE: contextvars.ContextVar[bool | str | None] = contextvars.ContextVar("u8s8_saturate", default=None)

# the probe: 255 x 127 over 128 products, 64 pairs of 64770 each: 4145280 exact, 64 * 32767 =
# 2097088 where pair sums saturate to int16 (a constant B: onnxruntime packs it, as quantize_dynamic's
# weights are)
_PROBE_K = 128


def onnxruntime_saturates() -> bool | None:
    """Whether onnxruntime's CPU kernels saturate uint8 x int8 pair sums on this machine (True), or
    compute exact products (False); None where onnxruntime cannot be imported. Asked once a process."""
    if _PROBE:
        return _PROBE[0]
    try:
        import numpy as np
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        _PROBE.append(None)
        return None
    b = numpy_helper.from_array(np.full((_PROBE_K, 1), 127, np.int8), "b")
    g = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "probe",
                          [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, _PROBE_K])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])], [b])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    y = int(sess.run(None, {"a": np.full((1, _PROBE_K), 255, np.uint8)})[0][0, 0])
    _PROBE.append(y != 255 * 127 * _PROBE_K)
    return _PROBE[0]


_PROBE: list = []


def set_u8s8_saturation(on) -> bool | str:
    """Saturate uint8 x int8 pair sums to int16 as onnxruntime's AVX2 kernels do (True), compute
    the exact product (False, the default), or do what this CPU's onnxruntime does ("auto").
    Returns the previous setting."""
    global _U8S8_SATURATE
    prev, _U8S8_SATURATE = _U8S8_SATURATE, _setting(on)
    return prev


def u8s8_saturation() -> bool:
    session = SESSION_SATURATE.get()
    if session is not None:
        return bool(onnxruntime_saturates()) if session == _AUTO else session
    global _U8S8_SATURATE
    if _U8S8_SATURATE is _AUTO:  # resolved once: the probe's answer stays for the process
        _U8S8_SATURATE = bool(onnxruntime_saturates())
    return _U8S8_SATURATE


def session_setting(value) -> bool | str | None:
    """A session's ``u8s8_saturate`` checked at its creation: True, False, "auto" (asked of
    onnxruntime now, once a process, so that no run waits for the probe) or None (the process's)."""
    if value is None or isinstance(value, bool):
        return value
    if value == _AUTO:
        onnxruntime_saturates()
        return _AUTO
    raise OptionsError(f"u8s8_saturate={value!r}: expected 'auto', True, False or None")


@contextlib.contextmanager
def saturation(value: bool | str | None):
    """The session's setting around work outside a run that may compute a product (a load's
    folding of constants and its builds)."""
    token = SESSION_SATURATE.set(value)
    try:
        yield
    finally:
        SESSION_SATURATE.reset(token)
