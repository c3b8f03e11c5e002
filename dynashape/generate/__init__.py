"""Text generation over a decoder's ONNX model, in the shape of onnxruntime-genai's Python API:
``Model``, ``GeneratorParams`` (``set_search_options``), ``Generator`` (``append_tokens``,
``generate_next_token``, ``is_done``, ``get_next_tokens``, ``get_sequence``), ``Tokenizer`` and its
stream. A model folder written by onnxruntime-genai's builder (genai_config.json) or by optimum
(config.json, model.onnx) runs as it is; the decoder's inputs and outputs are found by name."""

from .generator import Generator, GeneratorParams, Model
from .tokenizer import Tokenizer, TokenizerStream

__all__ = ["Model", "GeneratorParams", "Generator", "Tokenizer", "TokenizerStream"]
