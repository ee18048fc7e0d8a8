"""Published claims about the regularity of attention, encoded with their provenance.

lipbound treats a published bound as a *claim*: its statement in our symbols, the
source, how sure we are of the transcription (a tag), the variant, norm and domain
it is about, and the reading chosen where the transcription is ambiguous.  Every
output that uses a claim carries its tag; a claim tagged ``unverified`` is never
presented as a theorem.  The numeric layer evaluates claims on weights and tries
to refute them (:mod:`lipbound.numeric.claims`).

Tags (docs/claims.md lists every claim with its source):
``abstract`` read in the paper's abstract; ``code`` read in the authors' released
code; ``3p`` restated by a third party; ``unverified`` recalled, not checked
against the paper's text; ``known-wrong`` a constant in public code that is false.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, final

import sympy as sp

from ..errors import AssumptionError
from . import symbols as S
from .assumptions import Assumptions, Ball, Frobenius
from .scores import DotProduct
from .theorems import self_attention

__all__ = ["PublishedClaim", "CLAIMS", "PENDING_CLAIMS", "claim", "TAGS", "theta", "tau", "p_max"]

TAGS: Final = ("abstract", "code", "3p", "unverified", "known-wrong")

VUCKOVIC = ("Vuckovic, Baratin, Tachet des Combes, \"A Mathematical Theory of Attention\", "
            "arXiv:2007.02876 (2020); \"On the Regularity of Attention\", arXiv:2102.05628")
KIM = ("Kim, Papamakarios, Mnih, \"The Lipschitz Constant of Self-Attention\", ICML 2021, "
       "PMLR 139:5562-5571, arXiv:2006.04710")
CASTIN = ("Castin, Ablin, Peyre, \"How Smooth Is Attention?\", ICML 2024, PMLR 235:5817-5840, "
          "arXiv:2312.14820")
NAIR = "Nair, arXiv:2510.23012 (2025)"
GAO = "Gao and Pavel, \"On the Properties of the Softmax Function\", arXiv:1704.00805 (2017)"
DASOULAS = ("Dasoulas, Scaman, Virmaux, \"Lipschitz Normalization for Self-Attention Layers\", "
            "ICML 2021, PMLR 139:2456-2466")
EMADI = ("Emadi, \"Exact Attention Sensitivity and the Geometry of Transformer Stability\", "
         "arXiv:2602.18849 (2026)")
RAMAPURAM = ("Ramapuram et al., \"Theory, Analysis, and Best Practices for Sigmoid Self-Attention\", "
             "ICLR 2025, arXiv:2409.04431")
NEWHOUSE = ("Newhouse, Hess, Cesista, Zahorodnii, Bernstein, Isola, \"Training Transformers with Enforced "
            "Lipschitz Constants\", arXiv:2507.13338 (2025)")
LIPATTN = ("\"Globally 1-Lipschitz Attention Without Sequence-Length Dependence\" (LipAttn), ICLR 2026 "
           "submission, OpenReview 9Y7L5VeV4Z")


@final
@dataclass(frozen=True)
class PublishedClaim:
    """A published (or publicly coded) claim.

    Attributes
    ----------
    key : str
        Registry name, e.g. ``"kim-l2-fro"``.
    title : str
        One line.
    source : str
        Citation.
    tag : str
        One of :data:`TAGS`.
    statement : sympy expression or None
        The claimed upper bound in lipbound's symbols, or None for a qualitative claim.
    kind : str
        ``"upper-bound"`` (a Lipschitz constant), ``"pointwise"`` (a local bound at an
        input X), ``"property"`` (a checkable qualitative fact), ``"constant"`` (a
        numeric constant claimed for a scalar function), ``"exact"`` (the exact value of an
        operator norm), ``"comparison"`` (one map is more regular than another on the same
        weights), ``"product"`` (a whole-model bound that is a product of per-block constants).
    variant, norm, domain : str
        What the statement bounds (registry variant name, norm key, domain key).
    reading : str
        Which transcription is encoded where it is ambiguous.
    lipschitz : bool or None
        For a qualitative claim: whether it says the variant is Lipschitz on the domain.
    notes : str
        Anything a reader must know.
    blocks : tuple of sympy numbers
        For a ``"product"`` claim: the per-block constants it states, composed one after
        another (empty when the source states only the total).
    """

    key: str
    title: str
    source: str
    tag: str
    statement: sp.Expr | None
    kind: str = "upper-bound"
    variant: str = ""
    norm: str = "fro"
    domain: str = "ball"
    reading: str = ""
    notes: str = ""
    lipschitz: bool | None = None
    symbols: dict = field(default_factory=dict, compare=False)
    blocks: tuple = ()

    def __post_init__(self):
        if self.tag not in TAGS:
            raise AssumptionError("tag", f"one of {TAGS}", repr(self.tag), "tag the claim's provenance")

    @property
    def provenance(self) -> str:
        """The tag and source in one string, carried into every output."""
        return f"[{self.tag}] {self.source}"

    @property
    def is_theorem(self) -> bool:
        """Only claims read in the paper or the code count as statements of the paper."""
        return self.tag in ("abstract", "code")


# Symbols used by claims ------------------------------------------------------
_ell_a = S.lambert_level(S.n)                       # W_0((N - 1)/e)
_ell_b = sp.LambertW(S.n / sp.E)                   # W_0(N/e), the reading reported under the theorem
_WQ, _WV, _WO = (S.MatrixNormSymbol(name) for name in ("W", "W_V", "W_O"))
_A, _Vn = S.MatrixNormSymbol("A"), S.MatrixNormSymbol("W_V")
_WQ_inf, _WQT_inf = S.InfNormSymbol("W"), S.InfNormSymbol("W.T")
_WO_T_inf, _WV_T_inf = S.InfNormSymbol("W_O.T"), S.InfNormSymbol("W_V.T")
#: The balanced-mass factor theta(p) of a probability vector, the softmax temperature, the largest weight.
theta = sp.Symbol("theta", nonnegative=True)
tau = S.RadiusSymbol("tau")
p_max = sp.Symbol("p_max", positive=True)


def _kim_l2(level):
    return sp.sqrt(S.n) / sp.sqrt(S.d_k) * (4 * level + 1) * sp.sqrt(S.H) * _WQ * _WV * _WO


def _kim_inf(level):
    return (4 * level + 1 / sp.sqrt(S.d_k)) * _WO_T_inf * _WQ_inf * _WQT_inf * _WV_T_inf


_CLAIMS: list[PublishedClaim] = [
    PublishedClaim(
        "kim-l2-fro", "L2 multi-head attention: l_2 bound with W_0((N-1)/e)", KIM, "unverified",
        _kim_l2(_ell_a), variant="multi-head-l2", norm="fro", domain="unbounded",
        reading="phi^{-1}(N-1) = W_0((N-1)/e); per-head norms are maxima over heads (sqrt(H) max_h)",
        notes="N = n tokens, D/H = d_k; transcription recalled, not read: linear in ||W_Q||, although the "
              "value path X A W_V is quadratic in W_Q"),
    PublishedClaim(
        "kim-l2-fro-wn", "L2 multi-head attention: l_2 bound with W_0(N/e)", KIM, "unverified",
        _kim_l2(_ell_b), variant="multi-head-l2", norm="fro", domain="unbounded",
        reading="W_0(N/e), as reported under the theorem [3p]; slightly larger than W_0((N-1)/e)"),
    PublishedClaim(
        "kim-l2-inf", "L2 multi-head attention: l_inf bound with W_0((N-1)/e)", KIM, "unverified",
        _kim_inf(_ell_a), variant="multi-head-l2", norm="inf", domain="unbounded",
        reading="phi^{-1}(N-1) = W_0((N-1)/e); ||M||_inf is the largest absolute row sum"),
    PublishedClaim(
        "kim-l2-inf-wn", "L2 multi-head attention: l_inf bound with W_0(N/e)", KIM, "unverified",
        _kim_inf(_ell_b), variant="multi-head-l2", norm="inf", domain="unbounded", reading="W_0(N/e) [3p]"),
    PublishedClaim(
        "kim-not-lipschitz", "Dot-product self-attention is not Lipschitz on an unbounded domain", KIM,
        "abstract", None, kind="property", variant="dot-product", domain="unbounded", lipschitz=False,
        notes="qualitative; lipbound derives the witness family X_t = (0, t), df_1/dx_1 = 1/2 + t^2/4"),
    PublishedClaim(
        "castin-theorem", "sqrt(n) bound for self-attention on B_R^n", CASTIN, "unverified",
        sp.sqrt(3) * _Vn * sp.sqrt(_A ** 2 * S.R ** 4 * (4 * S.n + 1) + S.n),
        variant="dot-product-nobias", norm="fro", domain="ball",
        notes="recalled statement; the abstract says O(sqrt(n)) on compact sets, tight for reasonable n"),
    PublishedClaim(
        "castin-code", "pointwise estimate of the authors' code", CASTIN, "code",
        None, kind="pointwise", variant="multi-head", norm="fro", domain="ball",
        reading="sum_h ||V_h||_2 sqrt(R_h^2 r^2 (n + 1) + n), R_h = max_i ||A_h x_i||, "
                "r = max_ij ||x_i - x_j||, A_h = K_h^T Q_h / sqrt(k), evaluated at an input X",
        notes="a local estimate at X, compared with the local Jacobian norm at the same X"),
    PublishedClaim(
        "softmax-half", "softmax is 1/2-Lipschitz in every l_p norm", NAIR, "abstract",
        sp.Rational(1, 2), kind="constant", variant="softmax", norm="any",
        notes="equality at n = 2, z = (0, 0); Gao and Pavel (2017) relate the constant to the temperature"),
    PublishedClaim(
        "lipschitznorm", "LipschitzNorm keeps every attention score in [-1, 1]", DASOULAS, "code",
        sp.Integer(1), kind="property", variant="lipschitznorm",
        reading="scores divided by max{||Q||_F ||K||_(inf,2), ||Q||_F ||V||_(inf,2), ||K||_(inf,2) ||V||_(inf,2)}"
                " + 1e-12, ||M||_(inf,2) = max_j ||m_j||_2",
        notes="the theorem's constant is [unverified]; the checkable part is |s_ij| <= 1, hence omega <= 2"),
    PublishedClaim(
        "vuckovic-w1", "Attention is Lipschitz in Wasserstein-1 on compact domains", VUCKOVIC, "abstract",
        None, kind="property", variant="measure-w1", norm="w1", domain="ball", lipschitz=True,
        notes="qualitative in the abstract; the constant was not read. lipbound derives its own "
              "(measure-w1, measure-w1-mean-field)"),
    PublishedClaim(
        "gelu-1.12", "GELU is 1.12-Lipschitz (product bounds in a ViT certification codebase)",
        "public ViT certification code (regression case)", "known-wrong", sp.Rational(112, 100),
        kind="constant", variant="gelu",
        notes="sup GELU' = 1.1289... at x = sqrt(2), so the product 'upper bound' is invalid"),
    PublishedClaim(
        "power-iteration-5", "a 5-step power iteration gives a layer's Lipschitz constant",
        "public ViT certification code (regression case)", "known-wrong", None, kind="property",
        variant="linear", notes="an under-estimate, not a bound"),
    PublishedClaim(
        "l2-untied-global", "untied L2 attention keeps the global Lipschitz bound",
        "community L2-attention implementations (regression case)", "known-wrong",
        _kim_l2(_ell_a).xreplace({_WQ: S.MatrixNormSymbol("W_Q")}), variant="l2-untied", norm="fro",
        domain="unbounded", notes="untying W_Q and W_K (or masking the diagonal) loses Lipschitzness"),
]

# Claims of 2024-2026 (docs/claims.md, "Recent claims") ------------------------------------------
_CLAIMS += [
    PublishedClaim(
        "emadi-softmax-inf1", "the softmax Jacobian's l_inf -> l_1 norm is exactly theta(p)/tau", EMADI, "abstract",
        theta / tau, kind="exact", variant="softmax", norm="inf->1",
        reading="theta(p) = 1 - min_s (p^T s)^2 over the sign vectors s (every entry +1 or -1); the abstract names "
                "theta the balanced-mass factor in [0, 1] and does not define it. The Jacobian is taken in the "
                "logits u of softmax(u / tau), p = softmax(u / tau)",
        notes="proved by lipbound (claim_theorems.softmax_inf_to_one); theta = 1 iff the weights split into two "
              "halves of equal mass (a partition problem); l_inf -> l_1 is not an induced l_p norm, so theta up "
              "to 1 does not contradict softmax-half"),
    PublishedClaim(
        "sigmoid-regularity", "sigmoid attention is more regular than softmax attention", RAMAPURAM, "abstract",
        None, kind="comparison", variant="sigmoid", norm="fro", domain="ball",
        reading="pointwise in the weights: for the same W_Q, W_K, W_V (and biases) and the same ball, the "
                "Lipschitz constant of sigmoid attention sigma(s - log n) is at most that of softmax attention",
        notes="qualitative in the abstract; decided only where a certified witness of one map beats the certified "
              "bound of the other"),
    PublishedClaim(
        "newhouse-2-lipschitz", "a 2-Lipschitz transformer reaches 60% on Shakespeare", NEWHOUSE, "abstract",
        sp.Integer(2), kind="product", norm="fro", domain="unbounded",
        reading="the whole-model bound is a product of per-block constants (the abstract gives the total only: "
                "neither the depth nor the per-block constants)"),
    PublishedClaim(
        "newhouse-10-lipschitz", "a 10-Lipschitz 145M-parameter transformer reaches 21% on internet text",
        NEWHOUSE, "abstract", sp.Integer(10), kind="product", norm="fro", domain="unbounded",
        reading="as newhouse-2-lipschitz"),
    PublishedClaim(
        "newhouse-nanogpt", "matching NanoGPT (39.4%) takes a Lipschitz bound of 10^264", NEWHOUSE, "abstract",
        sp.Integer(10) ** 264, kind="product", norm="fro", domain="unbounded",
        reading="as newhouse-2-lipschitz"),
    PublishedClaim(
        "lipattn-1-lipschitz", "LipAttn is 1-Lipschitz independent of sequence length and parameter norms", LIPATTN,
        "abstract", sp.Integer(1), kind="property", norm="fro", domain="unbounded",
        lipschitz=True,
        reading="LipAttn(X) = prox_phi(X), the minimiser over Y of phi(Y) + ||Y - X||_F^2 / 2, for a convex potential "
                "phi (the abstract: coefficients from a convex potential, an implicit proximal update, firmly "
                "non-expansive)",
        notes="the potential and the solver are not in the abstract: lipbound checks the principle on an "
              "attention-like convex potential of its own, and what a truncated solver keeps of it"),
]


def _rope_unrotated() -> sp.Expr:
    """The dot-product bound (Frobenius, with biases, on a ball about 0) put forward for rotary heads as it is: the
    unrotated ``A = W_Q W_K^T / sqrt(d_k)`` and ``||W_K b_Q||`` where the theorem has the offsets' maxima."""
    constants = DotProduct().kernel_constants(Assumptions(domain=Ball()))
    return self_attention(Frobenius()).statement.xreplace(constants.as_substitution())


