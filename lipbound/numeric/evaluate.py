"""Evaluate a symbolic :class:`~lipbound.symbolic.bound.Bound` on concrete weights, rigorously.

Every free symbol of the bound receives an interval that provably contains its value on
the given weights and domain (:func:`symbol_intervals`): sizes exactly, the domain's radius and
LayerNorm gain from the :class:`~lipbound.numeric.domains.TokenDomain`, norm symbols ``||M||_2``
through certified two-sided bounds (:mod:`lipbound.rigorous.linalg`).  The closed form is then
compiled by :func:`lipbound.rigorous.compiler.compile_interval` and evaluated in interval
arithmetic (:func:`evaluate_bound`); the upper end of the result is a certified upper bound on
the Lipschitz constant the bound states.  A bound is evaluated only on heads its theorem covers
(:func:`lipbound.numeric.dispatch.check_covers`).

Conventions of the symbols (:mod:`lipbound.symbolic.symbols`): ``A = W_Q W_K^T / sqrt(d_k)``;
``W`` is the tied projection (``W_Q = W_K``); ``W_O`` is the whole output projection of a
layer; ``c`` is the centre of the domain.  Matrices are read off the head as they are: for Kim
et al.'s L2 values the bound itself contains ``W W^T W_V``, so the head's raw ``W_V`` is used.
For a multi-head layer a per-head symbol takes the maximum over heads, as the multi-head
theorem states; this is sound because the bound is checked to be increasing in each such symbol.
"""

from __future__ import annotations

import functools
import math

import mpmath
import numpy as np
import sympy as sp

from ..errors import AssumptionError, NotCertifiedError
from ..rigorous.compiler import compile_interval
from ..rigorous.intervals import IV, Verdict, interval, lower, upper
from ..rigorous.linalg import Enclosure, product_norm_interval
from ..rigorous.value import CertifiedValue, not_certified
from ..symbolic import symbols as S
from ..symbolic.bound import Bound
from ..symbolic.monotone import is_nondecreasing
from .dispatch import check_covers, check_layer
from .domains import TokenDomain
from .model import Head, Layer, TransformerLayer
from .offsets import HeadRows, offsets_of, rotation_enclosure

__all__ = ["symbol_intervals", "evaluate_bound"]


# Norm symbols -------------------------------------------------------------------------------
_MATRICES = {m.name: m for m in (S.W_Q, S.W_K, S.W_V, S.W_O, S.W, S.b_Q, S.b_K, S.b_V, S.c, S.x, S.y)}
_SIZES = ("n", "m", "d", "d_k", "d_v", "H")
_PER_HEAD = (S.W_Q, S.W_K, S.W_V, S.W, S.b_Q, S.b_K, S.b_V)


@functools.lru_cache(maxsize=256)
def _norm_expression(name: str) -> tuple[sp.MatrixExpr, sp.Expr]:
    """``(M, s)`` such that the norm symbol called ``name`` stands for ``s ||M||_2``."""
    named = [(key, scalar) for key, (label, scalar) in S.NAMED_MATRICES.items() if label == name]
    if named:  # e.g. A = W_Q W_K^T / sqrt(d_k); the untied form also covers tied heads
        named.sort(key=lambda item: _uses(_matrix_of(item[0]), S.W))
        key, scalar = named[0]
        return _matrix_of(key), scalar
    return _matrix_of(name), sp.Integer(1)


def _matrix_of(name: str) -> sp.MatrixExpr:
    if name in S.NORM_OF:
        return S.NORM_OF[name]
    try:
        parsed = sp.parse_expr(name, local_dict=dict(_MATRICES), evaluate=True)
    except Exception:
        parsed = None
    if not isinstance(parsed, sp.MatrixExpr):
        raise AssumptionError(name, "a norm symbol of a matrix expression in W_Q, W_K, W_V, W_O, W, b_Q, b_K, "
                              "b_V, c", f"the unparsable name {name!r}", f"pass its value in values={{{name!r}: ...}}")
    return parsed


def _uses(matrix: sp.MatrixExpr, symbol: sp.MatrixSymbol) -> bool:
    return symbol in matrix.atoms(sp.MatrixSymbol)


