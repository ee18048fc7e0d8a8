"""A small vector calculus and a sound calculus of inequalities for score functions.

Scores are scalar SymPy expressions in the atoms :class:`Inner` (``<u, v>``),
:class:`Norm` (``||u||_2``) and :class:`SoftNorm` (``sqrt(||u||^2 + eps)``),
whose vector arguments are *affine* in the token variables: sums of
``M * x``, ``M * y`` and constant vectors, with M a product of weight matrices.

Two jobs:

* differentiation: :func:`gradient` (a list of :class:`VecTerm`) and
  :func:`mixed_hessian` (a list of :class:`MatTerm`), exact, by the chain rule;
* sound upper bounds over a domain: :func:`upper_norm_vec`, :func:`upper_norm_mat`,
  :func:`upper_abs`, :func:`lower_abs`.  Each rule is a textbook inequality
  (triangle, Cauchy-Schwarz, submultiplicativity, monotonicity, a domain fact),
  and every use is recorded in a :class:`~lipbound.symbolic.record.Derivation`.

Norms of constant matrices are kept as joint quantities (``||W_K W_Q^T||``, not
``||W_K|| ||W_Q||``): they are sharper and the numeric layer computes them
exactly; :func:`coarsen` trades them for products when a user wants that.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast, final

import sympy as sp

from ..errors import AssumptionError
from . import symbols as S
from .record import Derivation, Described, Simeq, le

__all__ = [
    "Inner", "Norm", "SoftNorm", "VecTerm", "MatTerm", "Region",
    "affine_parts", "expand_score", "drop_free_terms", "gradient", "mixed_hessian",
    "upper_norm_vec", "upper_norm_terms", "upper_norm_mat", "upper_abs", "lower_abs", "score_range", "constant_sign",
    "name_norms", "named_definitions", "coarsen",
]


class Inner(sp.Function):
    """``<u, v> = u^T v`` for column vectors u, v (SymPy ``MatrixExpr``)."""

    nargs = 2
    is_real = True
    is_commutative = True

    @classmethod
    def eval(cls, u, v):
        if getattr(u, "is_ZeroMatrix", False) or getattr(v, "is_ZeroMatrix", False):
            return sp.Integer(0)
        return None


class Norm(sp.Function):
    """``||u||_2`` of a column vector u."""

    nargs = 1
    is_real = True
    is_nonnegative = True
    is_commutative = True


class SoftNorm(sp.Function):
    """``sqrt(||u||_2^2 + eps)``, the regularised norm of scaled-cosine attention (eps > 0)."""

    nargs = 2
    is_real = True
    is_positive = True
    is_commutative = True


ATOMS = (Inner, Norm, SoftNorm)


# Affine structure -----------------------------------------------------------
@functools.lru_cache(maxsize=4096)  # matrix-expression algebra is slow; the same vectors recur
def _terms(vector: sp.MatrixExpr) -> tuple[sp.MatrixExpr, ...]:
    expanded = sp.expand(vector) if not isinstance(vector, sp.MatrixExpr) else vector.expand()
    expanded = expanded.doit() if hasattr(expanded, "doit") else expanded
    if isinstance(expanded, sp.MatAdd):
        return tuple(expanded.args)
    if getattr(expanded, "is_ZeroMatrix", False):
        return ()
    return (expanded,)


def _split_term(term: sp.MatrixExpr) -> tuple[sp.Expr, list[sp.MatrixExpr]]:
    """``term = scalar * M_1 ... M_k``: return (scalar, [M_1, ..., M_k])."""
    if isinstance(term, sp.MatMul):
        scalars = [a for a in term.args if not isinstance(a, sp.MatrixExpr)]
        matrices = [a for a in term.args if isinstance(a, sp.MatrixExpr)]
        return sp.Mul(*scalars), matrices
    return sp.Integer(1), [term]


def affine_parts(vector: sp.MatrixExpr, variables: tuple) -> dict:
    """Split an affine vector (cached; returns a fresh dict)."""
    return dict(_affine_parts(vector, tuple(variables)))


@functools.lru_cache(maxsize=4096)
def _affine_parts(vector: sp.MatrixExpr, variables: tuple) -> tuple:
    """Split an affine vector into ``{variable: coefficient matrix, None: constant}``.

    ``vector = sum_v C_v v + b``; coefficients are matrix expressions.  Raises
    :class:`AssumptionError` if a variable appears other than as the last factor.
    """
    parts: dict = {}
    for term in _terms(vector):
        scalar, matrices = _split_term(term)
        for variable in variables:
            if any(variable in mat.free_symbols or mat == variable for mat in matrices[:-1]):
                raise AssumptionError(
                    "score", "vectors affine in the tokens (M x + b)", str(term),
                    "write the score with Inner/Norm of affine projections")
        last = matrices[-1]
        key = last if last in variables else None
        if key is None:
            piece = scalar * sp.MatMul(*matrices) if matrices else scalar
        else:
            rest = matrices[:-1]
            piece = scalar * (sp.MatMul(*rest) if rest else sp.Identity(last.shape[0]))
        piece = piece.doit() if hasattr(piece, "doit") else piece
        parts[key] = piece if key not in parts else (parts[key] + piece).doit()
    return tuple(parts.items())


def _expand_inner(expr: sp.Expr, variables: tuple) -> sp.Expr:
    """Expand every ``Inner`` bilinearly over the affine parts of its arguments."""

    def expand_one(atom: Inner) -> sp.Expr:
        u, v = atom.args
        total = sp.Integer(0)
        for ku, pu in affine_parts(u, variables).items():
            for kv, pv in affine_parts(v, variables).items():
                left = pu if ku is None else (pu * ku)
                right = pv if kv is None else (pv * kv)
                total += Inner(left.doit(), right.doit())
        return total

    return expr.replace(lambda e: isinstance(e, Inner), expand_one)


def expand_score(score: sp.Expr, variables: tuple) -> sp.Expr:
    """Score with inner products expanded bilinearly (norms are left whole)."""
    return sp.expand(_expand_inner(sp.sympify(score), variables))


def drop_free_terms(score: sp.Expr, key_variable, variables: tuple, record: Derivation) -> sp.Expr:
    """Drop additive terms that do not depend on the key variable (softmax shift invariance)."""
    expanded = expand_score(score, variables)
    terms = sp.Add.make_args(expanded)
    kept = [term for term in terms if _depends(term, key_variable)]
    dropped = [term for term in terms if not _depends(term, key_variable)]
    result = sp.Add(*kept)
    if dropped:
        record.add(Simeq(Described("s(x, y)"), result),
                   "softmax is invariant under adding to every score of a row a term "
                   "that does not depend on the key", "shift-invariance")
    return result


def _depends(expr, variable) -> bool:
    return any(variable in atom.free_symbols for atom in sp.sympify(expr).atoms(*ATOMS)) or \
        variable in sp.sympify(expr).free_symbols


# Differentiation ------------------------------------------------------------
@final
@dataclass(frozen=True)
class VecTerm:
    """``coef * vec``: a scalar coefficient times an affine vector expression.

    When ``vec = J * through`` with ``through`` the argument of a norm atom,
    ``through`` is kept: ``||vec|| <= ||J|| ||through||`` can then cancel against
    ``1 / ||through||`` in the coefficient (as in cosine scores).
    """

    coef: sp.Expr
    vec: sp.MatrixExpr
    jacobian: sp.MatrixExpr | None = None
    through: sp.MatrixExpr | None = None


@final
@dataclass(frozen=True)
class MatTerm:
    """``coef * left * right^T`` (an outer product of two vector terms' vectors) if
    ``right`` is given, else ``coef * matrix``."""

    coef: sp.Expr
    left: VecTerm | sp.MatrixExpr
    right: VecTerm | None = None


def _coefficient(vector: sp.MatrixExpr, variable, variables: tuple) -> sp.MatrixExpr | None:
    return affine_parts(vector, variables).get(variable)


def _atom_gradient(atom, variable, variables: tuple) -> list[tuple[sp.Expr, sp.MatrixExpr, sp.MatrixExpr]]:
    """Gradients of an atom with respect to a variable: ``(scalar, J^T, u)`` meaning ``scalar J^T u``."""
    if isinstance(atom, Inner):
        u, v = atom.args
        pieces = []
        ju, jv = _coefficient(u, variable, variables), _coefficient(v, variable, variables)
        if ju is not None:
            pieces.append((sp.Integer(1), ju.T.doit(), v))
        if jv is not None:
            pieces.append((sp.Integer(1), jv.T.doit(), u))
        return pieces
    u = atom.args[0]
    ju = _coefficient(u, variable, variables)
    if ju is None:
        return []
    return [(1 / atom, ju.T.doit(), u)]


def _pull_scalar(matrix: sp.MatrixExpr) -> tuple[sp.Expr, sp.MatrixExpr]:
    scalar, factors = _split_term(matrix)
    if not factors:
        return scalar, sp.Identity(1)
    return scalar, (sp.MatMul(*factors).doit() if len(factors) > 1 else factors[0])


def gradient(score: sp.Expr, variable, variables: tuple) -> list[VecTerm]:
    """Exact gradient of a scalar score with respect to a token variable.

    Chain rule over the atoms: ``grad s = sum_a (ds/da) grad a`` with
    ``grad <u, v> = J_u^T v + J_v^T u`` and ``grad ||u|| = J_u^T u / ||u||``.
    """
    score = sp.sympify(score)
    terms: list[VecTerm] = []
    atoms = sorted((a for a in score.atoms(*ATOMS) if _depends(a, variable)), key=sp.default_sort_key)
    for atom in atoms:
        dummy = sp.Dummy("a", real=True)
        partial = score.xreplace({atom: dummy}).diff(dummy).xreplace({dummy: atom})
        if partial == 0:
            continue
        for factor, jacobian_t, through in _atom_gradient(atom, variable, variables):
            scalar, matrix = _pull_scalar(jacobian_t)
            vec = (matrix * through).expand().doit()
            terms.append(VecTerm(sp.factor_terms(partial * factor * scalar), vec, matrix, through))
    return _merge(terms)


def _cancels(term: VecTerm) -> bool:
    """Whether the coefficient divides by a norm of ``through`` (then keep the factored form)."""
    if term.through is None:
        return False
    return any(atom.args[0] == term.through for atom in term.coef.atoms(Norm, SoftNorm))


def _merge(terms: list[VecTerm]) -> list[VecTerm]:
    """Merge terms with the same coefficient into one affine vector (keeps joint norms),
    except terms whose factored form cancels against their coefficient."""
    merged: dict = {}
    kept: list[VecTerm] = []
    for term in terms:
        if _cancels(term):
            kept.append(term)
        elif term.coef in merged:
            merged[term.coef] = (merged[term.coef] + term.vec).doit()
        else:
            merged[term.coef] = term.vec
    return kept + [VecTerm(coef, vec) for coef, vec in merged.items()]


def mixed_hessian(score: sp.Expr, first, second, variables: tuple) -> list[MatTerm]:
    """``d/d(second) of grad_first s``: a matrix (rows: first's space), as a list of terms.

    ``d(c V) = V (grad c)^T + c J_V`` for a scalar coefficient c and an affine vector V.
    """
    result: list[MatTerm] = []
    for term in gradient(score, first, variables):
        jv = _coefficient(term.vec, second, variables)
        if jv is not None:
            result.append(MatTerm(term.coef, jv))
        for inner_term in _scalar_gradient(term.coef, second, variables):
            result.append(MatTerm(sp.Integer(1), term, inner_term))
    return result


def _scalar_gradient(coef: sp.Expr, variable, variables: tuple) -> list[VecTerm]:
    if not _depends(coef, variable):
        return []
    return gradient(coef, variable, variables)


# Bounds ---------------------------------------------------------------------
@final
@dataclass(frozen=True)
class Region:
    """What the calculus knows about the tokens: each variable in a ball.

    ``balls[v] = (centre or None, radius)``; ``floors(vector)`` returns a stated
    lower bound on ``||vector||`` or None.
    """

    balls: dict
    floors: Callable[[sp.MatrixExpr], sp.Expr | None] = lambda vector: None


@functools.lru_cache(maxsize=4096)
def _norm_of_constant_matrix(matrix: sp.MatrixExpr) -> sp.Expr:
    scalar, factors = _split_term(matrix)
    if not factors:
        return sp.Abs(scalar)
    body = sp.MatMul(*factors).doit() if len(factors) > 1 else factors[0]
    if isinstance(body, sp.Identity):
        return sp.Abs(scalar)
    if isinstance(body, sp.MatMul) and len(body.args) == 2 and body.args[1] == body.args[0].T:
        return sp.Abs(scalar) * S.matrix_norm(body.args[0]) ** 2  # ||M M^T|| = ||M||^2
    # a product or a sum of products stays one joint norm (the numeric layer computes it)
    return sp.Abs(scalar) * S.matrix_norm(body)


@functools.lru_cache(maxsize=4096)
def _norm_of_constant_vector(vector: sp.MatrixExpr) -> sp.Expr:
    scalar, factors = _split_term(vector)
    if not factors:
        return sp.Integer(0)
    body = sp.MatMul(*factors).doit() if len(factors) > 1 else factors[0]
    return sp.Abs(scalar) * S.vector_norm(body)


def _centre(vector: sp.MatrixExpr, region: Region) -> sp.MatrixExpr:
    """Substitute ``v = c + v`` for every variable with a non-zero centre.

    The shifted variable keeps its name: afterwards ``||v|| <= R`` is the domain fact.
    """
    replacements = {v: (centre + v) for v, (centre, _) in region.balls.items() if centre is not None}
    return vector.xreplace(replacements).expand().doit() if replacements else vector


def upper_norm_vec(vector: sp.MatrixExpr, region: Region, record: Derivation | None = None) -> sp.Expr:
    """A sound upper bound on ``sup ||vector||`` over the region (vector affine in the tokens).

    ``||sum_v C_v (v - c_v) + b|| <= sum_v ||C_v|| R_v + ||b||`` (triangle inequality,
    submultiplicativity, the domain), with ``b`` collecting every constant including
    ``C_v c_v``.
    """
    variables = tuple(region.balls)
    parts = affine_parts(_centre(vector, region), variables)
    total = sp.Integer(0)
    for key, piece in parts.items():
        if key is None:
            total += _norm_of_constant_vector(piece)
        else:
            total += _norm_of_constant_matrix(piece) * region.balls[key][1]
    return total


def _vector_norm(term: VecTerm, coefficient: sp.Expr, region: Region) -> sp.Expr:
    """A pointwise bound on ``||term.vec||`` to be multiplied by ``coefficient``.

    The factored form ``||J|| ||u||`` when ``coefficient`` divides by a norm of u
    (it then cancels), else the domain bound ``sup ||vec||``.
    """
    if term.through is not None and any(
            atom.args[0] == term.through for atom in sp.sympify(coefficient).atoms(Norm, SoftNorm)):
        return _norm_of_constant_matrix(term.jacobian) * Norm(term.through)
    return upper_norm_vec(term.vec, region)


def _pointwise(term: VecTerm, region: Region) -> sp.Expr:
    """A pointwise bound on ``|coef| ||vec||`` that may still contain norm atoms."""
    return term.coef * _vector_norm(term, term.coef, region)


def upper_norm_terms(terms: list[VecTerm], region: Region) -> sp.Expr:
    """A sound upper bound on ``sup ||sum_t coef_t vec_t||`` (triangle inequality over terms)."""
    return sp.Add(*[upper_abs(_pointwise(term, region), region) for term in terms])


def upper_norm_mat(terms: list[MatTerm], region: Region) -> sp.Expr:
    """A sound upper bound on the spectral norm of ``sum`` of matrix terms.

    ``||c M|| <= |c| ||M||`` and ``||u w^T|| = ||u|| ||w||``.  Constant matrices
    with the same coefficient are summed first (one joint norm).
    """
    constant: dict = {}
    total = sp.Integer(0)
    variables = tuple(region.balls)
    for term in terms:
        if term.right is None:
            matrix = cast(sp.MatrixExpr, term.left)  # coef * matrix (MatTerm's docstring)
            if any(v in matrix.free_symbols for v in variables):
                raise AssumptionError("score", "a mixed second derivative with constant matrices",
                                      str(matrix), "simplify the score")
            constant[term.coef] = (constant[term.coef] + matrix).doit() if term.coef in constant else matrix
            continue
        coefficient = term.coef * term.right.coef
        pointwise = coefficient * _vector_norm(term.left, coefficient, region) * \
            _vector_norm(term.right, coefficient, region)
        total += upper_abs(pointwise, region)
    for coef, matrix in constant.items():
        total += upper_abs(coef, region) * _norm_of_constant_matrix(matrix)
    return total


def upper_abs(expr: sp.Expr, region: Region) -> sp.Expr:
    """A sound upper bound on ``sup |expr|`` over the region.

    Rules: triangle inequality for sums, multiplicativity of |.|, Cauchy-Schwarz
    for inner products, monotonicity of powers, exp, sqrt; a negative power needs
    a positive lower bound (:func:`lower_abs`).
    """
    expr = sp.sympify(expr)
    if not expr.atoms(*ATOMS):
        return sp.Abs(expr) if expr.is_nonnegative is not True else expr
    if isinstance(expr, sp.Add):
        return sp.Add(*[upper_abs(a, region) for a in expr.args])
    if isinstance(expr, sp.Mul):
        paired = _pair_cauchy_schwarz(expr)
        if paired != expr:
            return upper_abs(paired, region)
        return sp.Mul(*[upper_abs(a, region) for a in expr.args])
    if isinstance(expr, sp.Pow):
        base, exponent = expr.args
        if exponent.is_nonnegative:
            return upper_abs(base, region) ** exponent
        if exponent.is_negative:
            return lower_abs(base, region) ** exponent
    if isinstance(expr, Inner):
        u, v = expr.args
        return upper_norm_vec(u, region) * upper_norm_vec(v, region)
    if isinstance(expr, Norm):
        return upper_norm_vec(expr.args[0], region)
    if isinstance(expr, SoftNorm):
        return sp.sqrt(upper_norm_vec(expr.args[0], region) ** 2 + expr.args[1])
    if isinstance(expr, sp.exp):
        return sp.exp(upper_abs(expr.args[0], region))
    if isinstance(expr, (sp.cos, sp.sin, sp.tanh)):
        return sp.Integer(1)
    if isinstance(expr, sp.Abs):
        return upper_abs(expr.args[0], region)
    raise AssumptionError("score", "a score built from +, *, powers, exp, sqrt, Inner, Norm",
                          f"{type(expr).__name__}: {expr}", "rewrite the score with supported operations")


def _pair_cauchy_schwarz(product: sp.Mul) -> sp.Expr:
    """In a product, ``|<u, v>| <= ||u|| ||v||`` and ``||u|| <= SoftNorm(u)`` so that norms
    in a denominator cancel (``<q, k> / (||q|| ||k||)`` becomes 1)."""
    replacements = {}
    for atom in product.atoms(Inner):
        u, v = atom.args
        denominators = {a.args[0] for a in product.atoms(Norm, SoftNorm)
                        if _has_negative_power(product, a)}
        if u in denominators or v in denominators:
            replacements[atom] = Norm(u) * Norm(v)
    result = product.xreplace(replacements) if replacements else product
    soft = {a.args[0]: a for a in product.atoms(SoftNorm) if _has_negative_power(product, a)}
    if soft:  # ||u||^k <= SoftNorm(u)^k for k > 0 only (a denominator must not grow)
        factors = []
        for factor in sp.Mul.make_args(result):
            base, exponent = factor.as_base_exp()
            if isinstance(base, Norm) and base.args[0] in soft and exponent.is_positive:
                factor = soft[base.args[0]] ** exponent
            factors.append(factor)
        result = sp.Mul(*factors)
    if result == product:
        return product
    return sp.Abs(result)


def _has_negative_power(product: sp.Expr, atom) -> bool:
    for factor in sp.Mul.make_args(product):
        base, exponent = factor.as_base_exp()
        if base == atom and exponent.is_negative:
            return True
    return False


def lower_abs(expr: sp.Expr, region: Region) -> sp.Expr:
    """A sound positive lower bound on ``inf |expr|`` over the region, or AssumptionError."""
    expr = sp.sympify(expr)
    if not expr.atoms(*ATOMS):
        if expr.is_positive or expr.is_negative:
            return sp.Abs(expr) if expr.is_negative else expr
        raise AssumptionError("score", f"{expr} bounded away from 0", "a quantity that may vanish",
                              "state a positive lower bound")
    if isinstance(expr, sp.Mul):
        return sp.Mul(*[lower_abs(a, region) for a in expr.args])
    if isinstance(expr, sp.Pow):
        base, exponent = expr.args
        if exponent.is_positive:
            return lower_abs(base, region) ** exponent
        if exponent.is_negative:
            return upper_abs(base, region) ** exponent
    if isinstance(expr, Norm):
        floor = region.floors(expr.args[0])
        if floor is None:
            raise AssumptionError(
                "assumptions.facts", f"a positive lower bound on ||{expr.args[0]}|| over the domain",
                "none stated", f"add NormAtLeast({expr.args[0]}, m) to Assumptions.facts")
        return floor
    if isinstance(expr, SoftNorm):
        return sp.sqrt(expr.args[1])
    if isinstance(expr, sp.exp):
        return sp.exp(-upper_abs(expr.args[0], region))
    raise AssumptionError("score", f"{expr} bounded away from 0", "no lower-bound rule applies",
                          "state a positive lower bound (NormAtLeast) for this quantity")


def constant_sign(expr: sp.Expr) -> int:
    """+1 if expr >= 0 everywhere, -1 if <= 0 everywhere, 0 if unknown."""
    replacements = {}
    for atom in sp.sympify(expr).atoms(*ATOMS):
        replacements[atom] = sp.Dummy("u", real=True) if isinstance(atom, Inner) else \
            sp.Dummy("r", nonnegative=True)
    plain = sp.sympify(expr).xreplace(replacements)
    if plain.is_nonnegative:
        return 1
    if plain.is_nonpositive:
        return -1
    return 0


def score_range(score: sp.Expr, region: Region) -> tuple[sp.Expr, str]:
    """An upper bound on ``sup s - inf s`` over the region, with its reason."""
    bound = upper_abs(score, region)
    if constant_sign(score) != 0:
        return bound, "the score has a constant sign, so its range is at most sup |s|"
    return 2 * bound, "the range of s is at most 2 sup |s|"


# Presentation ---------------------------------------------------------------
def name_norms(expr: sp.Expr) -> sp.Expr:
    """Rewrite norms of named matrices, e.g. ``||W_Q W_K^T|| -> sqrt(d_k) ||A||``."""
    replacements = {}
    for symbol in sp.sympify(expr).atoms(S.MatrixNormSymbol):
        if symbol.name in S.NAMED_MATRICES:
            name, scalar = S.NAMED_MATRICES[symbol.name]
            replacements[symbol] = S.MatrixNormSymbol(name) / scalar
    return sp.sympify(expr).xreplace(replacements)


def named_definitions(*exprs: sp.Expr) -> list[tuple[sp.MatrixSymbol, sp.MatrixExpr]]:
    """``(A, W_Q W_K^T / sqrt(d_k))`` for every named matrix whose norm :func:`name_norms` will write
    by its name in ``exprs`` (call it before naming), in a stable order."""
    found = {}
    for expr in exprs:
        for symbol in sp.sympify(expr).atoms(S.MatrixNormSymbol):
            if symbol.name in S.NAMED_MATRICES:
                name, _ = S.NAMED_MATRICES[symbol.name]
                value = S.NAMED_DEFINITIONS[symbol.name]
                found[name] = (sp.MatrixSymbol(name, *value.shape), value)
    return [found[name] for name in sorted(found)]


def coarsen(expr: sp.Expr, record: Derivation | None = None) -> sp.Expr:
    """Replace joint norms of products by products of norms (submultiplicativity; looser)."""
    replacements = {}
    for symbol in sp.sympify(expr).atoms(S.MatrixNormSymbol):
        factors = sp.sympify(symbol.name.replace(".T", ""), locals=_MATRIX_LOCALS)
        if isinstance(factors, sp.Mul) and len(factors.args) > 1:
            replacements[symbol] = sp.Mul(*[S.MatrixNormSymbol(str(f)) for f in factors.args])
    result = sp.sympify(expr).xreplace(replacements)
    if record is not None and replacements:
        record.add(le(expr, result), "submultiplicativity ||MN|| <= ||M|| ||N||", "submultiplicative")
    return result


_MATRIX_LOCALS = {name: sp.Symbol(name, commutative=False)
                  for name in ("W_Q", "W_K", "W_V", "W_O", "W", "A")}
