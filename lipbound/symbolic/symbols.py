"""Symbols of the symbolic layer: sizes, radii, weight matrices and their norms.

Every quantity a bound may contain is a positive SymPy symbol of a dedicated
class, so that the LaTeX printer can write it as a mathematician would
(``\\|W_V\\|_2``, ``\\kappa``, ``W_0``) and the numeric layer can recognise what
to compute for it.  Classes are final; their constructors take only ``name``
and SymPy assumptions, so ``srepr`` output round-trips through ``eval``.
"""

from __future__ import annotations

from typing import Final, final

import sympy as sp

__all__ = [
    "n", "m", "d", "d_k", "d_v", "H", "R", "t",
    "SizeSymbol", "RadiusSymbol", "MatrixNormSymbol", "InfNormSymbol", "VectorNormSymbol",
    "KernelConstant", "LowerBoundSymbol",
    "L_V", "rho", "alpha", "beta", "omega",
    "matrix_norm", "vector_norm", "canonical_matrix", "matrix_key",
    "weight", "bias", "token",
    "W_Q", "W_K", "W_V", "W_O", "W", "b_Q", "b_K", "b_V", "x", "y", "c",
    "NAMED_MATRICES", "NAMED_DEFINITIONS", "name_matrix",
    "kappa", "causal_kappa", "lambert_level", "expand_special",
    "BlockParameter", "d_ff", "eps", "sigma_min", "ell_phi", "gamma_max", "W_1", "W_2", "D_gamma", "Pi",
    "WeightQuantity", "w", "G", "tau", "epsilon", "a_rot", "g_Q", "g_K", "s_c", "R_Delta", "gamma_q", "gamma_k",
    "gamma_qk", "gamma_post", "D_q", "D_k", "c_cap", "m_A", "Delta_b", "lambda_max", "W_gate", "W_up", "W_down",
    "Gamma_up", "Gamma_gate", "mu_up", "mu_gate", "r",
]


@final
class SizeSymbol(sp.Symbol):
    """A positive integer size: n tokens, m queries, d features, d_k, d_v, H heads."""

    def __new__(cls, name: str, **assumptions):
        assumptions.setdefault("positive", True)
        assumptions.setdefault("integer", True)
        return super().__new__(cls, name, **assumptions)


@final
class RadiusSymbol(sp.Symbol):
    """A positive real scale: a radius R, a temperature tau, a LayerNorm gain."""

    def __new__(cls, name: str, **assumptions):
        assumptions.setdefault("positive", True)
        return super().__new__(cls, name, **assumptions)


@final
class MatrixNormSymbol(sp.Symbol):
    """The spectral norm ``||M||_2`` of a constant matrix expression M.

    The name is the canonical string of M (see :func:`canonical_matrix`); the
    expression itself is recovered from :data:`NAMED_MATRICES` or by parsing.
    """

    def __new__(cls, name: str, **assumptions):
        assumptions.setdefault("positive", True)
        return super().__new__(cls, name, **assumptions)


@final
class InfNormSymbol(sp.Symbol):
    """The l_inf operator norm ``||M||_inf`` (largest absolute row sum) of a matrix named by
    its string, e.g. ``InfNormSymbol("W_Q.T")``.  Used by published l_inf claims."""

    def __new__(cls, name: str, **assumptions):
        assumptions.setdefault("positive", True)
        return super().__new__(cls, name, **assumptions)


@final
class VectorNormSymbol(sp.Symbol):
    """The Euclidean norm ``||u||_2`` of a constant vector expression u (a bias, a centre)."""

    def __new__(cls, name: str, **assumptions):
        assumptions.setdefault("nonnegative", True)
        return super().__new__(cls, name, **assumptions)


@final
class LowerBoundSymbol(sp.Symbol):
    """A user-stated positive lower bound, e.g. ``inf_x ||W_Q^T x|| >= m_Q``."""

    def __new__(cls, name: str, **assumptions):
        assumptions.setdefault("positive", True)
        return super().__new__(cls, name, **assumptions)


@final
class KernelConstant(sp.Symbol):
    """A kernel constant: L_V, rho, alpha, beta, omega (docs/mathematics.md, section 2)."""

    def __new__(cls, name: str, **assumptions):
        assumptions.setdefault("nonnegative", True)
        return super().__new__(cls, name, **assumptions)


# Sizes and scales ---------------------------------------------------------
n: Final = SizeSymbol("n")
m: Final = SizeSymbol("m")
d: Final = SizeSymbol("d")
d_k: Final = SizeSymbol("d_k")
d_v: Final = SizeSymbol("d_v")
H: Final = SizeSymbol("H")
R: Final = RadiusSymbol("R")
t: Final = sp.Symbol("t", positive=True)