class _Environment:
    """Exact float matrices for the symbols of one head (and the layer's W_O, the centre)."""

    def __init__(self, head: Head | None, layer, center: np.ndarray, sizes: dict):
        self.head, self.layer, self.center, self.sizes = head, layer, center, sizes

    def matrix(self, name: str) -> Enclosure:
        if name == "W_O":
            if self.layer is None:
                raise AssumptionError("W_O", "a layer with an output projection", "a single head",
                                      "pass layer=TransformerLayer(...) (or evaluate the single-head bound)")
            return Enclosure.exact(self.layer.W_O)
        if name == "c":
            return Enclosure.exact(self.center)
        head = self.head
        if name == "W":
            if not np.array_equal(head.W_Q, head.W_K):
                raise AssumptionError("W", "a head with tied weights W_Q = W_K", f"the untied head {head.name!r}",
                                      "this bound is for tied (L2) attention; evaluate it on a tied head")
            return Enclosure.exact(head.W_Q)
        if name in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V"):
            return Enclosure.exact(getattr(head, name))
        raise AssumptionError(name, "a weight, bias or the centre c", f"the matrix symbol {name}",
                              "norm symbols may not involve the tokens x, y")

    def enclose(self, expr: sp.MatrixExpr) -> Enclosure:
        """Evaluate a matrix expression with a rigorous elementwise error bound."""
        if isinstance(expr, sp.MatrixSymbol):
            return self.matrix(expr.name)
        if isinstance(expr, sp.Transpose):
            return self.enclose(expr.arg).T
        if isinstance(expr, sp.MatAdd):
            parts = [self.enclose(a) for a in expr.args]
            total = parts[0]
            for part in parts[1:]:
                total = total + part
            return total
        if isinstance(expr, sp.MatMul):
            coefficient = sp.Mul(*[a for a in expr.args if not getattr(a, "is_Matrix", False)])
            product = _chain([self.enclose(a) for a in expr.args if getattr(a, "is_Matrix", False)])
            if coefficient != 1:
                product = product.scale(_scalar_interval(coefficient, self.sizes))
            return product
        raise AssumptionError(str(expr), "a product, sum or transpose of weights", type(expr).__name__,
                              "write the matrix with *, + and .T")


    def norm_interval(self, expr: sp.MatrixExpr):
        """Interval enclosing ``||expr||_2``, computed once per head (and centre) and kept on the head."""
        if self.head is None or _uses(expr, S.W_O):
            return self._norm_interval(expr)
        key = (expr, self.center.tobytes() if _uses(expr, S.c) else None)
        cache = self.head.norm_cache
        if key not in cache:
            cache[key] = self._norm_interval(expr)
        return cache[key]

    def _norm_interval(self, expr: sp.MatrixExpr):
        """Interval enclosing ``||expr||_2`` (Euclidean for a vector).  A product of two factors
        goes through :func:`product_norm_interval`, which never forms a low-rank product."""
        if isinstance(expr, sp.MatMul):
            factors = [a for a in expr.args if getattr(a, "is_Matrix", False)]
            if len(factors) == 2:
                coefficient = sp.Mul(*[a for a in expr.args if not getattr(a, "is_Matrix", False)])
                norm = product_norm_interval(self.enclose(factors[0]), self.enclose(factors[1]))
                return norm if coefficient == 1 else norm * abs(_scalar_interval(coefficient, self.sizes))
        return self.enclose(expr).norm_interval()


def _chain(factors: list) -> Enclosure:
    """The product of the factors in the cheapest order (matrix-chain dynamic programme): the
    error bound holds for any order, and ``W (W^T W_V)`` costs far less than ``(W W^T) W_V``."""
    dims = [factors[0].shape[0]] + [f.shape[1] for f in factors]
    count = len(factors)
    cost = {(i, i): (0, None) for i in range(count)}
    for length in range(2, count + 1):
        for i in range(count - length + 1):
            j = i + length - 1
            cost[i, j] = min((cost[i, k][0] + cost[k + 1, j][0] + dims[i] * dims[k + 1] * dims[j + 1], k)
                             for k in range(i, j))

    def build(i, j):
        if i == j:
            return factors[i]
        split = cost[i, j][1]
        return build(i, split) @ build(split + 1, j)

    return build(0, count - 1)


