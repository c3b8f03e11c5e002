"""onnxruntime-genai's Tokenizer and TokenizerStream over the folder's tokenizer.json (the
``tokenizers`` package, which transformers installs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import InvalidModelError


class Tokenizer:
    def __init__(self, model) -> None:
        folder = Path(getattr(model, "folder", None) or model)
        path = folder / "tokenizer.json"
        if not path.exists():
            raise InvalidModelError(f"tokenizer: no tokenizer.json in {str(folder)!r}")
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError as e:  # transformers brings it; a bare install may not have it
            raise InvalidModelError("tokenizer: the 'tokenizers' package is not installed "
                                    "(pip install tokenizers)") from e
        self._tok = HFTokenizer.from_file(str(path))

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text).ids, dtype=np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(e.ids, dtype=np.int32) for e in self._tok.encode_batch(texts)]

    def decode(self, tokens) -> str:
        return self._tok.decode([int(t) for t in np.asarray(tokens).reshape(-1)])

    def create_stream(self) -> TokenizerStream:
        return TokenizerStream(self)


class TokenizerStream:
    """Text a token at a time: each ``decode(token)`` returns what the new token adds to the text
    (a token that only starts a multi-byte character adds nothing until it completes)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer, self._ids, self._text = tokenizer, [], ""

    def decode(self, token) -> str:
        self._ids.append(int(token))
        text = self._tokenizer.decode(self._ids)
        if text.endswith("\ufffd"):  # an incomplete character: wait for the rest
            return ""
        new, self._text = text[len(self._text):], text
        return new
