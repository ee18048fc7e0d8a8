"""Compare two bounds for all admissible values, or find where the order fails.

:func:`compare` decides ``a <= b`` where every symbol is positive (sizes are
positive integers).  It tries, in order, steps that each produce a proof a reader
can check:

1. SymPy: ``b - a`` simplifies to something SymPy knows is non-negative;
2. monotone replacement: if ``a`` is non-decreasing in a sub-term ``u`` and
   ``u <= w`` (``min(x, y) <= x``; ``kappa(n, omega) <= n``), then ``a <= a[u -> w]``,
   and symmetrically for ``b``;
3. squaring both (non-negative) sides to remove square roots;
4. an AM-GM certificate: the numerator of ``b - a`` is a polynomial in positive
   variables whose every negative monomial is paid for by pairs of positive
   monomials with ``m_q <= (m_1 + m_2) / 2`` (``e_q = (e_1 + e_2) / 2``); found by an
   exact rational linear program;
5. otherwise, interval branch and bound on a box (``mpmath.iv``) -- a verdict on the
   box only -- or a counterexample where ``a > b`` with certainty.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import final

import mpmath
import sympy as sp

from ..errors import NotCertifiedError
from ..rigorous.compiler import compile_interval
from . import symbols as S
from .calculus import coarsen
from .monotone import is_nondecreasing

__all__ = ["Comparison", "compare", "amgm_certificate", "UPPER_FACTS"]


@final
@dataclass(frozen=True)
class Comparison:
    """Outcome of ``compare(a, b)``.

    ``verdict``: ``"proved"`` (a <= b for every admissible value), ``"refuted"``
    (a certified point with a > b in ``counterexample``), ``"verified-on-box"``
    (a <= b proved by interval arithmetic on ``box`` only), or ``"unknown"``.
    ``strict`` is True when the proof also shows ``a < b`` everywhere.
    """

    verdict: str
    steps: tuple[str, ...] = ()
    strict: bool = False
    counterexample: dict | None = None
    box: dict | None = None

    def __bool__(self):
        return self.verdict == "proved"


def _upper_kappa(node):
    size, spread = node.args
    return [size, sp.exp(spread)]


def _submultiplicative(node):
    coarse = coarsen(node)
    return [coarse] if coarse != node else []


#: sub-term class -> function giving terms known to be >= it
UPPER_FACTS = {
    S.kappa: _upper_kappa,
    S.causal_kappa: lambda node: [node.args[0]],
    sp.Min: lambda node: list(node.args),
    S.MatrixNormSymbol: _submultiplicative,   # ||M N|| <= ||M|| ||N||
}


def _monotone_increasing(expr: sp.Expr, node: sp.Expr) -> bool:
    z = sp.Dummy("z", positive=True)
    replaced = expr.xreplace({node: z})
    if is_nondecreasing(replaced, z):  # by structure: most bounds are built of increasing operations
        return True
    derivative = sp.diff(replaced, z)
    return sp.simplify(derivative).is_nonnegative is True


#: ``simplify`` of a larger difference costs seconds and, in the comparisons lipbound makes, never
#: decides the sign; the monotone replacements and the AM-GM certificate do.
_SIMPLIFY_OPS = 60


def _nonnegative(expr: sp.Expr) -> bool:
    expr = sp.sympify(expr)
    if expr == 0 or expr.is_nonnegative:
        return True
    if sp.count_ops(expr) > _SIMPLIFY_OPS:
        return False
    simple = sp.simplify(expr)
    return simple == 0 or simple.is_nonnegative is True


def _prove(a, b, steps: list, depth: int = 0) -> tuple[bool, bool]:
    """Return (proved, strict)."""
    if depth > 6:
        return False, False
    if _nonnegative(b - a):
        steps.append(f"SymPy: {b} - ({a}) >= 0")
        return True, _positive(b - a)
    if isinstance(b, sp.Min):
        results = [_prove(a, arg, steps, depth + 1) for arg in b.args]
        return all(r[0] for r in results), all(r[1] for r in results)
    for node in sorted(_replaceable(a), key=str):
        if _monotone_increasing(a, node):
            for upper in UPPER_FACTS[type(node)](node):
                replaced = a.xreplace({node: upper})
                trial: list = []
                proved, strict = _prove(replaced, b, trial, depth + 1)
                if proved:
                    steps.append(f"the left-hand side is non-decreasing in {node} and {node} <= {upper}")
                    steps.extend(trial)
                    return True, strict
    if a.is_nonnegative is not False and b.is_nonnegative is not False and (a.has(sp.sqrt) or b.has(sp.Pow)):
        squared_a, squared_b = sp.expand(a ** 2), sp.expand(b ** 2)
        if (squared_a, squared_b) != (a, b) and depth < 3:
            certificate = amgm_certificate(squared_b - squared_a)
            if certificate is not None:
                steps.append("both sides are non-negative; square them")
                steps.append(certificate[0])
                return True, certificate[1]
    certificate = amgm_certificate(b - a)
    if certificate is not None:
        steps.append(certificate[0])
        return True, certificate[1]
    return False, False


def _positive(expr) -> bool:
    return sp.simplify(expr).is_positive is True


def _replaceable(expr):
    return [node for node in sp.preorder_traversal(expr) if type(node) in UPPER_FACTS]


def amgm_certificate(difference: sp.Expr) -> tuple[str, bool] | None:
    """An AM-GM certificate that ``difference >= 0`` for positive variables, or None.

    The numerator (over a positive denominator) is written as a polynomial in the
    positive symbols and in new variables for square roots of symbols.  Each negative
    monomial ``-c m_q`` is covered by pairs of positive monomials with
    ``m_q <= (m_1 + m_2) / 2``; the amounts are found by an exact linear program.
    Returns (explanation, strict) where ``strict`` means positive slack remains.
    """
    from sympy.solvers.simplex import lpmax

    expr = sp.together(sp.expand(difference))
    numerator, denominator = sp.fraction(expr)
    if not (denominator.is_positive or _positive(denominator)):
        return None
    roots: dict[sp.Expr, sp.Symbol] = {}
    for power in numerator.atoms(sp.Pow):
        base, exponent = power.as_base_exp()
        if base.is_Symbol and base.is_positive and exponent.is_Rational and exponent.q == 2:
            roots.setdefault(base, sp.Symbol(f"sqrt({base})", positive=True))  # a new variable, named as read
    numerator = sp.expand(numerator.xreplace({base ** sp.Rational(1, 2): r for base, r in roots.items()})
                          .xreplace({base: r ** 2 for base, r in roots.items()}))
    variables = sorted(numerator.free_symbols, key=str)
    if not variables or any(not v.is_positive for v in variables):
        return None
    try:
        polynomial = sp.Poly(numerator, *variables)
    except sp.PolynomialError:
        return None
    terms = polynomial.terms()
    positive = [(e, c) for e, c in terms if c > 0]
    negative = [(e, -c) for e, c in terms if c < 0]
    if not negative:
        return "every monomial of the numerator is non-negative", bool(positive)
    pairs = []  # (q index, p1 index, p2 index)
    for qi, (eq, _) in enumerate(negative):
        for i, j in itertools.combinations_with_replacement(range(len(positive)), 2):
            if all(2 * q == a + b for q, a, b in zip(eq, positive[i][0], positive[j][0])):
                pairs.append((qi, i, j))
    if not pairs or any(all(p[0] != qi for p in pairs) for qi in range(len(negative))):
        return None
    amounts = sp.symbols(f"lambda0:{len(pairs)}", nonnegative=True)
    constraints = []
    for qi, (_, cq) in enumerate(negative):
        constraints.append(sp.Eq(sum(amounts[k] for k, p in enumerate(pairs) if p[0] == qi), cq))
    usage: dict[int, sp.Expr] = {}
    for k, (_, i, j) in enumerate(pairs):
        usage[i] = usage.get(i, 0) + amounts[k] / 2
        usage[j] = usage.get(j, 0) + amounts[k] / 2
    slack_terms = []
    for i, (_, cp) in enumerate(positive):
        constraints.append(sp.Le(usage.get(i, 0), cp))
        slack_terms.append(cp - usage.get(i, 0))
    constraints.extend(sp.Ge(a, 0) for a in amounts)
    try:
        best, solution = lpmax(sum(slack_terms), constraints)
    except Exception:  # infeasible or unbounded: no certificate of this shape
        return None
    used = ", ".join(f"{_monomial(variables, negative[qi][0])} <= ({_monomial(variables, positive[i][0])} + "
                     f"{_monomial(variables, positive[j][0])})/2 x {solution[amounts[k]]}"
                     for k, (qi, i, j) in enumerate(pairs) if solution[amounts[k]] != 0)
    return f"AM-GM certificate on the numerator {sp.factor(numerator)}: {used}", best > 0


def _monomial(variables, exponents) -> str:
    return str(sp.Mul(*[v ** e for v, e in zip(variables, exponents)]))


def compare(a: sp.Expr, b: sp.Expr, box: dict | None = None, samples: int = 2000, seed: int = 0,
            depth: int = 12) -> Comparison:
    """Decide ``a <= b`` for every admissible value of the (positive) symbols.

    Parameters
    ----------
    a, b : sympy expressions
    box : dict, optional
        ``symbol -> (low, high)`` for the numeric fallback (default ``[1e-2, 1e2]`` for
        real symbols, ``[1, 64]`` for sizes).
    samples : int
        Random points tried for a counterexample before branch and bound.
    """
    a, b = sp.sympify(a), sp.sympify(b)
    steps: list[str] = []
    proved, strict = _prove(a, b, steps)
    if proved:
        return Comparison("proved", tuple(steps), strict)
    return _numeric(a, b, box, samples, seed, depth)  # the interval namespace knows kappa and friends


def _default_box(symbols, box):
    result = {}
    for s in symbols:
        if box and (s in box or str(s) in box):
            result[s] = box.get(s, box.get(str(s)))
        elif s.is_integer:
            result[s] = (1, 64)
        else:
            result[s] = (1e-2, 1e2)
    return result


def _numeric(a, b, box, samples, seed, depth) -> Comparison:
    difference = b - a
    symbols = sorted(difference.free_symbols, key=lambda s: (str(s), type(s).__name__))
    bounds = _default_box(symbols, box)
    interval_value = compile_interval(difference, symbols)
    rng = random.Random(seed)
    joint = {s: _submultiplicative(s)[0] for s in symbols
             if isinstance(s, S.MatrixNormSymbol) and _submultiplicative(s)
             and _submultiplicative(s)[0].free_symbols <= set(symbols)}
    for _ in range(samples):
        point = {}
        for s in symbols:
            low, high = bounds[s]
            point[s] = rng.randint(int(low), int(high)) if s.is_integer else \
                float(mpmath.exp(rng.uniform(float(mpmath.log(low)), float(mpmath.log(high)))))
        for s, product in joint.items():  # admissible points only: ||M N|| <= ||M|| ||N||
            point[s] = float(product.xreplace(point)) * rng.uniform(0.01, 1.0)
        try:
            exact = interval_value(*[point[s] for s in symbols])
        except NotCertifiedError:
            continue
        if exact.b < 0:
            return Comparison("refuted", ("interval evaluation at the point is negative",),
                              counterexample={str(k): v for k, v in point.items()},
                              box={str(k): v for k, v in bounds.items()})
    queue = [{s: (mpmath.mpf(lo), mpmath.mpf(hi)) for s, (lo, hi) in bounds.items()}]
    for _ in range(4 ** min(depth, 6)):
        if not queue:
            return Comparison("verified-on-box", ("interval branch and bound: b - a >= 0 on every sub-box",),
                              box={str(k): v for k, v in bounds.items()})
        cell = queue.pop()
        try:
            enclosure = interval_value(*[(lo, hi) for lo, hi in (cell[s] for s in symbols)])
        except NotCertifiedError:  # e.g. a sum over tokens needs an exact integer n: split sizes first
            sizes = [s for s in cell if s.is_integer and cell[s][1] > cell[s][0]]
            if not sizes:
                return Comparison("unknown", ("a function could not be enclosed on this box",),
                                  box={str(k): v for k, v in bounds.items()})
            widest = max(sizes, key=lambda s: float(cell[s][1] - cell[s][0]))
            lo, hi = cell[widest]
            middle = mpmath.floor((lo + hi) / 2)
            queue.append({**cell, widest: (lo, middle)})
            queue.append({**cell, widest: (middle + 1, hi)})
            continue
        if enclosure.a >= 0:
            continue
        widest = max(cell, key=lambda s: float(cell[s][1] / cell[s][0]))
        lo, hi = cell[widest]
        middle = mpmath.sqrt(lo * hi) if lo > 0 else (lo + hi) / 2
        if widest.is_integer:
            middle = mpmath.floor(middle)
            if middle <= lo:
                continue  # an integer cell that is a single point was already sampled
        queue.append({**cell, widest: (lo, middle)})
        queue.append({**cell, widest: (middle, hi)})
    return Comparison("unknown", ("branch and bound did not finish",), box={str(k): v for k, v in bounds.items()})

