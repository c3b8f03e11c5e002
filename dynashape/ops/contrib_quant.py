"""onnxruntime's quantization contrib ops (domain ``com.microsoft``), matched to its CPU kernels.

Integer outputs are bit-exact with onnxruntime's CPU execution provider on x86-64 with AVX2 and
FMA (what quantized models run on). onnxruntime does not compute these ops with the textbook
formula but in float32, with fused multiply-adds, 256-entry lookup tables and sequential sums;
the result differs from the formula at and near ties, so the kernels redo its arithmetic
(``qlinear_arith.py``). A module per family:

* ``qlinear_binary.py``: QLinearAdd / QLinearMul (65536-entry tables, MLAS's FMA chain).
* ``qlinear_tables.py``: QLinearSigmoid / QLinearLeakyRelu / QLinearConcat / QLinearWhere /
  QLinearSoftmax (onnxruntime's 256-entry tables).
* ``qlinear_pool.py``: QLinearGlobalAveragePool / QLinearAveragePool.
* ``contrib_qmatmul.py``: QGemm, MatMulIntegerToFloat, DynamicQuantizeMatMul (exact integer
  products, then onnxruntime's float32 output processing).
* ``block_quant.py``: MatMulNBits, GatherBlockQuantized.
* here: the domain's QuantizeLinear / DequantizeLinear.
"""

from __future__ import annotations

from ..ir.dtypes import TP
from .qlinear_arith import DOMAIN
from .quant import _dequantize, _quantize
from .registry import op
from .shapes import same_as_first


# ---- QuantizeLinear / DequantizeLinear ----------------------------------------------------------
@op("QuantizeLinear", 1, DOMAIN, infer=same_as_first)
def _ms_quantize_linear(x, y_scale, y_zero_point=None, *, axis=1, _out_types=None, out=None):
    # onnxruntime divides a float16 input by its scale in float32 (ParQuantizeLinearStd)
    return _quantize(x, y_scale, y_zero_point, axis=axis, precision=TP.FLOAT, _out_types=_out_types, out=out)


@op("DequantizeLinear", 1, DOMAIN, infer=same_as_first)
def _ms_dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1, _out_types=None, out=None):
    return _dequantize(x, x_scale, x_zero_point, axis=axis, _out_types=_out_types, out=out)
