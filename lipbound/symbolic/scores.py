"""Score functions and the kernel constants they yield.

A score class declares only local facts: its expression ``s(x, y)`` in the query
token x and key token y (built from :class:`~lipbound.symbolic.calculus.Inner`,
:class:`~lipbound.symbolic.calculus.Norm`, ...), its value map
``v(y) = V^T y + b_V``, and how it behaves on an unbounded domain.  The kernel
constants (docs/mathematics.md, section 2) are derived once, in :meth:`Score.kernel_constants`,
for every score alike:

* ``L_V = ||V||_2``, and the value spread ``rho = sup_y ||V^T (y - c)|| <= ||V|| R``;
* ``beta = sup ||grad_y s||``;
* ``alpha >= std_{y~p}(grad_x s(x, y) . e) / ||e||``: by Popoviciu's inequality
  (a standard deviation is at most half the range) and the mean value theorem,
  ``alpha <= R sup ||d_y grad_x s||``, or ``alpha <= sup ||grad_x s||``;
* ``omega >= sup_x |s(x, y) - s(x, y')|``: ``omega <= 2 R beta`` (mean value
  theorem) or the range of s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import final

import sympy as sp

from ..errors import AssumptionError
from . import symbols as S
from .calculus import (
    Inner,
    Norm,
    Region,
    SoftNorm,
    coarsen,
    drop_free_terms,
    gradient,
    mixed_hessian,
    name_norms,
    named_definitions,
    score_range,
    upper_norm_mat,
    upper_norm_terms,
    upper_norm_vec,
)
from .record import Defines, Derivation, Described, VectorSum, eq, le

__all__ = ["KernelConstants", "Score", "DotProduct", "L2Distance", "ScaledCosine", "CustomScore",
           "smaller", "affine_projection"]

tau, epsilon = S.tau, S.epsilon


@final
@dataclass(frozen=True)
class KernelConstants:
    """The kernel constants of a score on a domain, with their derivation.

    Attributes are SymPy expressions in weight-norm symbols, sizes and radii.
    """

    L_V: sp.Expr
    rho: sp.Expr
    alpha: sp.Expr
    beta: sp.Expr
    omega: sp.Expr
    record: Derivation = field(compare=False)

    def as_substitution(self) -> dict:
        return {S.L_V: self.L_V, S.rho: self.rho, S.alpha: self.alpha,
                S.beta: self.beta, S.omega: self.omega}


def smaller(a: sp.Expr, b: sp.Expr) -> sp.Expr:
    """``min(a, b)``, decided symbolically when SymPy can prove an order, else ``Min``.

    Also tries submultiplicativity: ``a <= coarsen(a)``, so ``coarsen(a) <= b`` proves ``a <= b``.
    """
    for first, second in ((a, b), (b, a)):
        for candidate in (first, coarsen(first)):
            if sp.expand(candidate - second).is_nonpositive:
                return first
    return sp.Min(a, b)


_CACHE: dict = {}

_SUP_HESS = Described(r"\sup_{x, y} \left\| \partial_y \nabla_x s(x, y) \right\|")
_SUP_GRAD_X = Described(r"\sup_{x, y} \left\| \nabla_x s(x, y) \right\|")
_SPREAD = Described(r"\sup_{x, y, y'} \left| s(x, y) - s(x, y') \right|")


class Score:
    """A score function ``s(x, y)`` and a value map.  Abstract: subclasses are final.

    Subclasses set :attr:`name` and implement :meth:`expression` and
    :meth:`value_matrix`.
    """

    name: str = ""
    title: str = ""
    #: The score kind of :class:`~lipbound.symbolic.facts.HeadFacts` ("dot", "l2", "cosine", "custom").
    kind: str = "custom"
    tied: bool = False
    #: Whether small instances of the score can be evaluated exactly, so that the unbounded domain
    #: is searched for a witness family (:mod:`lipbound.symbolic.unbounded`).
    global_witnesses: bool = True
    #: Facts of :class:`~lipbound.symbolic.facts.HeadFacts` the score states: rotary positions, QK-norm,
    #: soft-capped logits.
    rotary: bool = False
    qk_norm: bool = False
    softcap: bool = False

    def identity(self) -> tuple:
        """What the score is, as a hashable value (its class and parameters; nested scores by theirs)."""
        return (type(self).__name__,) + tuple(sorted(
            (key, value.identity() if isinstance(value, Score) else value) for key, value in vars(self).items()))

    def witness_note(self) -> str:
        """What a witness instance of the unbounded domain fixes besides the weights (none by default)."""
        return ""

    def expression(self) -> sp.Expr:
        raise NotImplementedError

    @property
    def biased(self) -> bool:
        """Whether the query and key projections carry biases ``b_Q``, ``b_K``."""
        return True

    @property
    def values_through_A(self) -> bool:
        return False

    def value_matrix(self) -> sp.MatrixExpr:
        """V with ``v(y) = V^T y + b_V`` (shape d x d_v)."""
        return S.W_V

    def hypotheses(self) -> list[str]:
        return []

    def check(self, assumptions) -> None:
        """Raise :class:`AssumptionError` if the assumptions contradict this score's needs."""

    # The composition rule, written once -------------------------------------
    def kernel_constants(self, assumptions) -> KernelConstants:
        """Derive ``L_V, rho, alpha, beta, omega`` on the assumptions' domain(s) (cached)."""
        self.check(assumptions)
        key = (self.identity(), assumptions.domain, assumptions.query_domain, assumptions.facts)
        if key not in _CACHE:
            _CACHE[key] = self._derive_constants(assumptions)
        return _CACHE[key]

    def _derive_constants(self, assumptions) -> KernelConstants:
        record = Derivation(f"Kernel constants of the {self.title}")
        for text in self.hypotheses():
            record.hypothesis(text)
        key_ball = assumptions.domain.enclosing_ball(record)
        query_ball = key_ball if assumptions.query_domain is None else assumptions.query_domain.enclosing_ball(record)
        region = Region({S.x: (query_ball.center, query_ball.radius),
                         S.y: (key_ball.center, key_ball.radius)},
                        floors=assumptions.lower_bound)
        variables = (S.x, S.y)
        radius = key_ball.radius
        record.add(eq(Described("s(x, y)"), self.expression()), "definition of the score")
        score = drop_free_terms(self.expression(), S.y, variables, record)

        value = self.value_matrix()
        L_V = upper_norm_vec((value.T * S.y).doit(), Region({S.y: (None, 1)}))
        rho = upper_norm_vec((value.T * S.y).doit(), Region({S.y: (None, radius)}))

        grad_y = gradient(score, S.y, variables)
        beta = _tidy(upper_norm_terms(grad_y, region))
        hessian = mixed_hessian(score, S.x, S.y, variables)
        alpha = smaller(_tidy(radius * upper_norm_mat(hessian, region)),
                        _tidy(upper_norm_terms(gradient(score, S.x, variables), region)))
        spread_range, why = score_range(score, region)
        omega = smaller(_tidy(2 * radius * beta), _tidy(spread_range))
        define_names(record, L_V, rho, beta, alpha, omega)
        L_V, rho, beta, alpha, omega = (name_norms(e) for e in (L_V, rho, beta, alpha, omega))
        record.add(eq(S.L_V, L_V), "L_V is the operator norm of the linear part of v", "value-lipschitz")
        record.add(le(S.rho, rho), "rho = sup_y ||V^T (y - c)|| <= ||V|| R on the key domain",
                   "value-spread")
        record.add(eq(Described(r"\nabla_y s(x, y)"), VectorSum((t.coef, t.vec) for t in grad_y)),
                   "differentiation (chain rule)")
        record.add(le(S.beta, beta), "triangle inequality, Cauchy-Schwarz, submultiplicativity, "
                   "then the domain bounds", "norm-calculus")
        record.add(le(S.alpha, radius * _SUP_HESS),
                   "Popoviciu: a standard deviation is at most half the range; mean value theorem "
                   "over keys in a ball of radius R", "popoviciu")
        record.add(le(S.alpha, alpha), "bound on the mixed derivative (and on sup ||grad_x s||)",
                   "norm-calculus")
        record.add(le(S.omega, 2 * radius * S.beta), "mean value theorem along y -> y' inside the ball",
                   "mean-value")
        record.add(le(S.omega, omega), why, "score-range")
        return KernelConstants(L_V=L_V, rho=rho, alpha=alpha, beta=beta, omega=omega, record=record)

    def factor_alpha(self, assumptions, record: Derivation) -> sp.Expr:
        """A bound on ``std_{j ~ p}(t_j grad_x s(x, x_j) . e) / ||e||`` for any factors ``t_j`` in ``[0, 1]``
        (a soft cap multiplies each score's gradient by ``tanh'`` in ``(0, 1]``), with its steps recorded.

        The factors break the mean value route: with ``u_j = grad_x s(x, x_j) . e`` in ``[mu - r, mu + r]``,
        ``mu = grad_x s(x, c) . e`` (the full score: dropped terms no longer cancel) and
        ``r = R sup ||d_y grad_x s|| ||e||``, the products ``t_j u_j`` lie in an interval of length at most
        ``max(2 r, |mu| + r) <= 2 r + |mu|`` (Popoviciu: ``alpha <= R sup ||d_y grad_x s|| + g_c / 2``,
        ``g_c = sup_x ||grad_x s(x, c)||``); and ``|t_j u_j| <= sup ||grad_x s|| ||e||``.
        """
        key_ball = assumptions.domain.enclosing_ball()
        query_ball = key_ball if assumptions.query_domain is None else assumptions.query_domain.enclosing_ball()
        variables = (S.x, S.y)
        region = Region({S.x: (query_ball.center, query_ball.radius), S.y: (key_ball.center, key_ball.radius)},
                        floors=assumptions.lower_bound)
        at_centre = Region({S.x: (query_ball.center, query_ball.radius), S.y: (key_ball.center, sp.Integer(0))},
                           floors=assumptions.lower_bound)
        full = gradient(self.expression(), S.x, variables)
        mean_value = key_ball.radius * upper_norm_mat(mixed_hessian(self.expression(), S.x, S.y, variables), region)
        centre = upper_norm_terms(full, at_centre)
        values = [_tidy(e) for e in (mean_value + centre / 2, upper_norm_terms(full, region))]
        define_names(record, *values)
        capped, largest = (name_norms(e) for e in values)
        record.add(le(Described(r"\operatorname{std}_{j}(t_j \nabla_x s(x, x_j) \cdot e) / \|e\|"), capped),
                   "factors t_j in [0, 1] times values in [mu - r, mu + r] lie in an interval of length at most "
                   "2 r + |mu|, mu the query gradient of the full score at the centre of the key domain (the mean "
                   "value theorem along the keys gives r)", "popoviciu")
        record.add(le(Described(r"\operatorname{std}_{j}(t_j \nabla_x s(x, x_j) \cdot e) / \|e\|"), largest),
                   "|t_j grad_x s . e| <= sup ||grad_x s|| ||e||", "norm-calculus")
        return smaller(capped, largest)