def _scalar_interval(expr: sp.Expr, sizes: dict):
    expr = sp.sympify(expr).xreplace({s: sp.Integer(v) for s, v in sizes.items()})
    if expr.free_symbols:
        raise AssumptionError(str(expr), "a number once the sizes are known", f"free symbols {expr.free_symbols}",
                              "only sizes may appear in the scalar of a norm symbol")
    return _constant_interval(expr)


@functools.lru_cache(maxsize=256)
def _constant_interval(expr: sp.Expr):
    return compile_interval(expr, [])()


# Symbol values ----------------------------------------------------------------------------------
def _heads_of(head, layer) -> tuple:
    if head is not None:
        if not isinstance(head, Head):
            raise AssumptionError("head", "a Head", type(head).__name__, "pass one head of a layer")
        return (head,)
    if layer is None:
        raise AssumptionError("head", "a Head, or a layer via layer=...", "neither",
                              "pass the weights the bound is evaluated on")
    if not isinstance(layer, (TransformerLayer, Layer)):
        raise AssumptionError("layer", "a TransformerLayer or Layer", type(layer).__name__,
                              "load one with lipbound.numeric.model.load_weights")
    return tuple(layer.heads)


#: symbols whose values the heads' kernels give (the temperature and regulariser of the scaled cosine and of
#: QK-norm, QK-norm's largest gains)
_KERNEL_SYMBOLS = ("tau", "epsilon", "gamma_q", "gamma_k", "gamma_qk")
#: weight quantities of rotary heads (lipbound.symbolic.symbols): maxima over the offsets that occur
_ROTARY_QUANTITIES = ("a", "g_Q", "g_K", "s_c")


def _rotary_quantities(head: Head, center: np.ndarray, n: int, m: int | None) -> dict:
    """``a = max ||A_Delta||``, ``g_Q = max ||W_K R_Delta^T q_c|| / sqrt(d_k)``, ``g_K = max ||W_Q R_Delta k_c|| /
    sqrt(d_k)``, ``s_c = max |q_c^T R_Delta k_c| / sqrt(d_k)`` (``q_c = W_Q^T c + b_Q``, ``k_c = W_K^T c + b_K``) over
    the offsets that occur (:func:`~lipbound.numeric.offsets.offsets_of`), as intervals; kept on the head."""
    offsets = offsets_of(head, n, m)
    key = ("rotary", center.tobytes(), offsets)
    cache = head.norm_cache
    if key not in cache:
        scale = 1 / IV.sqrt(IV.mpf(head.d_k))
        W_Q, W_K = Enclosure.exact(head.W_Q), Enclosure.exact(head.W_K)
        column = Enclosure.exact(center.reshape(-1, 1))
        q_c = W_Q.T @ column + Enclosure.exact(head.b_Q.reshape(-1, 1))
        k_c = W_K.T @ column + Enclosure.exact(head.b_K.reshape(-1, 1))
        parts = {name: [] for name in _ROTARY_QUANTITIES}
        for delta in offsets:
            R = rotation_enclosure(head.kernel, head.d_k, delta)
            parts["a"].append(product_norm_interval(W_Q, R @ W_K.T))
            parts["g_Q"].append((W_K @ (R.T @ q_c)).norm_interval())
            parts["g_K"].append((W_Q @ (R @ k_c)).norm_interval())
            parts["s_c"].append(abs((q_c.T @ (R @ k_c)).interval()))
        cache[key] = {name: interval((max(lower(v) for v in values), max(upper(v) for v in values))) * scale
                      for name, values in parts.items()}
    return cache[key]


def _mask_value(heads, name: str, n: int):
    """The value every head's mask gives the symbol ``name``: the window ``w``, ALiBi's slope ``m_A``, the
    spread ``Delta_b`` of the position biases over a row, the soft-cap ``c_cap`` (refused when the heads
    differ or have none)."""
    values = set()
    for head in heads:
        mask = head.mask
        if name == "w":
            values.add(mask.window)
        elif name == "c_cap":
            values.add(mask.softcap)
        elif name == "m_A":
            slope = getattr(mask.bias, "slope", None)
            if slope is not None and slope <= 0:
                raise AssumptionError("ALiBi.slope", "a positive slope (the ALiBi theorem's m_A > 0)", repr(slope),
                                      "ALiBi biases decay with the distance: -m_A |i - j| with m_A > 0")
            values.add(slope)
        else:
            values.add(float(np.max(HeadRows(head, n).bias_spread)))
    if len(values) != 1 or None in values:
        raise AssumptionError(name, "one value shared by the heads' masks", str(sorted(values, key=str)),
                              "evaluate the heads one at a time")
    return interval(values.pop())


