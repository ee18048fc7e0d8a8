r"""Theorems lipbound proves about published claims of 2024-2026, with their derivation records.

* :func:`softmax_inf_to_one` -- for ``p = softmax(u / tau)``, the Jacobian in the logits u has
  ``||D_u softmax(u / tau)||_{inf -> 1} = theta(p) / tau`` with ``theta(p) = 1 - min_s (p^T s)^2``
  over sign vectors ``s in {-1, 1}^n``: the reading lipbound encodes of Emadi (2026)'s
  "balanced-mass factor".  ``J = diag(p) - p p^T`` is symmetric positive semidefinite, so the
  bilinear maximum ``max_{s, t} t^T J s`` over the cube's vertices is attained on the diagonal,
  where ``s^T J s = 1 - (p^T s)^2``.
* :func:`sigmoid_scalar_instance` -- sigmoid attention ``sum_j sigma(x_i x_j - log n) x_j`` on
  scalar tokens (all weights 1, no biases) at ``X = R 1``: its Jacobian is
  ``(sigma + sigma' R^2) 1 1^T + n sigma' R^2 I``, of norm ``n (sigma + 2 sigma' R^2)`` with
  ``sigma = 1 / (1 + n e^{-R^2})``: an exact lower bound on its Lipschitz constant on ``[-R, R]^n``.
* :func:`bias_free_forms` -- lipbound's sigmoid and softmax bounds for bias-free heads, divided by
  ``||W_V||``, as functions of n, ``x = ||A|| R^2`` and ``c = ||W_Q|| ||W_K|| / (sqrt(d_k) ||A||) >= 1``
  (the sigmoid theorem bounds the largest score by ``c x``).
* :func:`proximal_map` -- a proximal map of a convex potential is firmly non-expansive, hence
  1-Lipschitz whatever n and the parameters (Moreau 1965); K steps of the relaxed gradient solver
  ``Y <- Y - eta (Y + grad phi(Y) - X)`` from ``Y = X`` stay 1-Lipschitz when
  ``eta <= 2 / (2 + L_phi)``, ``L_phi >= ||hess phi||``, a condition on the parameters.
"""

from __future__ import annotations

import functools

import sympy as sp

from ..errors import AssumptionError
from ..rigorous.compiler import compile_interval
from ..rigorous.intervals import Verdict, certify_le, interval
from . import symbols as S
from . import theorems as T
from .assumptions import Assumptions, Ball
from .bound import Bound
from .claims import p_max, tau, theta
from .record import Derivation, Described, eq, le
from .registry import variant

__all__ = ["softmax_inf_to_one", "sigmoid_scalar_instance", "bias_free_forms", "bound_regions", "proximal_map",
           "score_ratio", "reduced_score", "explicit_step_slope", "prox_slope"]

#: ``x = ||A|| R^2`` (the reduced score bound) and ``c >= 1`` (the sigmoid theorem's score bound over ``x``).
reduced_score = sp.Symbol("x", positive=True)
score_ratio = sp.Symbol("c", positive=True)

_J = r"J"
_NORM = r"\|J\|_{\infty \to 1}"