def define_names(record: Derivation, *exprs: sp.Expr) -> None:
    """Record ``A := W_Q W_K^T / sqrt(d_k)`` (and every other named matrix the constants will use)
    as notation, before the first step that writes its norm."""
    for name, value in named_definitions(*exprs):
        record.add(Defines(name, value), "notation for the matrix of the bilinear part of the score")


def _tidy(expr: sp.Expr) -> sp.Expr:
    """A cheap normal form: expand, then pull common factors out (no full ``simplify``)."""
    return sp.factor_terms(sp.expand(expr))


def affine_projection(projection: sp.MatrixExpr, bias: sp.MatrixSymbol, biases: bool) -> sp.MatrixExpr:
    """``projection + bias`` (or the projection alone without biases), simplified."""
    return (projection + bias).doit() if biases else projection.doit()


@final
class DotProduct(Score):
    r"""Dot-product attention with biases: ``s = (W_Q^T x + b_Q) . (W_K^T y + b_K) / sqrt(d_k)``.

    Vaswani et al. (2017).  Not Lipschitz on an unbounded domain (Kim et al. 2021, Thm 3.1).
    """

    name = "dot-product"
    title = "dot-product score"
    kind = "dot"

    def __init__(self, biases: bool = True):
        self.biases = biases

    @property
    def biased(self) -> bool:
        return self.biases

    def expression(self) -> sp.Expr:
        query = affine_projection(S.W_Q.T * S.x, S.b_Q, self.biases)
        key = affine_projection(S.W_K.T * S.y, S.b_K, self.biases)
        return Inner(query, key) / sp.sqrt(S.d_k)


