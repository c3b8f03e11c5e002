"""``dynashape generate MODEL_DIR --prompt ...``: the text streamed as it is generated, tokens/s after."""

from __future__ import annotations

import sys
import time

from .generator import Generator, GeneratorParams, Model
from .tokenizer import Tokenizer


def main(args) -> int:
    model = Model(args.model_dir, device=args.device)
    tok = Tokenizer(model)
    params = GeneratorParams(model)
    search = {"max_length": args.max_length, "min_length": args.min_length, "top_k": args.top_k,
              "top_p": args.top_p, "temperature": args.temperature, "repetition_penalty": args.repetition_penalty,
              "random_seed": args.seed}
    params.set_search_options(**{k: v for k, v in search.items() if v is not None},
                              **({"do_sample": True} if args.do_sample else {}))
    gen = Generator(model, params)
    stream = tok.create_stream()
    t0 = time.perf_counter()
    gen.append_tokens(tok.encode(args.prompt))
    first = None
    n = 0
    while not gen.is_done():
        gen.generate_next_token()
        token = int(gen.get_next_tokens()[0])
        n += 1
        if first is None:
            first = time.perf_counter() - t0
        sys.stdout.write(stream.decode(token))
        sys.stdout.flush()
    total = time.perf_counter() - t0
    sys.stdout.write("\n")
    rate = (n - 1) / (total - first) if n > 1 and total > first else float("nan")
    print(f"{n} tokens in {total:.2f} s: first token {first * 1e3 if first else 0:.0f} ms (prompt of "
          f"{len(gen.get_sequence(0)) - n} tokens), then {rate:.1f} tokens/s", file=sys.stderr)
    return 0
