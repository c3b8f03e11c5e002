"""String ops: StringSplit, StringNormalizer, StringConcat, RegexFullMatch, and TfIdfVectorizer.

Strings have no torch dtype: they live on the host as numpy object arrays of ``str``, so these ops
are registered ``host=True``. A string output is returned as an object array (the runtime adopts
it as is); a numeric output is a CPU torch tensor, which the runtime moves where its consumers run.
Ops whose output shape depends on the strings (split counts, stopword removal) have no shape
function.

RegexFullMatch: the spec names RE2 syntax; we use Python's ``re``. For the common subset they
agree. Differences: RE2's POSIX classes (``[[:alpha:]]``) are translated to their ASCII sets
(Python reads them as plain characters); RE2-only escapes (``\\pN``, ``\\p{Greek}``, ``\\Q...\\E``,
``\\C``) are refused by ``re`` and fail with an error; Python-only constructs (backreferences,
lookaround, possessive quantifiers) are accepted although RE2 rejects them.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import torch

from ..errors import ShapeError
from .registry import op
from .shapes import broadcast, same_as_first


def _text(x) -> np.ndarray:
    """A string tensor as an object array of ``str`` (bytes elements are read as UTF-8)."""
    a = np.asarray(x, dtype=object)
    flat = a.reshape(-1)
    if any(isinstance(s, bytes) for s in flat):
        a = np.array([s.decode("utf-8") if isinstance(s, bytes) else s for s in flat], dtype=object).reshape(a.shape)
    return a


def _objects(items: list, shape: tuple) -> np.ndarray:
    """A list of str as an object array of ``shape`` (np.array would nest sequences)."""
    a = np.empty(len(items), dtype=object)
    a[:] = items
    return a.reshape(shape)


# ---- StringConcat ------------------------------------------------------------------------------
@op("StringConcat", 20, infer=broadcast, host=True)
def _string_concat(x, y, *, out=None):
    a, b = _text(x), _text(y)
    r = a + b  # object arrays broadcast and add element by element: str + str
    return np.asarray(r, dtype=object)  # a 0-d result comes back as a bare str


# ---- StringSplit -------------------------------------------------------------------------------
@op("StringSplit", 20, infer=None, host=True)
def _string_split(x, *, delimiter=None, maxsplit=None, out=None):
    a = _text(x)
    limit = -1 if maxsplit is None else maxsplit
    if delimiter:
        # as onnxruntime: an empty string holds no substring (Python's split would give [""])
        parts = [s.split(delimiter, limit) if s else [] for s in a.reshape(-1)]
    else:
        # runs of whitespace split, and the ends are trimmed even where maxsplit leaves a tail
        parts = [s.strip().split(None, limit) for s in a.reshape(-1)]
    counts = [len(p) for p in parts]
    width = max(counts, default=0)
    y = np.full((len(parts), width), "", dtype=object)  # shorter rows are padded with ""
    for row, p in zip(y, parts):
        row[:len(p)] = p
    z = torch.tensor(counts, dtype=torch.int64).reshape(a.shape)
    return y.reshape(*a.shape, width), z


# ---- StringNormalizer ---------------------------------------------------------------------------
_CASE = {"NONE": lambda s: s, "LOWER": str.lower, "UPPER": str.upper}


@op("StringNormalizer", 10, infer=None, host=True,
    notes="locale is accepted but case changes use Unicode's default (locale-free) mapping")
def _string_normalizer(x, *, case_change_action="NONE", is_case_sensitive=0, locale="", stopwords=None,
                       out=None):
    a = _text(x)
    if not (a.ndim == 1 or (a.ndim == 2 and a.shape[0] == 1)):
        raise ShapeError(f"StringNormalizer takes a [C] or [1, C] tensor, got shape {list(a.shape)}")
    if case_change_action not in _CASE:
        raise ValueError(f"case_change_action must be NONE, LOWER or UPPER, got {case_change_action!r}")
    words = list(a.reshape(-1))
    if stopwords:
        if is_case_sensitive:
            stop = set(stopwords)
            words = [w for w in words if w not in stop]
        else:
            stop = {s.lower() for s in stopwords}
            words = [w for w in words if w.lower() not in stop]
    change = _CASE[case_change_action]
    words = [change(w) for w in words] or [""]  # all dropped: one empty string, per the spec
    return _objects(words, (len(words),) if a.ndim == 1 else (1, len(words)))


# ---- RegexFullMatch -----------------------------------------------------------------------------
# RE2's POSIX bracket classes, which Python's re does not know, as the ASCII sets they stand for
_POSIX = {
    "alnum": "0-9A-Za-z", "alpha": "A-Za-z", "ascii": "\\x00-\\x7f", "blank": "\\t ", "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9", "graph": "!-~", "lower": "a-z", "print": " -~", "punct": "!-/:-@\\[-`{-~",
    "space": "\\t\\n\\v\\f\\r ", "upper": "A-Z", "word": "0-9A-Za-z_", "xdigit": "0-9A-Fa-f",
}
_POSIX_RE = re.compile(r"(?<!\\)\[:(\^?)([a-z]+):\]")


def _posix_class(m: re.Match) -> str:
    if m.group(1) or m.group(2) not in _POSIX:
        raise ValueError(f"RE2 class {m.group(0)!r} has no Python re equivalent here")
    return _POSIX[m.group(2)]


@functools.lru_cache(maxsize=64)
def _compile(pattern: str) -> re.Pattern:
    return re.compile(_POSIX_RE.sub(_posix_class, pattern))


@op("RegexFullMatch", 20, infer=same_as_first, host=True,
    notes="Python re instead of RE2: see dynashape/ops/strings.py for the differences")
def _regex_full_match(x, *, pattern="", out=None):
    rx = _compile(pattern)
    a = _text(x)
    hits = np.array([rx.fullmatch(s) is not None for s in a.reshape(-1)], dtype=bool).reshape(a.shape)
    r = torch.from_numpy(hits)
    return r if out is None else out.copy_(r)


# ---- TfIdfVectorizer ----------------------------------------------------------------------------
def _tfidf_shape(shapes, values, *, ngram_indexes, **_attrs):
    s = shapes[0]
    width = max(ngram_indexes) + 1 if ngram_indexes else 0
    if len(s) == 1:
        return [(width,)]
    if len(s) == 2:
        return [(s[0], width)]
    raise ShapeError(f"TfIdfVectorizer takes a [C] or [N, C] tensor, got rank {len(s)}")


def _ngram_pool(pool: list, ngram_counts: list[int]) -> dict[tuple, list[int]]:
    """The pool as {n-gram tuple: [pool n-gram numbers]}. ngram_counts[k] is where the
    (k+1)-grams start in the flat pool; n-grams are numbered across sizes in pool order."""
    grams: dict[tuple, list[int]] = {}
    g = 0
    for k, start in enumerate(ngram_counts):
        n = k + 1
        end = ngram_counts[k + 1] if k + 1 < len(ngram_counts) else len(pool)
        if (end - start) % n:
            raise ValueError(f"the {n}-gram section of the pool has {end - start} items, not a multiple of {n}")
        for i in range(start, end, n):
            grams.setdefault(tuple(pool[i:i + n]), []).append(g)
            g += 1
    return grams


def _count_row(row: list, grams: dict, n_grams: int, lo: int, hi: int, max_skip: int) -> np.ndarray:
    counts = np.zeros(n_grams, dtype=np.float32)
    c = len(row)
    for n in range(lo, hi + 1):
        # an n-gram takes every (skip+1)-th item; unigrams have no gaps and are counted once
        for skip in range(max_skip + 1 if n > 1 else 1):
            step = skip + 1
            span = (n - 1) * step
            for j in range(c - span):
                hit = grams.get(tuple(row[j:j + span + 1:step]))
                if hit is not None:
                    counts[hit] += 1
    return counts


@op("TfIdfVectorizer", 9, infer=_tfidf_shape, host=True)
def _tfidf(x, *, mode, min_gram_length, max_gram_length, max_skip_count, ngram_counts, ngram_indexes,
           pool_int64s=None, pool_strings=None, weights=None, out=None):
    if (pool_int64s is None) == (pool_strings is None):
        raise ValueError("exactly one of pool_int64s and pool_strings must be set")
    if mode not in ("TF", "IDF", "TFIDF"):
        raise ValueError(f"mode must be TF, IDF or TFIDF, got {mode!r}")
    is_text = isinstance(x, np.ndarray) and x.dtype == object
    if is_text != (pool_strings is not None):
        raise TypeError("a string input needs pool_strings and an integer input pool_int64s")
    rows = _text(x) if is_text else x.numpy()
    if rows.ndim not in (1, 2):
        raise ShapeError(f"TfIdfVectorizer takes a [C] or [N, C] tensor, got shape {list(rows.shape)}")
    grams = _ngram_pool(pool_strings if is_text else pool_int64s, ngram_counts)
    n_grams = sum(len(v) for v in grams.values())
    if len(ngram_indexes) != n_grams:
        raise ValueError(f"ngram_indexes has {len(ngram_indexes)} entries for {n_grams} pool n-grams")
    scale = np.ones(n_grams, dtype=np.float32) if not weights or mode == "TF" else np.asarray(weights, np.float32)
    col = np.asarray(ngram_indexes, dtype=np.int64)
    width = int(col.max()) + 1 if n_grams else 0
    r2 = rows if rows.ndim == 2 else rows.reshape(1, -1)
    y = np.zeros((r2.shape[0], width), dtype=np.float32)
    lo, hi = max(min_gram_length, 1), min(max_gram_length, len(ngram_counts))
    for i, row in enumerate(r2):
        counts = _count_row(row.tolist(), grams, n_grams, lo, hi, max_skip_count)
        if mode == "IDF":
            counts = np.minimum(counts, 1)  # presence, not frequency
        np.add.at(y[i], col, counts * scale)
    r = torch.from_numpy(y.reshape(width) if rows.ndim == 1 else y)
    return r if out is None else out.copy_(r)
