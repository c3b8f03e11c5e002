"""Write docs/reliability.md: every case of the bad-input table (tests/reliability/cases.py) run
through both executors, with what each raised, the start of its message, and whether the same
session gave onnxruntime's answer afterwards. Nothing is typed by hand.

    python scripts/gen_reliability_doc.py [--device cpu]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import warnings
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DOC = os.path.join(ROOT, "docs", "reliability.md")

HEAD = """# Reliability: bad input

Every case below is a model, session options and feeds from `tests/reliability/cases.py`, run
through both executors by `scripts/gen_reliability_doc.py` ({date}, {device}); `tests/reliability`
asserts the same on every CI run. "expected" is the dynashape error type the case must raise (or
`runs`: odd but valid input that must give onnxruntime's answer); "after" is the same session
running a good feed afterwards, compared with onnxruntime ("-": the error came at load, there is
no session). Cases marked "absurd" also check that the run allocated less than 64 MiB: the size
is refused before anything is allocated.

What protects what:
- feeds: names, dtypes, ranks and declared ranges checked before anything runs (`runtime/feeds.py`);
  big-endian, read-only, strided and Fortran-order arrays are read by value; a feed overrides an
  input's initializer (a session of its own is made for that set of overrides);
- options: checked when the session is made (`OptionsError`);
- load: attributes against the ONNX schema, opsets, initializers' sizes, cycles, undefined
  values (`frontend/validate.py`);
- indices from data: checked per dimension in the kernels (`IndexOutOfRangeError`); on CUDA,
  where torch's gather kernels would assert on the device (an untyped error that leaves the
  process's CUDA context unusable), indices fed from the host are checked before the copy
  (`runtime/index_feeds.py`); indices fed as CUDA tensors or computed inside the model are not;
- sizes from data: the shape function runs on the values before the kernel, and a negative dim
  (`ShapeError`) or a buffer beyond `max_buffer_bytes` or the machine (`MemoryLimitError`) is
  refused before any allocation (`ops/limits.py`, `memory/engine.py`); `max_loop_iterations`
  stops a Loop whose trip count comes from data (`LimitExceededError`);
- feeds the session copies (read-only arrays such as a `np.broadcast_to` view, another byte
  order, strings): their dense size is checked against the same limit before the copy
  (`MemoryLimitError` naming the input; `runtime/feeds.py` `CopyLimit`);
- anything else a kernel raises leaves `run` as an `ExecutionError` naming the node.

Totals: {total} cases x 2 executors; {summary}.

| case | group | expected | compiled | interpreter | after | message (compiled) |
|---|---|---|---|---|---|---|
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    from tests.reliability.cases import all_cases
    from tests.reliability.table import run_case
    cases = all_cases()
    rows, tally = [], Counter()
    for case in cases:
        outs = {ex: run_case(case, ex, args.device) for ex in ("compiled", "interpreter")}
        for o in outs.values():
            tally["pass" if o.passed else "FAIL"] += 1
        want = case.error if isinstance(case.error, tuple) else (case.error,)
        expected = "runs" if case.error is None else " or ".join(w.__name__ for w in want)
        if case.absurd:
            expected += " (absurd)"

        def cell(o):
            return f"{o.got}" + ("" if o.passed else f" **FAIL**: {o.why}")
        msg = outs["compiled"].message.replace("|", "\\|").replace("\n", " ")
        msg = (msg[:110] + "...") if len(msg) > 110 else msg
        rows.append(f"| {case.id} | {case.group} | {expected} | {cell(outs['compiled'])} | "
                    f"{cell(outs['interpreter'])} | {outs['compiled'].after} | {msg} |")
        print(case.id, {ex: o.passed for ex, o in outs.items()})
    summary = f"{tally['pass']} passed, {tally['FAIL']} failed"
    head = HEAD.format(date=datetime.date.today().isoformat(), device=args.device, total=len(cases), summary=summary)
    with open(DOC, "w") as f:
        f.write(head + "\n".join(rows) + "\n")
    print(f"wrote {DOC}: {summary}")


if __name__ == "__main__":
    main()