# Kernel constants ---------------------------------------------------------
L_V: Final = KernelConstant("L_V")
rho: Final = KernelConstant("rho")
alpha: Final = KernelConstant("alpha")
beta: Final = KernelConstant("beta")
omega: Final = KernelConstant("omega")


# Matrices and vectors -----------------------------------------------------
def weight(name: str, rows=d, cols=d_k) -> sp.MatrixSymbol:
    """A weight matrix as a SymPy ``MatrixSymbol`` of shape (rows, cols)."""
    return sp.MatrixSymbol(name, rows, cols)


def bias(name: str, rows=d_k) -> sp.MatrixSymbol:
    """A bias (or centre) column vector of shape (rows, 1)."""
    return sp.MatrixSymbol(name, rows, 1)


def token(name: str, rows=d) -> sp.MatrixSymbol:
    """A token variable (query ``x`` or key ``y``), a column vector in R^rows."""
    return sp.MatrixSymbol(name, rows, 1)


W_Q: Final = weight("W_Q")
W_K: Final = weight("W_K")
W_V: Final = weight("W_V", d, d_v)
W_O: Final = weight("W_O", d_v, d)
W: Final = weight("W")
b_Q: Final = bias("b_Q")
b_K: Final = bias("b_K")
b_V: Final = bias("b_V", d_v)
x: Final = token("x")
y: Final = token("y")
c: Final = token("c")  # the centre of a domain (the LayerNorm bias)

#: Named matrices, ``matrix_key(M) -> (name, scalar)``: ``scalar * ||M||`` prints as
#: ``||name||``.  ``A = W_Q W_K^T / sqrt(d_k)`` (and ``W W^T / sqrt(d_k)`` when tied).
NAMED_MATRICES: dict[str, tuple[str, sp.Expr]] = {}
#: ``matrix_key(M) -> scalar * M`` as it was named (``W_Q W_K^T / sqrt(d_k)``, not the transpose that
#: ``canonical_matrix`` may pick): the definition a proof states before it uses the name.
NAMED_DEFINITIONS: dict[str, sp.MatrixExpr] = {}


def name_matrix(name: str, expression: sp.MatrixExpr, scalar: sp.Expr = sp.S.One) -> None:
    """Register ``name := scalar * expression`` so that ``scalar ||expression||`` prints as ``||name||``."""
    NAMED_MATRICES[matrix_key(expression)] = (name, sp.sympify(scalar))
    NAMED_DEFINITIONS[matrix_key(expression)] = sp.sympify(scalar) * expression


def canonical_matrix(expression: sp.MatrixExpr) -> sp.MatrixExpr:
    """Pick one of M, M^T (they have the same spectral norm) by a stable order."""
    expression = sp.MatMul(expression).doit() if isinstance(expression, sp.MatMul) else expression
    transposed = expression.T.doit()
    return min(expression, transposed, key=lambda e: (sp.count_ops(e), str(e)))


def matrix_key(expression: sp.MatrixExpr) -> str:
    """Canonical string of a constant matrix, the name of its norm symbol."""
    return str(canonical_matrix(expression))


#: Norm symbol name -> the constant matrix or vector expression it is the norm of.
NORM_OF: dict[str, sp.MatrixExpr] = {}


def matrix_norm(expression: sp.MatrixExpr) -> MatrixNormSymbol:
    """``||expression||_2`` as a positive symbol (scalar factors must be pulled out first)."""
    canonical = canonical_matrix(expression)
    NORM_OF.setdefault(str(canonical), canonical)
    return MatrixNormSymbol(str(canonical))


def vector_norm(expression: sp.MatrixExpr) -> VectorNormSymbol:
    """``||expression||_2`` of a constant vector as a non-negative symbol."""
    expression = sp.MatAdd(expression).doit()
    NORM_OF.setdefault(str(expression), expression)
    return VectorNormSymbol(str(expression))


for _matrix in (W_Q, W_K, W_V, W_O, W):
    matrix_norm(_matrix)


# Normalisation and feed-forward blocks (docs/mathematics.md, section 11) ----------------------
@final
class BlockParameter(sp.Symbol):
    """A positive scalar of a normalisation or feed-forward block: the normalisation epsilon
    ``eps``, the variance floor ``sigma_min``, the activation's largest slope ``ell_phi``."""

    def __new__(cls, name: str, **assumptions):
        assumptions.setdefault("positive", True)
        return super().__new__(cls, name, **assumptions)