@functools.cache
def softmax_inf_to_one() -> T.Theorem:
    r"""``||D_u softmax(u / tau)||_{inf -> 1} = theta(p) / tau``, ``theta(p) = 1 - min_s (p^T s)^2``,
    with the consequences ``1 - p_max^2 <= theta <= 1`` and ``||J||_{q -> q} <= theta`` for every
    ``q in [1, inf]`` (docs/claims.md, "emadi-softmax-inf1")."""
    proof = Derivation("The softmax Jacobian in the l_inf -> l_1 norm")
    proof.hypothesis("p = softmax(u / tau) has p_i > 0 and sum_i p_i = 1; tau > 0")
    proof.hypothesis("theta(p) = 1 - min_s (p^T s)^2 over the sign vectors s (every entry +1 or -1)")
    proof.add(eq(Described(r"D_u \operatorname{softmax}(u / \tau)"), Described(r"J / \tau")),
              "chain rule; J = diag(p) - p p^T is the Jacobian of the softmax at the logits u / tau")
    proof.add(eq(Described(_NORM), Described(r"\max_{s, t \in \{-1, 1\}^n} t^\top J s")),
              "||y||_1 = max_t t^T y, and the linear function x -> t^T J x is largest at a vertex of the cube",
              "cube-vertices")
    proof.add(eq(Described(r"z^\top J z"), Described(r"\textstyle\sum_i p_i z_i^2 - (p^\top z)^2")),
              "J is symmetric, and z^T J z is the variance of z under p: J is positive semidefinite",
              "semidefinite-cauchy-schwarz")
    proof.add(le(Described(r"t^\top J s"), Described(r"\max(t^\top J t, s^\top J s)")),
              "Cauchy-Schwarz for the semi-inner product of J, and a geometric mean is at most the larger of its two "
              "numbers; t = s attains it",
              "semidefinite-cauchy-schwarz")
    proof.add(eq(Described(r"s^\top J s"), 1 - Described(r"(p^\top s)^2")), "s_i^2 = 1 and sum_i p_i = 1")
    proof.add(eq(Described(r"\|D_u \operatorname{softmax}(u / \tau)\|_{\infty \to 1}"), theta / tau),
              "the largest s^T J s over sign vectors is 1 - min_s (p^T s)^2 = theta(p)")
    proof.add(le(1 - p_max ** 2, theta), "a sign vector with |p^T s| <= max_i p_i exists (greedy split); "
              "theta = 1 exactly when the weights split into two sets of mass 1/2, a partition problem",
              "number-partition")
    proof.add(le(theta, 1), "(p^T s)^2 >= 0; equality iff some s has p^T s = 0")
    proof.add(le(Described(r"\|J\|_{q \to q}"), theta),
              "||x||_inf <= ||x||_q and ||y||_q <= ||y||_1 for 1 <= q <= infinity: no induced l_q norm exceeds "
              "the l_inf -> l_1 norm (those are at most 1/2, softmax-half)", "norm-equivalence")
    return T.Theorem("softmax-inf-to-one", "The softmax Jacobian in the l_inf -> l_1 norm", theta / tau, proof)


def _sigma(t: sp.Expr) -> sp.Expr:
    return 1 / (1 + sp.exp(-t))


@functools.cache
def sigmoid_scalar_instance() -> T.Theorem:
    r"""A lower bound on the Lipschitz constant of sigmoid attention on ``[-R, R]^n``: scalar tokens,
    ``W_Q = W_K = W_V = 1``, no biases, ``b = -log n``, at ``X = R 1``: ``n (sigma + 2 sigma' R^2)``."""
    n, R = S.n, S.R
    sig = _sigma(R ** 2 - sp.log(n))
    slope = sig * (1 - sig)
    statement = n * (sig + 2 * slope * R ** 2)
    proof = Derivation("Sigmoid attention on scalar tokens, all weights 1")
    proof.hypothesis("d = 1, W_Q = W_K = W_V = 1, no biases, weights sigma(x_i x_j - log n); every |x_i| <= R")
    proof.add(eq(Described(r"\sigma_0"), _sigma(R ** 2 - sp.log(n))),
              "at X = R 1 every score is R^2, so every weight sigma_ij is sigma_0 = sigma(R^2 - log n)")
    shown = Described(r"n (\sigma_0 + 2 \sigma_0' R^2)")
    proof.add(eq(Described(r"Df(X)"), Described(r"(\sigma_0 + \sigma_0' R^2) \mathbf{1}\mathbf{1}^\top + "
                                                r"n \sigma_0' R^2 I")),
              "Df_i[E] = sum_j sigma_ij e_j + sum_j sigma_ij (1 - sigma_ij) (R e_i + R e_j) R, with sigma_ij = "
              "sigma_0 and sigma_0' = sigma_0 (1 - sigma_0)", "sigmoid-derivative")
    proof.add(eq(Described(r"\|Df(X)\|_2"), shown),
              "the symmetric matrix has the eigenvalue n (sigma_0 + 2 sigma_0' R^2) on the vector of ones and "
              "n sigma_0' R^2 on the vectors orthogonal to it")
    proof.add(le(shown, Described(r"\operatorname{Lip}(f)")),
              "the norm of the Jacobian at a point of the domain bounds the Lipschitz constant from below")
    return T.Theorem("sigmoid-scalar-instance", "Sigmoid attention on scalar tokens", statement, proof)