def _kernel_value(heads, name: str):
    """The value every head's kernel gives the symbol ``name`` (refused when they differ or have none); a
    temperature ``tau`` the kernel leaves to the standard scale is ``1/sqrt(d_k)``, enclosed."""
    values = {h.kernel.symbol_values().get(name) for h in heads}
    if name == "tau" and values == {None} and all(h.kernel.facts(h.d_k).standard_scale for h in heads):
        return 1 / IV.sqrt(IV.mpf(_common(heads, "d_k")))
    if len(values) != 1 or None in values:
        raise AssumptionError(name, "one value shared by the heads' kernels", str(sorted(values, key=str)),
                              "evaluate the heads one at a time, or pass values={...}")
    return values.pop()


def _common(heads, attribute: str) -> float:
    values = {getattr(h, attribute) for h in heads}
    if len(values) != 1:
        raise AssumptionError(attribute, "one value shared by the heads", str(sorted(values)),
                              "evaluate the heads one at a time")
    return values.pop()


def _given(name: str, value):
    try:
        return interval(value)
    except Exception:
        raise AssumptionError(f"values[{name!r}]", "a number, a pair (lo, hi) or an mpmath interval",
                              repr(value), "pass e.g. values={'m_Q': 0.5}") from None


def _free(expr) -> set:
    if isinstance(expr, Bound):
        expr = expr.expr
    return sp.sympify(expr).free_symbols


def symbol_intervals(expr, head: Head | None = None, *, layer=None, domain: TokenDomain,
                     n: int, m: int | None = None, H: int | None = None, values: dict | None = None) -> dict:
    """An interval for every free symbol of ``expr`` on these weights and this domain.

    Parameters
    ----------
    expr : sympy expression or Bound
    head : Head, optional
        The head whose weights the per-head symbols refer to.  Without it, per-head symbols
        take the maximum over ``layer.heads``.
    layer : TransformerLayer or Layer, optional
        Supplies ``W_O`` and ``H`` (and the heads when ``head`` is None).
    domain : TokenDomain
        Gives ``R`` (or ``gamma_max``) and the centre ``c``.
    n, m, H : int
        Tokens, queries (cross-attention), heads (default: the layer's head count).
    values : dict, optional
        Values for other symbols, or overrides, by name: a number, ``(lo, hi)`` or an interval.

    Returns
    -------
    dict
        ``symbol -> interval``.  Sizes are exact; norm symbols get certified ``[lower, upper]``.

    Raises
    ------
    AssumptionError
        A symbol lipbound cannot compute (named), or weights/domain that do not fit.
    """
    if not isinstance(domain, TokenDomain):
        raise AssumptionError("domain", "a TokenDomain", type(domain).__name__,
                              "build one with TokenBall(R) or LayerNormOutputs(norm)")
    heads = _heads_of(head, layer)
    d, d_k, d_v = (_common(heads, a) for a in ("d", "d_k", "d_v"))
    domain.check_width(d)
    center = np.zeros(d) if domain.center is None else domain.center
    for name, value, meaning in (("n", n, "the number of tokens"), ("m", m, "the number of queries"),
                                 ("H", H, "the number of heads")):
        if value is None and name != "n":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise AssumptionError(name, f"a positive int ({meaning})", repr(value), f"pass e.g. {name}=8")
    heads_count = H if H is not None else (len(layer.heads) if layer is not None else None)
    sizes = {"n": int(n), "m": m, "d": d, "d_k": d_k, "d_v": d_v, "H": heads_count}
    exact_sizes = {getattr(S, k): v for k, v in sizes.items() if v is not None}
    values = {str(key): value for key, value in (values or {}).items()}  # symbols or names
    free = _free(expr)
    norm_symbols = {s: _norm_expression(str(s)) for s in free
                    if isinstance(s, (S.MatrixNormSymbol, S.VectorNormSymbol)) and str(s) not in values}
    known = domain.symbol_values(centred=any(_uses(matrix, S.c) for matrix, _ in norm_symbols.values()))
    if layer is None and any(_uses(matrix, S.W_O) for matrix, _ in norm_symbols.values()):
        raise AssumptionError("W_O", "a layer with an output projection (the bound is multi-head)",
                              "a single head", "pass the layer (or evaluate a single-head bound)")
    environments = [_Environment(h, layer, center[:, None], exact_sizes) for h in heads]

    out = {}
    for symbol in sorted(free, key=str):
        name = str(symbol)
        if name in values:
            out[symbol] = _given(name, values[name])
        elif name in _SIZES:
            if sizes[name] is None:
                raise AssumptionError(name, f"a value for {name}", "None",
                                      f"pass {name}=... (it appears in the bound)")
            out[symbol] = interval(int(sizes[name]))
        elif name in known:
            out[symbol] = known[name]
        elif name == "gamma_max":
            raise AssumptionError(name, "LayerNorm outputs (the bound was derived on a LayerNorm image)",
                                  domain.describe(), "derive the bound on the domain it is evaluated on "
                                  "(lipbound.numeric.dispatch.derive_for)")
        elif name in _KERNEL_SYMBOLS:
            out[symbol] = interval(_kernel_value(heads, name))
        elif name in _ROTARY_QUANTITIES:
            enclosures = [_rotary_quantities(h, center, n, m)[name] for h in heads]
            out[symbol] = interval((max(lower(e) for e in enclosures), max(upper(e) for e in enclosures)))
        elif name in ("w", "m_A", "Delta_b", "c_cap"):
            out[symbol] = _mask_value(heads, name, int(n))
        elif name == "G":
            groups = {getattr(getattr(layer, "attention", layer), "num_groups", None)}
            if None in groups:
                raise AssumptionError("G", "a layer with key/value groups", "a single head", "pass the layer")
            out[symbol] = interval(groups.pop())
        elif symbol in norm_symbols:
            matrix, scalar = norm_symbols[symbol]
            scale = _scalar_interval(scalar, exact_sizes)
            if not any(_uses(matrix, s) for s in _PER_HEAD):
                enclosures = [environments[0].norm_interval(matrix)]
            else:
                enclosures = [env.norm_interval(matrix) for env in environments]
            lo = max(lower(e) for e in enclosures)  # the maximum over heads lies in [max lo, max hi]
            hi = max(upper(e) for e in enclosures)
            out[symbol] = interval((lo, hi)) * scale
        else:
            raise AssumptionError(name, "a size, a radius or a weight-norm symbol lipbound can compute",
                                  f"the unknown symbol {name} ({type(symbol).__name__})",
                                  f"pass its value in values={{{name!r}: ...}}")
    return out


