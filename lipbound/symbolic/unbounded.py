"""The unbounded domain: a global theorem for tied L2 attention, witness families otherwise.

* Tied L2 attention with values through ``A`` (Kim, Papamakarios, Mnih 2021) is
  Lipschitz on all of ``R^{n x d}``.  Our derivation (:func:`l2_global_theorem`)
  factors ``f = C o g o P`` through ``z = W^T x / d_k^{1/4}``, where g is L2
  attention with identity weights, and bounds the moments of ``||z_i - z_j||``
  under the attention weights by a Lambert-W level (lemma ``lambert-moment``).
* Every other variant is tested for a *witness family*: a curve ``X_t`` in a
  one-dimensional instance along which an entry of the exact Jacobian (SymPy)
  tends to infinity.  Dot-product attention gives Kim et al.'s
  ``X_t = (0, t)``, ``df_1/dx_1 = 1/2 + t^2/4``.
"""

from __future__ import annotations

import sympy as sp

from ..errors import AssumptionError
from . import symbols as S
from . import theorems as T
from .assumptions import Assumptions, Mixed2Inf, Mixed21, VecInf
from .bound import Bound, NotLipschitz, Result
from .calculus import Inner, Norm, SoftNorm
from .record import Derivation, Described, eq, le
from .scores import DotProduct, L2Distance

__all__ = ["l2_global_theorem", "find_witness_family", "derive_unbounded", "scalar_instance"]

_LIP = Described(r"\operatorname{Lip}(f)")
_W0E = sp.LambertW(sp.exp(-1))  # W_0(1/e) = sup_t t e^{-t} / (1 + e^{-t})


def l2_global_theorem(norm, n=S.n, d=S.d) -> T.Theorem:
    """Tied L2 self-attention on ``R^{n x d}`` with Kim et al.'s values ``v(y) = W_V^T A y``."""
    ell = S.lambert_level(n)
    scale = S.MatrixNormSymbol(S.matrix_key(S.W.T * S.W_V)) * S.MatrixNormSymbol("W") / sp.sqrt(S.d_k)
    per_token = Mixed2Inf() if isinstance(norm, VecInf) else norm
    proof = Derivation("Tied L2 self-attention on the unbounded domain")
    proof.hypothesis("tied weights W_Q = W_K = W, every token attends to itself")
    proof.hypothesis("values through A: v(y) = W_V^T A y, A = W W^T / sqrt(d_k)")
    proof.add(Described(r"f = C \circ g \circ P,\ z_j = W^\top x_j / d_k^{1/4},\ "
                        r"g_i(Z) = \textstyle\sum_j p_{ij} z_j,\ p_{ij} \propto e^{-\|z_i - z_j\|^2}"),
              "factor through the projection, with C = W_V^T W / d_k^{1/4}; submultiplicativity",
              "submultiplicative")
    proof.add(Described(r"Dg_i[H] = \textstyle\sum_j p_{ij} h_j + 2\Sigma_i h_i - "
                        r"2\operatorname{Cov}_{j \sim p_i}(w_{ij} \cdot h_j, w_{ij}),\ w_{ij} = z_j - z_i"),
              "differentiate; Sigma_i is the covariance of w_ij under p_i", "softmax-derivative")
    proof.add(le(Described(r"\mathbb{E}_{j \sim p_i} \|w_{ij}\|^2"), ell),
              "the query attends to itself with score 0", "lambert-moment")
    proof.add(le(Described(r"\|\Sigma_i\|_2"), ell), "Sigma_i <= E[w w^T], whose norm is at most E||w||^2")
    proof.add(le(Described(r"\max_j \textstyle\sum_i p_{ij}"), (n + 1) / 2), "p_ij <= p_ii for j != i",
              "l2-self-weight")
    proof.add(le(Described(r"\max_j \textstyle\sum_i p_{ij}\|w_{ij}\|^2"), (n - 1) * _W0E),
              "p_ij t <= t e^{-t} / (1 + e^{-t}) <= W_0(1/e)", "l2-self-weight")
    if isinstance(per_token, Mixed21):
        core = (n + 1) / 2 + 2 * ell + 2 * (n - 1) * _W0E + sp.sqrt(2 / sp.E) * (n - 1) * sp.sqrt(ell)
        proof.add(le(Described(r"\max_j \textstyle\sum_i p_{ij}\|w_{ij}\|"), (n - 1) / sp.sqrt(2 * sp.E)),
                  "sqrt(t) e^{-t} <= 1/sqrt(2e)")
        proof.add(le(Described(r"\operatorname{Lip}_{2,1}(g)"), core),
                  "mean absolute deviation form of the covariance; column sums", "mean-abs-cov")
    elif isinstance(per_token, Mixed2Inf):
        core = 1 + 4 * ell
        proof.add(le(Described(r"\operatorname{Lip}_{2,\infty}(g)"), core),
                  "Jensen and Cauchy-Schwarz, per token", "cauchy-schwarz-cov")
    else:
        core = sp.sqrt((n + 1) / 2) + 2 * ell + 2 * sp.sqrt(ell * (n - 1) * _W0E)
        proof.add(le(Described(r"\operatorname{Lip}_{F}(g)"), core),
                  "Jensen, covariance bound and Minkowski over tokens", "minkowski")
    statement = scale * core
    proof.add(le(_LIP, statement), "compose", "mean-value")
    theorem = T.Theorem(f"l2-global-{T._suffix(per_token)}", "Tied L2 self-attention, unbounded domain",
                        statement, proof)
    return T.vector_infinity(theorem, d) if isinstance(norm, VecInf) else theorem


