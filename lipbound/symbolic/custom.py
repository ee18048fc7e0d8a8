r"""User-defined scores and facts from text, parsed without evaluating code.

A score is written in the projected query and key ``q = W_Q^T x`` and ``k = W_K^T y``::

    Inner(q, k)**2 / d_k
    tau * Inner(q, k) / (Norm(q) * Norm(k))
    -Norm(q - k)**2 / sqrt(d_k)

and a fact is a lower bound on a norm over the domain, ``Norm(q) >= m_Q`` (``m_Q`` becomes a
positive symbol) or ``Norm(k) >= 0.5``.  The text is read by Python's :mod:`ast` parser and
rebuilt node by node from a whitelist -- numbers, ``+ - * / **``, the vectors ``q``, ``k``, the
sizes ``d_k``, ``d``, the parameters ``tau``, ``epsilon``, the lower-bound symbols the facts name,
and the functions ``Inner``, ``Norm``, ``SoftNorm``, ``exp``, ``sqrt``, ``tanh``.  Nothing is
passed to ``eval`` or to SymPy's string parser, so a score cannot run code.

Vectors may be added, subtracted and scaled (``Norm(q - 2*k)``) inside ``Inner``/``Norm``/``SoftNorm``
only; a vector anywhere else is an error that says so.  :func:`custom_variant` turns the text into a
:class:`~lipbound.symbolic.variants.SelfAttention` with a :class:`~lipbound.symbolic.scores.CustomScore`;
:func:`in_score_terms` writes the projections of an error message back as ``q`` and ``k``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, Final, NoReturn, final

import sympy as sp

from ..errors import AssumptionError
from . import symbols as S
from .assumptions import NormAtLeast
from .calculus import Inner, Norm, SoftNorm
from .scores import CustomScore, epsilon, tau
from .variants import SelfAttention

__all__ = ["QUERY", "KEY", "parse_score", "parse_fact", "custom_variant", "in_score_terms",
           "SCORE_SYNTAX", "FACT_SYNTAX"]

#: The projected query and key of a user-defined score.
QUERY: Final = S.W_Q.T * S.x
KEY: Final = S.W_K.T * S.y
_VECTORS: Final = {"q": QUERY, "k": KEY}
_SCALARS: Final = {"d_k": S.d_k, "d": S.d, "tau": tau, "epsilon": epsilon}
_FUNCTIONS: Final = {"exp": sp.exp, "sqrt": sp.sqrt, "tanh": sp.tanh}
_ATOMS: Final = {"Inner": 2, "Norm": 1, "SoftNorm": 2}
#: Longest accepted text, largest number, largest numerator/denominator of an exponent.
_MAX_LENGTH, _MAX_NUMBER, _MAX_EXPONENT = 400, 10 ** 9, 12

SCORE_SYNTAX: Final = ("a SymPy expression in q, k with Inner(q, k), Norm(q), SoftNorm(q, epsilon), d_k, d, tau, "
                       "numbers, + - * / ** and exp, sqrt, tanh")
FACT_SYNTAX: Final = "a lower bound 'Norm(q) >= m_Q' or 'Norm(k) >= 0.5' (a norm of q, k or a combination)"


def _fail(argument: str, expected: str, text: str, fix: str) -> NoReturn:
    raise AssumptionError(argument, expected, repr(text), fix)


@final
@dataclass(frozen=True)
class _Value:
    """A parsed node: a scalar SymPy expression, or a vector (an affine combination of q and k)."""

    expr: Any  # a SymPy expression (scalar) or matrix expression (vector)
    vector: bool = False


class _Builder:
    """Rebuilds a whitelisted Python expression tree as SymPy, refusing everything else."""

    def __init__(self, text: str, argument: str, names: dict):
        self.text, self.argument, self.names = text, argument, names

    def fail(self, what: str, fix: str) -> NoReturn:
        _fail(self.argument, SCORE_SYNTAX if self.argument == "score" else FACT_SYNTAX,
              f"{self.text} ({what})", fix)

    def scalar(self, node) -> sp.Expr:
        value = self.build(node)
        if value.vector:
            self.fail(f"{ast.unparse(node)} is a vector", "use vectors inside Inner(., .), Norm(.) or SoftNorm(., .)")
        return value.expr

    def vector(self, node) -> sp.MatrixExpr:
        value = self.build(node)
        if not value.vector:
            self.fail(f"{ast.unparse(node)} is not a vector", "pass q, k or a combination such as q - k")
        return value.expr

    def build(self, node) -> _Value:
        if isinstance(node, ast.Constant):
            return self.number(node)
        if isinstance(node, ast.Name):
            return self.name(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = self.build(node.operand)
            sign = -1 if isinstance(node.op, ast.USub) else 1
            return _Value(sign * value.expr, value.vector)
        if isinstance(node, ast.BinOp):
            return self.binary(node)
        if isinstance(node, ast.Call):
            return self.call(node)
        self.fail(f"{type(node).__name__} is not allowed", "write a formula with numbers, names, + - * / ** and calls")

    def number(self, node: ast.Constant) -> _Value:
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            self.fail(f"{node.value!r} is not a number", "write numbers such as 2 or 0.5")
        if abs(node.value) > _MAX_NUMBER:
            self.fail(f"{node.value!r} is too large", f"numbers up to {_MAX_NUMBER:g}")
        return _Value(sp.Rational(repr(node.value)) if isinstance(node.value, float) else sp.Integer(node.value))

    def name(self, identifier: str) -> _Value:
        if identifier in _VECTORS:
            return _Value(_VECTORS[identifier], vector=True)
        if identifier in _SCALARS:
            return _Value(_SCALARS[identifier])
        if identifier in self.names:
            return _Value(self.names[identifier])
        known = sorted(set(_VECTORS) | set(_SCALARS) | set(self.names))
        self.fail(f"unknown name {identifier!r}",
                  f"use one of {', '.join(known)} (a lower bound m_Q is named by a fact)")

    def binary(self, node: ast.BinOp) -> _Value:
        left, right = self.build(node.left), self.build(node.right)
        if isinstance(node.op, (ast.Add, ast.Sub)):
            if left.vector != right.vector:
                self.fail(f"{ast.unparse(node)} adds a vector and a scalar", "add vectors to vectors, e.g. q - k")
            result = left.expr + right.expr if isinstance(node.op, ast.Add) else left.expr - right.expr
            return _Value(result.doit() if left.vector else result, left.vector)
        if isinstance(node.op, ast.Mult):
            if left.vector and right.vector:
                self.fail(f"{ast.unparse(node)} multiplies two vectors", "use Inner(q, k) for the inner product")
            return _Value((left.expr * right.expr), left.vector or right.vector)
        if isinstance(node.op, ast.Div):
            if right.vector:
                self.fail(f"{ast.unparse(node)} divides by a vector", "divide by Norm(q) or another scalar")
            return _Value(left.expr / right.expr, left.vector)
        if isinstance(node.op, ast.Pow):
            if left.vector or right.vector:
                self.fail(f"{ast.unparse(node)} raises a vector to a power", "use Norm(q)**2 or Inner(q, q)")
            exponent = right.expr
            if not (exponent.is_Rational and abs(exponent.p) <= _MAX_EXPONENT and exponent.q <= _MAX_EXPONENT):
                self.fail(f"exponent {ast.unparse(node.right)}",
                          f"a rational exponent p/q with |p|, q <= {_MAX_EXPONENT}")
            return _Value(left.expr ** exponent)
        self.fail(f"operator {type(node.op).__name__} is not allowed", "use + - * / **")

    def call(self, node: ast.Call) -> _Value:
        if not isinstance(node.func, ast.Name) or node.keywords:
            self.fail(f"call {ast.unparse(node.func)}", "call Inner, Norm, SoftNorm, exp, sqrt or tanh by name")
        name = node.func.id
        if name in _ATOMS:
            if len(node.args) != _ATOMS[name]:
                self.fail(f"{name} takes {_ATOMS[name]} argument(s)", "e.g. Inner(q, k), Norm(q), SoftNorm(q, epsilon)")
            if name == "Inner":
                return _Value(Inner(self.vector(node.args[0]), self.vector(node.args[1])))
            if name == "Norm":
                return _Value(Norm(self.vector(node.args[0])))
            regulariser = self.scalar(node.args[1])
            if regulariser.is_positive is not True:
                self.fail("SoftNorm needs a positive regulariser", "write SoftNorm(q, epsilon)")
            return _Value(SoftNorm(self.vector(node.args[0]), regulariser))
        if name in _FUNCTIONS:
            if len(node.args) != 1:
                self.fail(f"{name} takes one argument", f"e.g. {name}(Inner(q, k))")
            return _Value(_FUNCTIONS[name](self.scalar(node.args[0])))
        self.fail(f"unknown function {name!r}", "use Inner, Norm, SoftNorm, exp, sqrt or tanh")


def _tree(text: str, argument: str, syntax: str):
    if not isinstance(text, str) or not text.strip():
        _fail(argument, syntax, str(text),
              f"write e.g. {'Inner(q, k)/sqrt(d_k)' if argument == 'score' else 'Norm(q) >= m_Q'}")
    if len(text) > _MAX_LENGTH:
        _fail(argument, f"at most {_MAX_LENGTH} characters", f"{text[:40]}... ({len(text)} characters)",
              "shorten the expression")
    try:
        return ast.parse(text.strip(), mode="eval").body
    except SyntaxError as error:
        _fail(argument, syntax, f"{text} (syntax error at column {error.offset})",
              "check the brackets and operators; powers are written **")


def parse_fact(text: str) -> NormAtLeast:
    """``"Norm(q) >= m_Q"`` -> ``NormAtLeast(W_Q^T x, m_Q)``; also ``m_Q <= Norm(q)`` and a positive number."""
    tree = _tree(text, "fact", FACT_SYNTAX)
    if not (isinstance(tree, ast.Compare) and len(tree.ops) == 1 and isinstance(tree.ops[0], (ast.GtE, ast.LtE))):
        _fail("fact", FACT_SYNTAX, text, "write one comparison with >=, e.g. Norm(q) >= m_Q")
    norm_side, bound_side = (tree.left, tree.comparators[0])
    if isinstance(tree.ops[0], ast.LtE):
        norm_side, bound_side = bound_side, norm_side
    if not (isinstance(norm_side, ast.Call) and isinstance(norm_side.func, ast.Name) and norm_side.func.id == "Norm"
            and len(norm_side.args) == 1):
        _fail("fact", FACT_SYNTAX, text, "put Norm(.) on the larger side, e.g. Norm(q) >= m_Q")
    vector = _Builder(text, "fact", {}).vector(norm_side.args[0])
    if isinstance(bound_side, ast.Name):
        if bound_side.id in _VECTORS or bound_side.id in _SCALARS:
            _fail("fact", "a new name or a positive number for the lower bound", text,
                  "name the bound, e.g. Norm(q) >= m_Q")
        bound = S.LowerBoundSymbol(bound_side.id)
    else:
        bound = _Builder(text, "fact", {}).scalar(bound_side)
        if bound.is_positive is not True:
            _fail("fact", "a positive lower bound", text, "a norm is at least 0 anyway; state a positive bound")
    return NormAtLeast(vector, bound)


def parse_score(text: str, facts=()) -> sp.Expr:
    """The SymPy score of ``text`` (see the module docstring); ``facts`` (:class:`NormAtLeast`) name
    the lower-bound symbols the score may use."""
    names = {str(fact.bound): fact.bound for fact in facts if isinstance(fact.bound, sp.Symbol)}
    expr = _Builder(text, "score", names).scalar(_tree(text, "score", SCORE_SYNTAX))
    if not expr.has(S.x) or not expr.has(S.y):
        _fail("score", "a score that depends on both q and k", text,
              "a score without k gives uniform attention; use e.g. Inner(q, k)/sqrt(d_k)")
    return expr


def custom_variant(score: str, facts=()) -> tuple[SelfAttention, tuple[NormAtLeast, ...]]:
    """``SelfAttention(CustomScore(parse_score(score)))`` and the parsed facts (pass them as
    ``Assumptions(facts=...)``).

    Examples
    --------
    >>> variant, facts = custom_variant("tau * Inner(q, k) / (Norm(q) * Norm(k))",
    ...                                 ["Norm(q) >= m_Q", "Norm(k) >= m_K"])
    """
    parsed = tuple(parse_fact(fact) for fact in facts)
    return SelfAttention(CustomScore(parse_score(score, parsed), name="user-defined score")), parsed


def in_score_terms(text: str) -> str:
    """Write the projections of a message as the user wrote them: ``W_Q.T*x -> q``, ``W_K.T*y -> k``."""
    return str(text).replace(str(QUERY), "q").replace(str(KEY), "k")