# Evaluation -------------------------------------------------------------------------------------
def _renamed(expr: sp.Expr, symbols: list) -> tuple[sp.Expr, list]:
    """Rename the symbols to plain identifiers without re-evaluating the expression (``Min``
    of ``kappa`` terms is costly to rebuild), so that lambdify need not dummify."""
    plain = [sp.Symbol(f"_s{i}", real=True) for i in range(len(symbols))]
    with sp.evaluate(False):
        renamed = sp.sympify(expr).xreplace(dict(zip(symbols, plain)))
    return renamed, plain


def _float_kappa(size, spread):
    return size / (1.0 + (size - 1.0) * np.exp(-spread))


def _float_causal_kappa(size, spread):
    return float(np.sum(1.0 / (1.0 + np.arange(int(size)) * np.exp(-float(spread)))))


def _float_lambertw(z, k=0):
    return float(mpmath.lambertw(z, k).real)


def _float_digamma(*args):
    return float(mpmath.digamma(args[-1])) if len(args) == 1 or args[0] == 0 else float("nan")


_FLOAT_FUNCTIONS = {"kappa": _float_kappa, "causal_kappa": _float_causal_kappa,
                    "lambert_level": lambda size: _float_lambertw((size - 1.0) / np.e),
                    "LambertW": _float_lambertw, "digamma": _float_digamma, "polygamma": _float_digamma}


@functools.lru_cache(maxsize=256)
def _float_function(expr: sp.Expr, symbols: tuple):
    """The lambdified expression, once per bound and symbol order (printing it is the costly part)."""
    renamed, plain = _renamed(expr, list(symbols))
    return sp.lambdify(plain, renamed, modules=[_FLOAT_FUNCTIONS, "numpy"])