# Witness families -----------------------------------------------------------
def scalar_instance(expr: sp.Expr, values: dict, dim: int = 1) -> sp.Expr:
    """Evaluate a score in dimension ``dim`` (d = d_k = d_v): matrix symbols become the
    matrices (or numbers, times the identity) in ``values`` by name; weights default to the
    identity, biases and centres to 0, ``tau`` and ``epsilon`` to 1."""

    def matrix_value(symbol: sp.MatrixSymbol):
        value = values.get(symbol.name)
        if value is None:
            value = 0 if symbol.name.startswith(("b_", "c")) else 1
        if isinstance(value, (sp.MatrixBase, list)):
            return sp.ImmutableMatrix(value)
        rows, cols = symbol.shape
        if cols == 1:
            return sp.ImmutableMatrix.zeros(rows, 1) + sp.ImmutableMatrix([value] * rows) \
                if value != 0 else sp.ImmutableMatrix.zeros(rows, 1)
        return value * sp.ImmutableMatrix.eye(rows)

    def vec(matrix_expr) -> sp.ImmutableMatrix:
        matrix_expr = matrix_expr.subs({S.d: dim, S.d_k: dim, S.d_v: dim})
        replacements = {s: matrix_value(s) for s in matrix_expr.atoms(sp.MatrixSymbol)}
        return sp.ImmutableMatrix(matrix_expr.xreplace(replacements).doit().as_explicit())

    def convert(node):
        if isinstance(node, Inner):
            return (vec(node.args[0]).T * vec(node.args[1]))[0, 0]
        if isinstance(node, Norm):
            return sp.sqrt(sum(e ** 2 for e in vec(node.args[0])))
        if isinstance(node, SoftNorm):
            return sp.sqrt(sum(e ** 2 for e in vec(node.args[0])) + convert(node.args[1]))
        if isinstance(node, sp.Symbol):
            if node.name in values and not isinstance(values[node.name], (sp.MatrixBase, list)):
                return sp.sympify(values[node.name])
            return sp.Integer(dim) if node in (S.d_k, S.d, S.d_v) else \
                (sp.Integer(1) if node.name in ("tau", "epsilon") else node)
        if not node.args:
            return node
        return node.func(*[convert(a) for a in node.args])

    return convert(sp.sympify(expr))


_t = S.t
#: candidate curves: (dimension, query or None, key tokens)
_FAMILIES = (
    (1, None, (0, _t)), (1, None, (_t, 0)), (1, None, (_t, -_t)), (1, None, (1, _t)),
    (1, 0, (0, _t)), (1, 0, (_t, -_t)),
    (2, (_t, 0), ((0, _t), (0, -_t))), (2, None, ((0, 0), (_t, _t))),
)


def find_witness_family(score, argument: str = "self", causal: bool = False, values: dict | None = None,
                        offset_bias: bool = False):
    """Search small curves ``X_t`` (one or two dimensions, two key tokens) along which an entry
    of the exact Jacobian of attention tends to infinity.

    ``argument`` is ``"self"`` for self-attention or ``"queries"``/``"context"``/``"joint"``
    for cross-attention with one query.  ``offset_bias``: a position bias ``delta`` (any real) is
    added to the score of the two tokens' off-diagonal pair (self-attention).  Returns
    ``(family, entry, instance)`` or None.
    """
    values = dict(values or {})
    if isinstance(score, L2Distance) and not score.tied:
        values.setdefault("W_K", 2)
    # the search sees the score only through its expression and its values: one search per such key
    # (every norm of a variant asks the same question)
    key = (sp.srepr(score.expression()), sp.srepr(score.value_matrix()), argument, bool(causal), offset_bias,
           tuple(sorted((name, sp.srepr(sp.sympify(value))) for name, value in values.items())))
    if key not in _SEARCHED:
        _SEARCHED[key] = _search_families(score, values, argument, causal, offset_bias)
    return _SEARCHED[key]


