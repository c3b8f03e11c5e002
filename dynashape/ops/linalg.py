"""Matrix products: MatMul, Gemm, Einsum, MatMulInteger.

MatMul and Gemm write straight into the runtime's buffer (torch.matmul / addmm / mm with out=),
so a transformer's projections cost no copy. Integer MatMul / Gemm fall back to an exact
broadcast-multiply-sum where the device has no integer GEMM (CUDA). MatMulInteger runs exact
float GEMMs (integer_gemm.py), shared with the quantized ops (quant.py, fused_quant.py,
contrib_rnn.py).
"""

from __future__ import annotations

import torch

from ..errors import ShapeError
from ..shape import broadcast_dims
from . import small_work, split_tf32, tuned_gemm
from .integer_gemm import qmatmul
from .registry import op

# the saturation switch, where users set it (docs/usage.md, docs/models.md)
from .u8s8 import onnxruntime_saturates, set_u8s8_saturation, u8s8_saturation  # noqa: F401


def _known_differ(a, b) -> bool:
    """True when two dims are provably different (both ints); Dimensions are left to run time."""
    return isinstance(a, int) and isinstance(b, int) and a != b


# MatMul -------------------------------------------------------------------------------------
def _matmul_shape(a: tuple, b: tuple, what: str = "MatMul") -> tuple:
    if len(a) == 0 or len(b) == 0:
        raise ShapeError(f"{what}: inputs must have rank >= 1, got shapes {a} and {b}")
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    if _known_differ(a2[-1], b2[-2]):
        raise ShapeError(f"{what}: inner dimensions differ: A has shape {tuple(a)} (K={a2[-1]}), "
                         f"B has shape {tuple(b)} (K={b2[-2]})")
    try:
        batch = broadcast_dims(a2[:-2], b2[:-2])
    except ShapeError as e:
        raise ShapeError(f"{what}: batch dims of {tuple(a)} and {tuple(b)} do not broadcast: {e}") from e
    out = tuple(batch)
    if len(a) != 1:
        out += (a2[-2],)
    if len(b) != 1:
        out += (b2[-1],)
    return out


def _matmul_infer(shapes, values):
    return [_matmul_shape(shapes[0], shapes[1])]