def _derived_expr(name: str, assumptions: Assumptions) -> sp.Expr:
    """The bound of the built-in variant ``name`` derived under ``assumptions``, which must give a bound."""
    result = variant(name).derive(assumptions, name)
    if not isinstance(result, Bound):
        raise AssumptionError(name, "a Bound", f"{type(result).__name__}: the map is not Lipschitz on its domain",
                              "this is a bug: bias_free_forms derives on the ball, where the theorems hold")
    return result.expr


@functools.cache
def bias_free_forms() -> tuple[sp.Expr, sp.Expr]:
    r"""``(sigmoid, softmax)``: lipbound's Frobenius bounds on sigmoid attention (variant ``sigmoid``
    with every bias 0) and on softmax attention (``dot-product-nobias``) on the ball of radius R,
    divided by ``||W_V||``, in n, ``x = ||A|| R^2`` and ``c`` (``||W_Q|| ||W_K|| / sqrt(d_k) = c ||A||``)::

        sigmoid = w + 2 x min(n/4, w),                w = n / (1 + n e^{-c x})
        softmax = sqrt(kappa(n, 2x)) + x (1 + sqrt(min(3n/4, kappa(n, 2x))))

    Both come from the derived bounds by substitution, so they change with the theorems."""
    on_ball = Assumptions(domain=Ball())
    sigmoid = _derived_expr("sigmoid", on_ball)
    softmax = _derived_expr("dot-product-nobias", on_ball)
    x, c = reduced_score, score_ratio
    A, V, W_Q, W_K = (S.MatrixNormSymbol(name) for name in ("A", "W_V", "W_Q", "W_K"))
    zero = {symbol: 0 for symbol in sigmoid.free_symbols if "b_" in symbol.name}
    sigmoid = sigmoid.xreplace(zero).xreplace({W_Q: c * A * sp.sqrt(S.d_k) / W_K})
    sigmoid, softmax = ((expr / V).xreplace({A: x / S.R ** 2}) for expr in (sigmoid, softmax))
    sigmoid, softmax = (sp.simplify(S.expand_special(expr)) for expr in (sigmoid, softmax))
    return sigmoid, softmax


@functools.lru_cache(maxsize=32)
def bound_regions(n: int, c=1, low: float = 1e-6, high: float = 1e3, pieces: int = 32, depth: int = 20):
    """Where lipbound's sigmoid bound lies below its softmax bound (bias-free heads, n tokens, score
    ratio c), as ``x = ||A|| R^2`` runs over ``[low, high]``: ``[(a, b, relation)]`` with relation
    ``"sigmoid < softmax"`` or ``"sigmoid > softmax"`` proved on ``[a, b]`` by interval arithmetic
    (outward rounding; pieces are bisected until decided), or ``"undecided"``: the hull of the
    pieces still undecided after ``depth`` bisections, around a crossing."""
    sigmoid, softmax = bias_free_forms()
    gap = (softmax - sigmoid).xreplace({S.n: sp.Integer(n), score_ratio: sp.nsimplify(c)})
    evaluate = compile_interval(gap, [reduced_score])
    ratio = (high / low) ** (1 / pieces)
    todo = [(low * ratio ** k, low * ratio ** (k + 1), 0) for k in range(pieces)]
    decided = []
    while todo:
        a, b, level = todo.pop(0)
        value = evaluate(interval((a, b)))
        if certify_le(0, value) is Verdict.HOLDS and certify_le(value, 0) is not Verdict.HOLDS:
            decided.append([a, b, "sigmoid < softmax", level])
        elif certify_le(value, 0) is Verdict.HOLDS and certify_le(0, value) is not Verdict.HOLDS:
            decided.append([a, b, "sigmoid > softmax", level])
        elif level >= depth:
            decided.append([a, b, "undecided", level])
        else:
            middle = (a * b) ** 0.5
            todo[:0] = [(a, middle, level + 1), (middle, b, level + 1)]
    # a crossing: the undecided pieces and the tiny decided ones between them become one piece
    for index, piece in enumerate(decided):
        if piece[2] != "undecided" and piece[3] >= depth - 2 and any(
                other[2] == "undecided" for other in decided[max(0, index - 3):index + 4]):
            piece[2] = "undecided"
    merged = [decided[0][:3]]
    for a, b, relation, _ in decided[1:]:
        if relation == merged[-1][2]:
            merged[-1][1] = b
        else:
            merged.append([a, b, relation])
    return [tuple(piece) for piece in merged]