@final
class L2Distance(Score):
    r"""L2 attention: ``s = -||(W_Q^T x + b_Q) - (W_K^T y + b_K)||^2 / sqrt(d_k)`` (Kim,
    Papamakarios, Mnih 2021; their heads have no biases).

    With ``tied=True`` (``W_Q = W_K = W``), no biases and Kim et al.'s value map
    ``v(y) = W_V^T A y``, ``A = W W^T / sqrt(d_k)``, it is Lipschitz on all of R^d
    (:mod:`lipbound.symbolic.unbounded`).  Untied, it is not.
    """

    name = "l2"
    title = "L2 distance score"
    kind = "l2"

    def __init__(self, tied: bool = True, kim_values: bool | None = None, biases: bool = False):
        self.tied = tied
        self.kim_values = tied if kim_values is None else kim_values
        self.biases = biases

    @property
    def biased(self) -> bool:
        return self.biases

    @property
    def values_through_A(self) -> bool:
        return self.kim_values

    @property
    def query_weight(self):
        return S.W if self.tied else S.W_Q

    @property
    def key_weight(self):
        return S.W if self.tied else S.W_K

    def expression(self) -> sp.Expr:
        query = affine_projection(self.query_weight.T * S.x, S.b_Q, self.biases)
        key = affine_projection(self.key_weight.T * S.y, S.b_K, self.biases)
        return -Norm((query - key).doit()) ** 2 / sp.sqrt(S.d_k)

    def value_matrix(self) -> sp.MatrixExpr:
        if self.kim_values:
            return (self.query_weight * self.query_weight.T * S.W_V / sp.sqrt(S.d_k)).doit()
        return S.W_V

    def hypotheses(self) -> list[str]:
        out = []
        if self.tied:
            out.append("tied query and key weights W_Q = W_K = W")
        if self.kim_values:
            out.append("values through A: v(y) = W_V^T A y, A = W W^T / sqrt(d_k)")
        if self.biases:
            out.append("query and key biases b_Q, b_K inside the distance")
        return out

    def check(self, assumptions) -> None:
        if self.tied and assumptions.tied is False:
            raise AssumptionError("tied", "W_Q = W_K for the tied L2 score", "tied=False",
                                  "use L2Distance(tied=False) or tie the weights")


