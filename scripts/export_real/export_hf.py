"""Tiny random-weight transformers models exported by optimum-onnx's own exporter (``main_export``),
for tests/zoo/exported/: a Whisper encoder and merged decoder with past, BART and T5 (encoder and
merged decoder with past: the If on use_cache_branch that optimum's merge writes), and a
sentence-transformers model (BERT, mean pooling, Normalize) through optimum's sentence_transformers
library path.

    python scripts/export_real/export_hf.py whisper|bart|t5|st OUT_DIR
(in an environment from scripts/export_real/requirements.txt). The model files land in
OUT_DIR/<kind>/ as optimum names them; tests/zoo/exported/ holds the encoder and the merged decoder.
"""
import os
import sys

import torch
import tv_shim  # noqa: F401  (transformers imports torchvision)
from optimum.exporters.onnx import main_export
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    BertConfig,
    BertModel,
    T5Config,
    T5ForConditionalGeneration,
    WhisperConfig,
    WhisperForConditionalGeneration,
)

SMALL = dict(encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
             encoder_ffn_dim=64, decoder_ffn_dim=64, d_model=32)


def seq2seq(kind: str):
    if kind == "whisper":  # 16 mel bins, the 3,000 frames optimum's dummy inputs have
        cfg = WhisperConfig(vocab_size=384, num_mel_bins=16, max_source_positions=1500, max_target_positions=64,
                            pad_token_id=1, bos_token_id=2, eos_token_id=3, decoder_start_token_id=2,
                            suppress_tokens=[], begin_suppress_tokens=[], **SMALL)
        return WhisperForConditionalGeneration(cfg), "automatic-speech-recognition-with-past"
    if kind == "bart":
        return BartForConditionalGeneration(BartConfig(vocab_size=384, max_position_embeddings=128, **SMALL)), \
            "text2text-generation-with-past"
    cfg = T5Config(vocab_size=384, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2,
                   decoder_start_token_id=0)
    return T5ForConditionalGeneration(cfg), "text2text-generation-with-past"


def sentence_transformer(src: str) -> None:
    """A sentence-transformers folder (its tokenizer made with ``tokenizers``: no download)."""
    from sentence_transformers import SentenceTransformer, models
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers import models as tm
    from transformers import BertTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words += [chr(c) for c in range(97, 123)] + [f"w{i}" for i in range(200)]
    tok = Tokenizer(tm.WordPiece({t: i for i, t in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    fast = BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                             sep_token="[SEP]", mask_token="[MASK]")
    bert = os.path.join(src, "bert")
    BertModel(BertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=128)).save_pretrained(bert)
    fast.save_pretrained(bert)
    word = models.Transformer(bert, max_seq_length=128)
    pool = models.Pooling(word.get_word_embedding_dimension(), pooling_mode="mean")
    SentenceTransformer(modules=[word, pool, models.Normalize()]).save(src)


def main(kind: str, out_dir: str) -> None:
    torch.manual_seed(0)
    src, out = os.path.join(out_dir, f"src-{kind}"), os.path.join(out_dir, kind)
    if kind == "st":
        sentence_transformer(src)
        main_export(src, out, task="feature-extraction", library_name="sentence_transformers", opset=17,
                    device="cpu", do_validation=False)
    else:
        model, task = seq2seq(kind)
        model.eval().save_pretrained(src)
        main_export(src, out, task=task, opset=17, device="cpu", do_validation=False)
    print("exported", out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