def explicit_step_slope(q, temperature, n=2) -> sp.Expr:
    r"""The eigenvalue on ``1^perp`` of the Jacobian of the explicit step ``y -> y - grad phi(y)`` at
    ``y = 0``, ``phi(y) = tau log sum_j e^{q y_j / tau}`` on ``R^n`` (one query of weight q reading n
    scalar keys): ``1 - q^2 / (n tau)`` (the Hessian is ``(q^2 / tau)(diag(p) - p p^T)``, p uniform at
    0: eigenvalue ``q^2 / (n tau)`` on ``1^perp``, 0 on 1, where the step is the identity).  The step's
    constant is at least the modulus of this eigenvalue."""
    return 1 - q ** 2 / (n * temperature)


def prox_slope(q, temperature, n=2) -> sp.Expr:
    r"""The eigenvalue on ``1^perp`` of the Jacobian ``(I + hess phi(0))^{-1}`` of ``prox_phi`` at 0 for the
    same potential: ``1 / (1 + q^2 / (n tau))``; on 1 (a translation of every token) it is exactly 1."""
    return 1 / (1 + q ** 2 / (n * temperature))


@functools.cache
def proximal_map() -> T.Theorem:
    r"""``prox_phi`` of a convex potential is 1-Lipschitz in the Frobenius norm, whatever n and the
    parameters; the K-step relaxed gradient solver keeps the constant 1 when ``eta <= 2 / (2 + L_phi)``."""
    L_phi, eta = sp.Symbol("L_phi", positive=True), sp.Symbol("eta", positive=True)
    proof = Derivation("Proximal attention")
    proof.hypothesis("phi is a proper, closed, convex function of the n tokens X (any n, any parameters)")
    proof.hypothesis("P(X) minimises phi(Y) + ||Y - X||_F^2 / 2 over Y")
    proof.add(Described(r"X - P(X) \in \partial\varphi(P(X))"), "optimality of the strongly convex problem")
    proof.add(le(Described(r"\|P(X) - P(X')\|_F^2"), Described(r"\langle X - X', P(X) - P(X') \rangle")),
              "the subdifferential of a convex function is monotone", "proximal-firm")
    proof.add(le(Described(r"\|P(X) - P(X')\|_F"), Described(r"\|X - X'\|_F")),
              "Cauchy-Schwarz; neither n nor a parameter of phi appears", "proximal-firm")
    proof.add(eq(Described(r"D_X Y_{k+1}"), Described(r"((1 - \eta) I - \eta \nabla^2\varphi(Y_k)) D_X Y_k + \eta I")),
              "differentiate the solver's step Y_{k+1} = Y_k - eta (Y_k + grad phi(Y_k) - X), which starts at Y_0 = X "
              "with the identity as derivative")
    proof.add(le(Described(r"\|D_X Y_{k+1}\|_2"), (1 - eta) * Described(r"\|D_X Y_k\|_2") + eta),
              "the eigenvalues of the Hessian of phi lie in [0, L_phi], and eta <= 2 / (2 + L_phi)", "gradient-step")
    proof.add(le(Described(r"\|D_X Y_K\|_2"), 1), "induction from ||D_X Y_0|| = 1: the truncated solver is "
              "1-Lipschitz when its step meets a condition on L_phi, that is, on the parameters")
    proof.add(le(eta, 2 / (2 + L_phi)), "the condition; with a larger step the truncated map can stretch: for the "
              "log-sum-exp potential of weight q an explicit step y - grad phi(y) has the constant "
              "|1 - q^2 / (n tau)| at 0")
    return T.Theorem("proximal-attention", "Proximal attention", sp.Integer(1), proof)