_SEARCHED: dict = {}


#: The position bias of the off-diagonal pair in a witness instance (any real number).
_DELTA = sp.Symbol("delta", real=True)


def _search_families(score, values, argument, causal, offset_bias=False):
    cross = argument != "self"
    for dim, query_point, key_points in _FAMILIES:
        if (query_point is None) == cross:
            continue
        found = _try_family(score, values, dim, argument, causal, query_point, key_points, offset_bias)
        if found is not None:
            return found
    return None


def _try_family(score, values, dim, argument, causal, query_point, key_points, offset_bias=False):
    def coordinates(name):
        return sp.Matrix(sp.symbols(f"{name}_1:{dim + 1}", real=True))

    keys = [coordinates(f"x{j}") for j in range(1, len(key_points) + 1)]
    query = coordinates("q")
    X, Y = sp.MatrixSymbol("X_", dim, 1), sp.MatrixSymbol("Y_", dim, 1)
    expr = score.expression().xreplace({S.x: X, S.y: Y})
    value_expr = (score.value_matrix().T * S.y).xreplace({S.y: Y})

    def s(a, b):
        return scalar_instance(expr, {**values, "X_": a, "Y_": b}, dim)

    def v(b):
        return sp.Matrix([scalar_instance(Inner(value_expr, _unit(dim, k)), {**values, "Y_": b}, dim)
                          for k in range(dim)])

    queries = [query] if query_point is not None else keys
    outputs = []
    for i, q in enumerate(queries):
        visible = keys[: i + 1] if causal and query_point is None else keys
        weights = [sp.exp(s(q, key) + (_DELTA if offset_bias and k != i else 0)) for k, key in enumerate(visible)]
        output = sum((w * v(key) for w, key in zip(weights, visible)), sp.zeros(dim, 1)) / sum(weights)
        outputs.extend(list(output))
    if argument == "queries":
        variables = list(query)
    elif argument == "context" or query_point is None:
        variables = [c for key in keys for c in key]
    else:
        variables = list(query) + [c for key in keys for c in key]
    point = {}
    for key, value in zip(keys, key_points):
        point.update(dict(zip(key, value if dim > 1 else (value,))))
    if query_point is not None:
        point.update(dict(zip(query, query_point if dim > 1 else (query_point,))))
    jacobian = sp.Matrix(outputs).jacobian(sp.Matrix(variables))
    for entry in jacobian:
        along = sp.simplify(entry.xreplace(point))
        if not along.has(S.t):
            continue
        try:
            limit = sp.limit(along, S.t, sp.oo)
        except (NotImplementedError, ValueError):
            continue
        if limit in (sp.oo, -sp.oo):
            instance = ", ".join(f"{k} = {val}" for k, val in sorted(values.items())) or "identity weights"
            rows = ([query_point] if query_point is not None else []) + list(key_points)
            family = sp.ImmutableMatrix([list(r) if dim > 1 else [r] for r in rows])   # shared by the cache
            return family, along, f"d = d_k = d_v = {dim}, no biases, {instance}" + \
                ("; first row is the query" if query_point is not None else "") + \
                ("; the off-diagonal pair has position bias delta, the diagonal 0" if offset_bias else "") + \
                (f"; {score.witness_note()}" if score.witness_note() else "")
    return None


def _unit(dim: int, k: int) -> sp.ImmutableMatrix:
    return sp.ImmutableMatrix([[1 if i == k else 0] for i in range(dim)])


def _hidden_direction_family():
    """Tied L2 scores with plain values ``v(y) = y``: a direction W^T cannot see carries the value.

    d = 2, W = e_1 (d_k = 1): x_1 = (0, 0), x_2 = (1, t).  The weight p_12 = e^{-1} / (1 + e^{-1})
    does not depend on t, but the value's second coordinate is t, so
    ``d(f_1)_2 / d(x_1)_1 = 2 p_12 (1 - p_12) t``.
    """
    a, b = sp.symbols("a b", real=True)  # first coordinates of x_1 and x_2
    weight = sp.exp(-(a - b) ** 2) / (1 + sp.exp(-(a - b) ** 2))
    second_coordinate = weight * S.t  # (f_1)_2 = p_11 * 0 + p_12 * t
    entry = sp.simplify(sp.diff(second_coordinate, a).xreplace({a: 0, b: 1}))
    family = sp.Matrix([[0, 0], [1, S.t]])
    return family, entry, "d = 2, d_k = 1, W = e_1, values v(y) = y (not through A)"