#: Claims encoded here for regression checks of rotary heads; each is in :data:`CLAIMS` with its checker in
#: :mod:`lipbound.numeric.claims`.  ``rope-unrotated`` is refuted exactly by
#: :func:`lipbound.symbolic.rotary.unrotated_counterexample`.
PENDING_CLAIMS: Final[dict[str, PublishedClaim]] = {}
PENDING_CLAIMS["rope-unrotated"] = (PublishedClaim(
    "rope-unrotated", "RoPE attention satisfies the dot-product bound with the unrotated W_Q W_K^T",
    "community Lipschitz estimates of rotary heads (regression case)", "known-wrong", _rope_unrotated(),
    variant="rope", norm="fro",
    domain="ball", reading="the dot-product bound on B(0, R), A = W_Q W_K^T / sqrt(d_k), applied to a rotary head",
    notes="false: with d = 1, d_k = 2, W_Q = (1, 0), W_K = (0, 1) the unrotated W_Q W_K^T is 0 and the claim is "
          "||W_V||, but the rotated A_Delta = -sin(Delta theta) / sqrt(2) moves the weights; the offsets' maximum "
          "a = max_Delta ||A_Delta|| is what the theorem needs"))

CLAIMS: Final[dict[str, PublishedClaim]] = {**{c.key: c for c in _CLAIMS}, **PENDING_CLAIMS}


def claim(key: str) -> PublishedClaim:
    try:
        return CLAIMS[key]
    except KeyError:
        raise AssumptionError("claim", f"one of {', '.join(CLAIMS)}", repr(key),
                              "run `lipbound list` to see the claims") from None
