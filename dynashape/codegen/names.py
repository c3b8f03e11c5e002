"""Names of the generated code's locals: valid identifiers, never taken twice."""

from __future__ import annotations

import keyword
import re


def _ident(name: str, prefix: str) -> str:
    s = re.sub(r"\W", "_", name)
    if not s or s[0].isdigit() or keyword.iskeyword(s):
        s = f"_{s}"
    return f"{prefix}{s}"


class _Names:
    def __init__(self) -> None:
        self.used: set[str] = {"st", "sig", "torch", "DEV", "cur", "off", "A", "first"}

    def new(self, base: str, prefix: str = "") -> str:
        name = _ident(base, prefix)[:48]
        cand, k = name, 1
        while cand in self.used:
            cand, k = f"{name}_{k}", k + 1
        self.used.add(cand)
        return cand