def derive_unbounded(variant, assumptions: Assumptions, key: str) -> Result:
    """Global bound for tied L2 attention with Kim values; a witness family otherwise."""
    facts, score = variant.head_facts, variant.score
    if not score.global_witnesses:
        raise AssumptionError(
            "domain", f"a bounded domain for the {score.title} (no theorem of lipbound applies on R^d)",
            "Unbounded", "state Ball(radius=R) or LayerNormImage(); lipbound claims neither a bound nor "
            "non-Lipschitzness here")
    if facts.role == "self" and isinstance(score, L2Distance) and score.tied and score.kim_values \
            and not facts.causal and not score.biases:
        assumptions.require("self_attends", "the global L2 theorem")
        if assumptions.tied is False:
            raise AssumptionError("tied", "W_Q = W_K (the global L2 theorem needs tied weights)",
                                  "tied=False", "tie the query and key weights, or state a bounded domain")
        theorem = l2_global_theorem(assumptions.norm, assumptions.n, assumptions.d)
        for wrapper in reversed(variant.wrappers):
            if wrapper == "multi-head":
                per_token = Mixed2Inf() if isinstance(assumptions.norm, VecInf) else assumptions.norm
                theorem = T.multi_head(theorem, per_token, assumptions.H)
            else:
                theorem = T.residual(theorem)
        return Bound(variant=key, norm=assumptions.norm.key, domain="unbounded", expr=theorem.statement,
                     generic=theorem.statement, constants={},
                     assumptions=tuple(assumptions.describe() + theorem.hypotheses), record=theorem.proof,
                     theorem=theorem.id, facts=variant.head_facts, stated=assumptions)
    if isinstance(score, L2Distance) and score.tied and not score.kim_values:
        found = _hidden_direction_family()
    else:
        argument = "self" if facts.role == "self" else facts.role.split("-", 1)[1]
        found = find_witness_family(score, argument, causal=facts.causal, offset_bias=facts.position_bias != "none")
    if found is None:
        raise AssumptionError(
            "domain", f"a bounded domain for the {score.title} (no global theorem applies)", "Unbounded",
            "state Ball(radius=R) or LayerNormImage(); no witness family was found either, so "
            "lipbound claims neither a bound nor non-Lipschitzness")
    family, entry, instance = found
    if facts.window:  # two neighbouring tokens see each other; with w = 1 each attends to itself alone: f is affine
        instance += "; a window of width w >= 2"
    record = Derivation(f"{variant.title} is not Lipschitz on the unbounded domain")
    record.hypothesis(f"instance: {instance}")
    record.add(eq(Described("X_t"), family), "a curve in the instance")
    record.add(eq(Described(r"\partial f / \partial x \,(X_t)"), entry),
               "an entry of the exact Jacobian (SymPy differentiation)", "softmax-derivative")
    record.add(eq(sp.Limit(entry, S.t, sp.oo), sp.limit(entry, S.t, sp.oo)), "limit as t -> infinity",
               "witness-family")
    if isinstance(score, DotProduct) and facts.role == "self" and not facts.causal and not facts.window \
            and facts.position_bias == "none":
        gamma = S.MatrixNormSymbol("gamma_{A,V}")
        general = S.t ** 2 * (assumptions.n - 1) / assumptions.n ** 2 * gamma \
            - S.MatrixNormSymbol("W_V") / assumptions.n
        record.add(le(general, Described(r"\|Df(X_t)\|")),
                   "general weights without query bias: x_1 = 0, x_2 = ... = x_n = t u with u maximising "
                   "gamma_{A,V} = max_u ||A u|| ||W_V^T u||; then p_1j = 1/n and the covariance term is "
                   "(n - 1) t^2 / n^2 (e^T A u) W_V^T u", "softmax-derivative")
    return NotLipschitz(variant=key, norm=assumptions.norm.key, domain="unbounded", family=family,
                        growth=entry, instance=instance,
                        assumptions=tuple(assumptions.describe() + record.hypotheses), record=record,
                        theorem=f"not-lipschitz-{score.name}", stated=assumptions)
