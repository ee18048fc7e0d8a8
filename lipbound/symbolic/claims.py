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

__all__ = ["PublishedClaim", "CLAIMS", "PENDING_CLAIMS", "claim", "TAGS"]

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
        numeric constant claimed for a scalar function).
    variant, norm, domain : str
        What the statement bounds (registry variant name, norm key, domain key).
    reading : str
        Which transcription is encoded where it is ambiguous.
    lipschitz : bool or None
        For a qualitative claim: whether it says the variant is Lipschitz on the domain.
    notes : str
        Anything a reader must know.
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

def _rope_unrotated() -> sp.Expr:
    """The dot-product bound (Frobenius, with biases, on a ball about 0) put forward for rotary heads as it is: the
    unrotated ``A = W_Q W_K^T / sqrt(d_k)`` and ``||W_K b_Q||`` where the theorem has the offsets' maxima."""
    constants = DotProduct().kernel_constants(Assumptions(domain=Ball()))
    return self_attention(Frobenius()).statement.xreplace(constants.as_substitution())


#: Claims encoded here whose refutation the numeric layer (``lipbound check``) does not run yet: each joins
#: :data:`CLAIMS` together with its checker in :mod:`lipbound.numeric.claims`.  ``rope-unrotated`` is refuted
#: exactly by :func:`lipbound.symbolic.rotary.unrotated_counterexample`.
PENDING_CLAIMS: Final[dict[str, PublishedClaim]] = {}
PENDING_CLAIMS["rope-unrotated"] = (PublishedClaim(
    "rope-unrotated", "RoPE attention satisfies the dot-product bound with the unrotated W_Q W_K^T",
    "community Lipschitz estimates of rotary heads (regression case)", "known-wrong", _rope_unrotated(),
    variant="rope", norm="fro",
    domain="ball", reading="the dot-product bound on B(0, R), A = W_Q W_K^T / sqrt(d_k), applied to a rotary head",
    notes="false: with d = 1, d_k = 2, W_Q = (1, 0), W_K = (0, 1) the unrotated W_Q W_K^T is 0 and the claim is "
          "||W_V||, but the rotated A_Delta = -sin(Delta theta) / sqrt(2) moves the weights; the offsets' maximum "
          "a = max_Delta ||A_Delta|| is what the theorem needs"))

CLAIMS: Final[dict[str, PublishedClaim]] = {c.key: c for c in _CLAIMS}


def claim(key: str) -> PublishedClaim:
    try:
        return CLAIMS[key]
    except KeyError:
        raise AssumptionError("claim", f"one of {', '.join(CLAIMS)}", repr(key),
                              "run `lipbound list` to see the claims") from None
