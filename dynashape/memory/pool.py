"""MemoryPool: one per network; node outputs share raw byte records when they never conflict.

A record is a 1-D uint8 buffer from the engine, so one record serves requests of any dtype.
Each record has a set of users (value names, the roots of ``MemoryDeps``); every user sees the
record from offset 0, which is sound because users of one record pairwise have no memory
dependency. A request takes the smallest record that fits and whose users all have no conflict
with the requester; for dynamic requests the record must also be less than twice the request,
so that a small output does not pin a huge record (and a huge one stays available for a huge
request). Otherwise the engine allocates a new record of exactly the requested bytes.

A requester holds at most one record at a time. Asking again (its output grew or shrank)
leaves the old record: freed at once when nobody else uses it. When the old record has other
users and no record fits, the old record *grows* for all of them instead of a second record
being made: its users pairwise never conflict, so while the requester is being produced none of
them has live data in it (each is either finished or not yet produced). The pool then tells the
owner of every other user (``on_move``) where its memory is now. Without this, every growing
step of a decode loop would hold each shared record twice: the old one, pinned by users that
grow later in the run, next to the new one. (Growing any non-conflicting smaller record, not
only the requester's, packed worse on the CNNs tried: Inception v1 23.7 against 23.1 MB.)
Contents are not kept across a ``get``.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

import torch

from ..compile.memory_deps import MemoryDeps


@dataclass(eq=False)
class _Record:
    buf: torch.Tensor  # uint8, exactly nbytes long
    nbytes: int
    alloc_type: str
    seq: int  # creation order: ties between records of one size go to the oldest
    users: set[str] = field(default_factory=set)

    @property
    def key(self) -> tuple[int, int]:
        return self.nbytes, self.seq


class MemoryPool:
    def __init__(self, engine, deps: MemoryDeps, on_move=None) -> None:
        self.engine = engine
        self.deps = deps
        # on_move(user, record_buf): a record another user shares was reallocated
        self.on_move = on_move
        # per allocation type: records sorted by (nbytes, seq), with their keys beside for bisect
        self._records: dict[str, list[_Record]] = {}
        self._keys: dict[str, list[tuple[int, int]]] = {}
        self._held: dict[str, _Record] = {}  # requester -> its record
        self._seq = itertools.count()
        self._reuses = 0
        self._new_records = 0
        self._freed_records = 0
        self._grown_records = 0

    # ---- requests ---------------------------------------------------------------------------
    def get(self, requester: str, numel: int, dtype: torch.dtype, dynamic: bool = True,
            alloc_type: str = "device") -> torch.Tensor:
        """A 1-D tensor of ``numel`` elements of ``dtype``, on memory only non-conflicting users share."""
        if numel < 0:
            raise ValueError(f"{requester!r}: negative element count {numel}")
        if requester not in self.deps.owned:
            raise KeyError(f"{requester!r} owns no memory in this graph; the pool serves root values only")
        nbytes = numel * dtype.itemsize
        old = self._held.pop(requester, None)
        if old is not None:
            old.users.discard(requester)
            if old.alloc_type == alloc_type and old.nbytes >= nbytes and not _too_big(old, nbytes, dynamic):
                old.users.add(requester)  # its own record still fits: keep it
                self._held[requester] = old
                return old.buf[:nbytes].view(dtype)
            if not old.users:  # the old buffer goes back before a new one is made
                self._free(old)
                old = None
        rec = self._find(requester, nbytes, dynamic, alloc_type)
        if rec is not None:
            self._reuses += 1
        elif old is not None and old.alloc_type == alloc_type and old.nbytes < nbytes:
            rec = self._grow(old, nbytes)
        else:
            rec = self._new_record(nbytes, alloc_type)
            self._new_records += 1
        rec.users.add(requester)
        self._held[requester] = rec
        # offset 0: no slicing alignment to care about, and view(dtype) needs none
        return rec.buf[:nbytes].view(dtype)

    def release(self, requester: str, buf: torch.Tensor, free_if_unused: bool = False) -> None:
        """``requester`` stops using its record; the record stays in the pool for others, unless
        ``free_if_unused`` and nobody else uses it: then it goes back to the engine now."""
        rec = self._held.get(requester)
        if rec is None:
            raise KeyError(f"{requester!r} holds no record of this pool")
        if buf.numel() and not _inside(buf, rec):
            raise ValueError(f"{requester!r} releases a buffer that is not its record's memory")
        self._drop(requester)
        if free_if_unused and not rec.users:
            self._free(rec)

    def free_unused(self) -> int:
        """Give every record without users back to the engine; returns the bytes freed."""
        unused = [r for recs in self._records.values() for r in recs if not r.users]
        for r in unused:
            self._free(r)
        return sum(r.nbytes for r in unused)

    def _free(self, rec: _Record) -> None:
        self._unlist(rec)
        self.engine.release(rec.buf)
        self._freed_records += 1

    def _unlist(self, rec: _Record) -> None:
        recs, keys = self._records[rec.alloc_type], self._keys[rec.alloc_type]
        k = bisect.bisect_left(keys, rec.key)
        del recs[k], keys[k]

    def _grow(self, rec: _Record, nbytes: int) -> _Record:
        """Reallocate ``rec`` at ``nbytes`` for all its users (see the module docstring)."""
        self._unlist(rec)
        self.engine.release(rec.buf)
        rec.buf = self.engine.allocate(nbytes, torch.uint8, alloc_type=rec.alloc_type)
        rec.nbytes = nbytes
        self._list(rec)
        self._grown_records += 1
        if self.on_move is not None:
            for user in rec.users:
                self.on_move(user, rec.buf)
        return rec

    def stats(self) -> dict:
        recs = [r for rs in self._records.values() for r in rs]
        return {
            "records": len(recs),
            "record_bytes": sum(r.nbytes for r in recs),
            "used_records": sum(1 for r in recs if r.users),
            "reuses": self._reuses,
            "new_records": self._new_records,
            "freed_records": self._freed_records,
            "grown_records": self._grown_records,
        }

    def holder_record_bytes(self, requester: str) -> int | None:
        """Size of the record ``requester`` holds (None when it holds none)."""
        rec = self._held.get(requester)
        return None if rec is None else rec.nbytes

    # ---- internals ----------------------------------------------------------------------------
    def _drop(self, requester: str) -> None:
        rec = self._held.pop(requester, None)
        if rec is not None:
            rec.users.discard(requester)

    def _find(self, requester: str, nbytes: int, dynamic: bool, alloc_type: str) -> _Record | None:
        recs, keys = self._records.get(alloc_type, []), self._keys.get(alloc_type, [])
        conflicts = self.deps.conflicts
        for k in range(bisect.bisect_left(keys, (nbytes, -1)), len(recs)):
            rec = recs[k]
            if _too_big(rec, nbytes, dynamic):  # sizes only grow from here
                return None
            if all(not conflicts(requester, u) for u in rec.users):
                return rec
        return None

    def _new_record(self, nbytes: int, alloc_type: str) -> _Record:
        buf = self.engine.allocate(nbytes, torch.uint8, alloc_type=alloc_type)
        rec = _Record(buf, nbytes, alloc_type, next(self._seq))
        self._list(rec)
        return rec

    def _list(self, rec: _Record) -> None:
        keys = self._keys.setdefault(rec.alloc_type, [])
        k = bisect.bisect_right(keys, rec.key)
        keys.insert(k, rec.key)
        self._records.setdefault(rec.alloc_type, []).insert(k, rec)


def _too_big(rec: _Record, nbytes: int, dynamic: bool) -> bool:
    """The rule for dynamic requests: the request must be more than half the record (record <
    2 * request), so that a small output does not pin a large record."""
    return dynamic and rec.nbytes >= 2 * nbytes and rec.nbytes > 0


def _inside(buf: torch.Tensor, rec: _Record) -> bool:
    start = rec.buf.data_ptr()
    return start <= buf.data_ptr() < start + max(rec.nbytes, 1)