def _int_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact integer matmul without a GEMM kernel: broadcast multiply then sum over K."""
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    r = (a2.unsqueeze(-1) * b2.unsqueeze(-3)).sum(-2, dtype=a.dtype)
    if a.dim() == 1:
        r = r.squeeze(-2)
    if b.dim() == 1:
        r = r.squeeze(-1)
    return r


def _needs_int_fallback(t: torch.Tensor) -> bool:
    return t.device.type != "cpu" and not t.dtype.is_floating_point


@op("MatMul", (1, 9, 13), infer=_matmul_infer)
@small_work.when_small(small_work.matmul_work)
def _matmul(a, b, *, out=None):
    if _needs_int_fallback(a):
        r = _int_matmul(a, b)
        return r if out is None else out.copy_(r)
    if b.dim() == 2 and a.dim() >= 2 and split_tf32.eligible(a, b) and split_tf32.worth(
            a.numel() // b.shape[0], b.shape[1], b.shape[0]):
        a2 = a.reshape(-1, b.shape[0])
        return tuned_gemm.rows_into(out, a.shape[:-1], b.shape[1],
                                    lambda o2: split_tf32.product(a2, b, False, None, o2))
    if out is None:
        return torch.matmul(a, b)
    # torch.matmul resizes an out= of a 1-D operand's result (the unsqueezed shape) instead of
    # writing into it: hand it views of the unsqueezed shape
    if a.dim() == 1 and b.dim() == 1:
        return torch.dot(a, b, out=out)
    if a.dim() == 1:
        torch.matmul(a.unsqueeze(0), b, out=out.unsqueeze(-2))
        return out
    if b.dim() == 1:
        torch.matmul(a, b.unsqueeze(-1), out=out.unsqueeze(-1))
        return out
    return torch.matmul(a, b, out=out)


# Gemm ---------------------------------------------------------------------------------------
def _gemm_infer(shapes, values, *, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0):
    a, b, c = shapes[0], shapes[1], shapes[2] if len(shapes) > 2 else None
    if len(a) != 2 or len(b) != 2:
        raise ShapeError(f"Gemm: A and B must be 2-D, got shapes {a} and {b}")
    m, ka = (a[1], a[0]) if transA else (a[0], a[1])
    kb, n = (b[1], b[0]) if transB else (b[0], b[1])
    if _known_differ(ka, kb):
        raise ShapeError(f"Gemm: inner dimensions differ: A {a} (transA={transA}) gives K={ka}, "
                         f"B {b} (transB={transB}) gives K={kb}")
    if c is not None:
        if len(c) > 2:
            raise ShapeError(f"Gemm: C must have rank <= 2, got shape {c}")
        # C broadcasts one way to (M, N): each of its dims is 1 or equal
        for cd, od in zip(reversed(c), (n, m)):
            if isinstance(cd, int) and cd != 1 and _known_differ(cd, od):
                raise ShapeError(f"Gemm: C of shape {c} does not broadcast to ({m}, {n})")
    return [(m, n)]


def _gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0, out=None):
    if transA:
        a = a.t()
    if (alpha == 1.0 and (c is None or beta == 1.0) and split_tf32.eligible(a, b)
            and split_tf32.worth(a.shape[0], b.shape[0] if transB else b.shape[1], a.shape[1])
            and not tuned_gemm.serves(a, b)):  # (a static impl's build times the split among its forms)
        return split_tf32.product(a, b, bool(transB), c, out)
    if transB:
        b = b.t()
    if c is not None and alpha == 1.0 and beta == 1.0 and tuned_gemm.serves(a, b) and c.dtype == a.dtype:
        # a static impl's build: the form of the product timed fastest for its shape
        m, n = a.shape[0], b.shape[1]
        w, out_in = (b.t(), True) if transB else (b, False)
        if c.dim() == 1 and c.shape[0] == n:
            return tuned_gemm.product(a, w, out_in, c, None, out)
        if c.dim() == 2 and tuple(c.shape) == (m, n):
            return tuned_gemm.product(a, w, out_in, None, c, out)
    if _needs_int_fallback(a):
        r = _int_matmul(a, b)
        if alpha != 1.0:
            r = r * int(alpha)
        if c is not None and beta != 0.0:
            r = r + c * int(beta)
        return r if out is None else out.copy_(r)
    if c is not None and beta != 0.0:
        # addmm broadcasts C to (M, N) itself and writes the product into out in one pass
        return torch.addmm(c, a, b, beta=beta, alpha=alpha, out=out)
    r = torch.mm(a, b, out=out)
    return r.mul_(alpha) if alpha != 1.0 else r


op("Gemm", (1, 6, 7, 9, 11, 13), infer=_gemm_infer)(small_work.when_small(small_work.gemm_work)(_gemm))


# Einsum -------------------------------------------------------------------------------------
def _parse_einsum(equation: str, n_inputs: int):
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != n_inputs:
        raise ShapeError(f"Einsum: equation {equation!r} has {len(terms)} operands, got {n_inputs} inputs")
    return terms, (rhs if arrow else None)


def _einsum_infer(shapes, values, *, equation):
    terms, rhs = _parse_einsum(equation, len(shapes))
    sizes: dict = {}
    ell: tuple = ()
    for term, shape in zip(terms, shapes):
        letters = term.replace("...", ".")
        n_ell = len(shape) - (len(letters) - letters.count("."))
        if "." not in letters and n_ell != 0:
            raise ShapeError(f"Einsum: term {term!r} does not match input shape {shape}")
        pos = 0
        for ch in letters:
            if ch == ".":
                ell = tuple(broadcast_dims(ell, tuple(shape[pos:pos + n_ell])))
                pos += n_ell
                continue
            d = shape[pos]
            pos += 1
            prev = sizes.get(ch)
            if prev is None or (isinstance(prev, int) and prev == 1):
                sizes[ch] = d
            elif isinstance(d, int) and d != 1 and _known_differ(prev, d):
                raise ShapeError(f"Einsum: label {ch!r} has sizes {prev} and {d} in {equation!r} for {shapes}")
    if rhs is None:  # implicit output: the ellipsis dims, then labels seen once, in alphabetical order
        counts: dict[str, int] = {}
        for term in terms:
            for ch in term.replace("...", ""):
                counts[ch] = counts.get(ch, 0) + 1
        return [tuple(ell) + tuple(sizes[ch] for ch in sorted(c for c, k in counts.items() if k == 1))]
    out: tuple = ()
    for ch in rhs.replace("...", "."):
        out += tuple(ell) if ch == "." else (sizes[ch],)
    return [out]


@op("Einsum", 12, infer=_einsum_infer, writes_out=False)
def _einsum(*xs, equation, out=None):
    eq = equation.replace(" ", "")
    if _needs_int_fallback(xs[0]):
        # CUDA has no integer bmm; float64 is exact for the integer sizes models use
        return torch.einsum(eq, *[x.double() for x in xs]).round().to(xs[0].dtype)
    return torch.einsum(eq, *xs)


# MatMulInteger ------------------------------------------------------------------------------
def _mmi_infer(shapes, values):
    return [_matmul_shape(shapes[0], shapes[1], "MatMulInteger")]


@op("MatMulInteger", 10, infer=_mmi_infer)
def _matmul_integer(a, b, a_zero_point=None, b_zero_point=None, *, out=None):
    r = qmatmul(a, b, a_zero_point, b_zero_point)
    if out is not None:
        return out.copy_(r)  # int32, or float32 / float64 holding integers: the conversion is exact
    return r.to(torch.int32)


# Det ----------------------------------------------------------------------------------------
def _det_infer(shapes, values):
    x = shapes[0]
    if len(x) < 2 or _known_differ(x[-1], x[-2]):
        raise ShapeError(f"Det: input must be [*, M, M], got shape {tuple(x)}")
    return [tuple(x[:-2])]


@op("Det", (11, 22), infer=_det_infer)
def _det(x, *, out=None):
    if x.dtype in (torch.float16, torch.bfloat16):
        # LU has no half kernels: factor in float32, round the determinant once
        r = torch.linalg.det(x.float()).to(x.dtype)
        return r if out is None else out.copy_(r)
    return torch.linalg.det(x) if out is None else torch.linalg.det(x, out=out)
