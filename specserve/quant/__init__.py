"""Weight-only quantized linear layers (int8, int4, GGUF Q4_1, fp8) and the module swap."""

from __future__ import annotations

from specserve.quant.fp8 import Fp8Linear, quantize_fp8
from specserve.quant.gguf_q4 import GGUFQ4Linear, concat_raw, dequantize_q4_1, unpack_q4_1
from specserve.quant.int4 import Int4Linear, quantize_int4
from specserve.quant.int8 import Int8Linear, quantize_int8
from specserve.quant.swap import linear_weight_nbytes, quantize_model, replace_with_gguf

__all__ = [
    "Fp8Linear",
    "GGUFQ4Linear",
    "Int4Linear",
    "Int8Linear",
    "concat_raw",
    "dequantize_q4_1",
    "linear_weight_nbytes",
    "quantize_fp8",
    "quantize_int4",
    "quantize_int8",
    "quantize_model",
    "replace_with_gguf",
    "unpack_q4_1",
]