@final
class ScaledCosine(Score):
    r"""Scaled cosine attention (LipsFormer-style): ``s = tau <q, k> / (N(q) N(k))``,
    ``q = W_Q^T x (+ b_Q)``, ``k = W_K^T y (+ b_K)``, ``N(u) = sqrt(||u||^2 + eps)``.

    The epsilon keeps the score smooth at ``q = 0``; ``|s| <= tau``.
    """

    name = "cosine"
    title = "scaled cosine score"
    kind = "cosine"

    def __init__(self, biases: bool = False):
        self.biases = biases

    @property
    def biased(self) -> bool:
        return self.biases

    def expression(self) -> sp.Expr:
        query = affine_projection(S.W_Q.T * S.x, S.b_Q, self.biases)
        key = affine_projection(S.W_K.T * S.y, S.b_K, self.biases)
        return tau * Inner(query, key) / (SoftNorm(query, epsilon) * SoftNorm(key, epsilon))

    def hypotheses(self) -> list[str]:
        return ["temperature tau > 0 and regulariser epsilon > 0"]


@final
class CustomScore(Score):
    """A user-defined score: any SymPy expression in ``Inner``/``Norm``/``SoftNorm`` of
    affine projections of the query token ``x`` and key token ``y``.

    Parameters
    ----------
    expression : sympy expression
        The score ``s(x, y)``, e.g. ``tau * Inner(W_Q.T*x, W_K.T*y) / (Norm(W_Q.T*x) * Norm(W_K.T*y))``.
    value : sympy MatrixExpr, optional
        V in ``v(y) = V^T y + b_V`` (default ``W_V``).
    name : str
        A short name for tables and LaTeX.
    """

    title = "user-defined score"

    def __init__(self, expression: sp.Expr, value: sp.MatrixExpr | None = None, name: str = "custom"):
        expression = sp.sympify(expression)
        if not expression.atoms(Inner, Norm, SoftNorm):
            raise AssumptionError("expression", "a score built from Inner/Norm/SoftNorm of projections of x and y",
                                  str(expression), "write e.g. Inner(W_Q.T*x, W_K.T*y)/sqrt(d_k)")
        self._expression = expression
        self._value = S.W_V if value is None else value
        self.name = name

    def expression(self) -> sp.Expr:
        return self._expression

    def value_matrix(self) -> sp.MatrixExpr:
        return self._value