d_ff: Final = SizeSymbol("d_ff")
eps: Final = BlockParameter("eps")              # LN(x) = gamma * (x - mean x) / sqrt(var x + eps) + beta
sigma_min: Final = BlockParameter("sigma_min")  # every token's variance is at least sigma_min^2
ell_phi: Final = BlockParameter("ell_phi")      # sup_t |phi'(t)| of the activation
gamma_max: Final = RadiusSymbol("gamma_max")    # ||gamma||_inf of a normalisation's gain
W_1: Final = weight("W_1", d, d_ff)             # f(x) = W_2^T phi(W_1^T x + b_1) + b_2
W_2: Final = weight("W_2", d_ff, d)
D_gamma: Final = weight("D_gamma", d, d)        # diag(gamma)
Pi: Final = weight("Pi", d, d)                  # the centring projection I - 1 1^T / d
for _matrix in (W_1, W_2, D_gamma * Pi):
    matrix_norm(_matrix)


# Positions, modern heads and gated blocks (docs/mathematics.md, section 13) ----------------------
@final
class WeightQuantity(sp.Symbol):
    """A non-negative quantity of the weights (and of the domain's centre) that is not a single norm: a
    maximum over the relative offsets of rotary attention, over the neurons of a gated block, the spread of
    position biases.  Its definition is in docs/symbols.md (and the legend); the numeric layer evaluates
    it from that definition."""

    def __new__(cls, name: str, **assumptions):
        assumptions.setdefault("nonnegative", True)
        return super().__new__(cls, name, **assumptions)


w: Final = SizeSymbol("w")          # sliding window: a query attends to keys fewer than w positions away
G: Final = SizeSymbol("G")          # key/value groups of grouped-query attention (H query heads)
tau: Final = RadiusSymbol("tau")    # the scale (temperature) of a score
epsilon: Final = RadiusSymbol("epsilon")  # the regulariser of a normalised score (cosine, QK-norm)
#: Rotary attention, A_Delta = W_Q R_Delta W_K^T / sqrt(d_k) over the offsets Delta that occur.
a_rot: Final = WeightQuantity("a")        # max_Delta ||A_Delta||
g_Q: Final = WeightQuantity("g_Q")        # max_Delta ||W_K R_Delta^T (W_Q^T c_Q + b_Q)|| / sqrt(d_k)
g_K: Final = WeightQuantity("g_K")        # max_Delta ||W_Q R_Delta (W_K^T c + b_K)|| / sqrt(d_k)
s_c: Final = WeightQuantity("s_c")        # max_Delta |(W_Q^T c_Q + b_Q)^T R_Delta (W_K^T c + b_K)| / sqrt(d_k)
R_Delta: Final = weight("R_Delta", d_k, d_k)  # the rotation between a query and a key Delta positions apart
#: QK-norm: largest gains of the query and key normalisations, and of their product.
gamma_q: Final = RadiusSymbol("gamma_q")
gamma_k: Final = RadiusSymbol("gamma_k")
gamma_qk: Final = RadiusSymbol("gamma_qk")    # max_l |gamma_q,l gamma_k,l|
D_q: Final = weight("D_q", d_k, d_k)          # diag(gamma_q)
D_k: Final = weight("D_k", d_k, d_k)          # diag(gamma_k)
#: Logit soft-capping s -> c tanh(s / c), ALiBi slope, spread of additive position biases over a row.
c_cap: Final = RadiusSymbol("c_cap")
m_A: Final = RadiusSymbol("m_A")
Delta_b: Final = WeightQuantity("Delta_b")
#: LayerScale's largest gain, and the gain of a normalisation after the branch (sandwich norms).
lambda_max: Final = RadiusSymbol("lambda_max")
gamma_post: Final = RadiusSymbol("gamma_post")
#: Gated feed-forward blocks, f(x) = W_down^T (phi(W_gate^T x) * (W_up^T x)).
W_gate: Final = weight("W_gate", d, d_ff)
W_up: Final = weight("W_up", d, d_ff)
W_down: Final = weight("W_down", d_ff, d)
Gamma_up: Final = WeightQuantity("Gamma_up")      # ||W_down^T D_u^(1/2)|| ||D_u^(1/2) W_gate^T||,
                                                  # D_u = diag ||W_up[:, i]||
Gamma_gate: Final = WeightQuantity("Gamma_gate")  # ||W_down^T D_g^(1/2)|| ||D_g^(1/2) W_up^T||,
                                                  # D_g = diag ||W_gate[:, i]||