@functools.lru_cache(maxsize=256)
def _interval_function(expr: sp.Expr, symbols: tuple):
    """:func:`compile_interval` once per bound and symbol order (not once per head or layer)."""
    return compile_interval(expr, list(symbols))


@functools.lru_cache(maxsize=1024)
def _increasing(expr: sp.Expr, symbol) -> bool:
    return is_nondecreasing(expr, symbol)


def _float_value(expr: sp.Expr, point: dict) -> float:
    """Plain double-precision evaluation (numpy), with kappa written as n / (1 + (n-1) e^-omega)
    so that large score spreads do not overflow."""
    symbols = tuple(sorted(point, key=str))
    function = _float_function(expr, symbols)
    with np.errstate(all="ignore"):
        try:
            return float(function(*[point[s] for s in symbols]))
        except OverflowError:   # math-module functions raise past the float range (a huge domain's radius)
            return math.inf


def evaluate_bound(bound, head_or_layer, domain: TokenDomain, n: int, *, m: int | None = None,
                   H: int | None = None, values: dict | None = None, name: str = "derived") -> CertifiedValue:
    """Evaluate a bound on concrete weights with interval arithmetic.

    Parameters
    ----------
    bound : Bound or sympy expression
        A :class:`Bound` is evaluated only on heads its theorem covers; a bare expression (a
        published claim's statement) is evaluated as given.
    head_or_layer : Head, TransformerLayer or Layer
        A head for single-head bounds; a layer for multi-head bounds (``W_O``, ``H``), or for
        a single-head bound maximised over the layer's heads.
    domain : TokenDomain
    n, m, H : int
        Tokens, queries, heads.
    values : dict, optional
        Values for further symbols (e.g. user-stated lower bounds), by name.
    name : str
        The name of the returned value.

    Returns
    -------
    CertifiedValue
        ``value`` is certified: the bound's exact value at the true weight norms is at most it.
        ``details``: ``interval`` (the enclosure), ``float_value`` (a plain double-precision
        evaluation at the norm estimates, what a non-rigorous computation reports) and
        ``symbols`` (the enclosure of every symbol).

    Raises
    ------
    AssumptionError
        Unknown symbols, a head the theorem does not cover, a single head for a bound with ``W_O``.
    NotCertifiedError
        A multi-head maximum over a bound not proved increasing in the per-head symbols, or
        an expression without a rigorous interval version.
    """
    if getattr(bound, "lipschitz", True) is False:
        raise AssumptionError("bound", "a Bound", "NotLipschitz: the map is not Lipschitz on its domain",
                              "derive the bound on a bounded domain (a ball or a LayerNorm image)")
    expr = bound.expr if isinstance(bound, Bound) else sp.sympify(bound)
    head, layer = (head_or_layer, None) if isinstance(head_or_layer, Head) else (None, head_or_layer)
    heads = _heads_of(head, layer)
    if isinstance(bound, Bound):
        for member in heads:
            check_covers(bound, member)
        check_layer(layer)
    intervals = symbol_intervals(expr, head, layer=layer, domain=domain, n=n, m=m, H=H, values=values)
    if len(heads) > 1:
        for symbol in intervals:
            if isinstance(symbol, (S.MatrixNormSymbol, S.VectorNormSymbol, S.WeightQuantity)) \
                    and not _increasing(expr, symbol):
                raise NotCertifiedError(
                    "bound", f"an expression increasing in the per-head symbol {symbol}",
                    "no proof of monotonicity", "evaluate each head on its own (pass a Head) and take the maximum")
    symbols = sorted(intervals, key=str)
    result = _interval_function(expr, tuple(symbols))(*[intervals[s] for s in symbols])
    lo, hi = lower(result), upper(result)
    # the plain evaluation sees what a float computation would: the norm estimates, no directed rounding
    details = {"interval": (lo, hi), "float_value": _float_value(expr, {s: float(e.mid) for s, e in intervals.items()}),
               "symbols": {str(s): (lower(e), upper(e)) for s, e in intervals.items()}}
    provenance = f"lipbound theorem {bound.theorem}" if isinstance(bound, Bound) else "expression evaluated"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return not_certified(name, provenance, "the interval evaluation overflowed", **details)
    return CertifiedValue(name, hi, Verdict.HOLDS, provenance, details=details)