mu_up: Final = WeightQuantity("mu_up")            # max_i ||W_up[:, i]||
mu_gate: Final = WeightQuantity("mu_gate")        # max_i ||W_gate[:, i]||
r: Final = RadiusSymbol("r")                      # a bound on ||x|| over the domain (a gated block's theorem)
for _matrix in (W_gate, W_up, W_down):
    matrix_norm(_matrix)


name_matrix("A", W_Q * W_K.T, 1 / sp.sqrt(d_k))
name_matrix("A", W * W.T, 1 / sp.sqrt(d_k))


# Column-sum constants -----------------------------------------------------
class kappa(sp.Function):
    r"""Column-sum bound of the attention matrix, ``kappa(n, omega) = n e^omega / (e^omega + n - 1)``.

    If every score spread is at most omega, each attention weight satisfies
    ``p_ij <= e^omega / (e^omega + n - 1)``, so every column of P sums to at most
    kappa; ``1 <= kappa <= min(n, e^omega)``.  Kept as a function so that it
    prints as ``\kappa`` and can be expanded with :meth:`rewrite_closed`.
    """

    is_positive = True

    @classmethod
    def eval(cls, size, spread):
        if spread == 0 or size == 1:
            return sp.Integer(1)
        if size.is_Number and spread.is_Number:  # numbers: the closed form, so that it compares
            return size / (1 + (size - 1) * sp.exp(-spread))
        return None

    def closed_form(self) -> sp.Expr:
        """``n / (1 + (n - 1) e^{-omega})``: equal to ``n e^omega / (e^omega + n - 1)`` and
        free of overflow for the large spreads of real heads."""
        size, spread = self.args
        return size / (1 + (size - 1) * sp.exp(-spread))

    def _eval_rewrite_as_exp(self, size, spread, **kwargs):
        return size / (1 + (size - 1) * sp.exp(-spread))


class causal_kappa(sp.Function):
    r"""Column-sum bound under causal masking: ``sum_{i=1}^{n} e^omega / (e^omega + i - 1)``.

    Row i attends to i tokens, so ``p_ij <= e^omega / (e^omega + i - 1)``; the first
    column has the largest sum.  Closed form ``e^omega (psi(e^omega + n) - psi(e^omega))``
    with psi the digamma function; grows like ``e^omega log n``.
    """

    is_positive = True

    @classmethod
    def eval(cls, size, spread):
        if size == 1:
            return sp.Integer(1)
        if size.is_Integer and spread.is_Number:
            return sp.Add(*[1 / (1 + (i - 1) * sp.exp(-spread)) for i in range(1, int(size) + 1)])
        return None

    def closed_form(self) -> sp.Expr:
        """``sum_{i=1}^{n} 1 / (1 + (i - 1) e^{-omega})`` (stable for large omega); equals
        ``e^omega (psi(e^omega + n) - psi(e^omega))`` (:meth:`digamma_form`)."""
        size, spread = self.args
        i = sp.Dummy("i", integer=True, positive=True)
        return sp.Sum(1 / (1 + (i - 1) * sp.exp(-spread)), (i, 1, size))

    def digamma_form(self) -> sp.Expr:
        size, spread = self.args
        return sp.exp(spread) * (sp.digamma(sp.exp(spread) + size) - sp.digamma(sp.exp(spread)))

    def _eval_rewrite_as_exp(self, size, spread, **kwargs):
        return self.closed_form()


class lambert_level(sp.Function):
    r"""``ell(N) = W_0((N - 1)/e)``: the largest mean squared distance under L2 attention.

    For weights ``p_j ∝ exp(-t_j)`` over N tokens with one token at ``t = 0`` (the
    query attends to itself), ``sup sum_j p_j t_j = W_0((N-1)/e)``: the function
    ``phi^{-1}(N-1)`` of Kim et al. (2021), ``phi(x) = x e^{x+1}``.
    """

    is_positive = True

    @classmethod
    def eval(cls, size):
        if size.is_Number:
            return sp.LambertW((size - 1) / sp.E)
        return None

    def closed_form(self) -> sp.Expr:
        (size,) = self.args
        return sp.LambertW((size - 1) / sp.E)

    def _eval_rewrite_as_exp(self, size, **kwargs):
        return self.closed_form()


def expand_special(expr: sp.Expr) -> sp.Expr:
    """Replace ``kappa``, ``causal_kappa`` and ``lambert_level`` by their closed forms."""
    return sp.sympify(expr).replace(
        lambda e: isinstance(e, (kappa, causal_kappa, lambert_level)),
        lambda e: e.closed_form())
