"""Try to refute published claims on random and given weights.

:func:`check` takes a claim of :data:`lipbound.symbolic.claims.CLAIMS` and looks for a
witness: an input (and weights) where the map provably stretches more than the
claim allows.  A verdict is REFUTED only when the witness's value, recomputed in
high precision, exceeds the claim's value evaluated as an interval upper end; when
rounding could decide, the verdict is "not certified".  A claim tagged
``unverified`` that is refuted is reported as refuted *as transcribed*: the paper may
say something else.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, final

import mpmath
import numpy as np
import sympy as sp
from mpmath import iv

from ..assumptions import Truth
from ..errors import AssumptionError
from ..symbolic.claims import PublishedClaim, claim
from . import attention as att
from .rigorous import certify_le, interval, interval_lambdify, spectral_norm_lower, spectral_norm_upper, upper

__all__ = ["CheckResult", "check", "CHECKERS"]


@final
@dataclass(frozen=True)
class CheckResult:
    """Outcome of trying to refute a claim.

    ``verdict``: ``"REFUTED"`` (a certified witness beats the claim), ``"not refuted"``
    (no witness found within the budget: not a proof), ``"confirmed"`` (the claim is
    also a theorem lipbound derives or checks exactly), or ``"not certified"``.
    """

    claim: str
    verdict: str
    provenance: str
    claimed: float | None = None
    witness_value: float | None = None
    witness: dict = field(default_factory=dict)
    notes: str = ""

    @property
    def refuted(self) -> bool:
        return self.verdict == "REFUTED"

    def describe(self) -> str:
        lines = [f"claim {self.claim} {self.provenance}", f"verdict: {self.verdict}"]
        if self.claimed is not None:
            lines.append(f"claimed value (certified upper end): {self.claimed:.6g}")
        if self.witness_value is not None:
            lines.append(f"witness value (certified lower end): {self.witness_value:.6g}")
        for key, value in self.witness.items():
            lines.append(f"witness {key}: {value}")
        if self.notes:
            lines.append(self.notes)
        return "\n".join(lines)


def _verdict(witness_low: float, claimed_high: float) -> str:
    answer = certify_le(interval(witness_low), interval(claimed_high))
    if answer is Truth.FALSE:
        return "REFUTED"
    if answer is Truth.TRUE:
        return "not refuted"
    return "not certified"


def _claim_value(statement: sp.Expr, values: dict) -> float:
    """Upper end of the claim's statement at the given symbol values (intervals)."""
    symbols = sorted(statement.free_symbols, key=str)
    missing = [str(s) for s in symbols if str(s) not in values]
    if missing:
        raise AssumptionError("values", "a value for every symbol of the claim", f"missing {missing}",
                              "this is a bug in the checker for this claim")
    function = interval_lambdify(symbols, statement)
    return upper(function(*[values[str(s)] for s in symbols]))


def _inf_norm_upper(M: np.ndarray) -> "iv.mpf":
    """``||M||_inf`` (largest absolute row sum) enclosed exactly by interval sums."""
    best = interval(0)
    for row in np.abs(np.asarray(M, dtype=float)):
        total = sum((interval(float(v)) for v in row), interval(0))
        best = iv.mpf([max(best.a, total.a), max(best.b, total.b)])
    return best


def _jacobian(head: att.Head, X: np.ndarray) -> np.ndarray:
    return att.dense_jacobian(lambda X_, E: att.self_jvp(head, X_, E), X)


def _high_precision_jacobian_entry_norm(head: att.Head, X: np.ndarray, norm: str) -> float:
    """Recompute the local operator norm at X with mpmath (50 digits) by central differences
    of step 1e-20; the truncation error O(h^2) is far below the reported digits."""
    mpmath.mp.dps = 50
    h = mpmath.mpf("1e-20")
    n, d = X.shape
    columns = []
    for index in range(n * d):
        E = np.zeros(n * d)
        E[index] = 1
        plus = _mp_forward(head, X, E.reshape(n, d), h)
        minus = _mp_forward(head, X, E.reshape(n, d), -h)
        columns.append([(p - m) / (2 * h) for p, m in zip(plus, minus)])
    J = mpmath.matrix(columns).T
    if norm == "inf":
        return float(max(sum(abs(J[i, j]) for j in range(J.cols)) for i in range(J.rows)))
    return float(mpmath.mpf(max(mpmath.svd_r(J, compute_uv=False))))


def _mp_forward(head: att.Head, X: np.ndarray, E: np.ndarray, h) -> list:
    n, d = X.shape
    Z = [[mpmath.mpf(float(X[i, k])) + h * float(E[i, k]) for k in range(d)] for i in range(n)]
    mat = lambda M: [[mpmath.mpf(float(v)) for v in row] for row in np.atleast_2d(M)]
    WQ, WK, V = mat(head.W_Q), mat(head.W_K), mat(head.V)
    bQ, bK, bV = ([mpmath.mpf(float(v)) for v in b] for b in (head.b_Q, head.b_K, head.b_V))
    project = lambda z, W, b: [sum(z[k] * W[k][j] for k in range(d)) + b[j] for j in range(len(b))]
    Q = [project(z, WQ, bQ) for z in Z]
    K = [project(z, WK, bK) for z in Z]
    values = [project(z, V, bV) for z in Z]
    scale = 1 / mpmath.sqrt(head.d_k)
    out = []
    for i in range(n):
        if head.score == "l2":
            scores = [-scale * sum((Q[i][j] - K[k][j]) ** 2 for j in range(head.d_k)) for k in range(n)]
        else:
            scores = [scale * sum(Q[i][j] * K[k][j] for j in range(head.d_k)) for k in range(n)]
        top = max(scores)
        weights = [mpmath.exp(s - top) for s in scores]
        total = sum(weights)
        out.extend(sum(weights[k] * values[k][j] for k in range(n)) / total for j in range(head.d_v))
    return out


# Checkers -------------------------------------------------------------------------------------
def _check_kim(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """Tied L2 attention with Kim values, one head, W_O = I: the hard-attention regime.

    With tokens far apart relative to the scores, each token attends to itself and
    f(X) ~ X A W_V, so Lip >= ||A W_V|| grows like ||W||^2 while the transcribed l_2
    statement grows like ||W||: large scales refute it if the transcription is right.
    """
    rng = np.random.default_rng(seed)
    norm = item.norm
    best = None
    deadline = time.perf_counter() + budget
    scales = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]
    for scale in scales:
        for _ in range(3):
            d = int(rng.integers(1, 4))
            n = int(rng.integers(2, 5))
            W = scale * rng.standard_normal((d, d)) / np.sqrt(d)
            W_V = rng.standard_normal((d, d)) / np.sqrt(d)
            head = att.Head(W, W, W_V, score="l2", kim_values=True)
            values = {"n": interval(n), "d_k": interval(d), "H": interval(1), "W": interval(spectral_norm_upper(W)),
                      "W_V": interval(spectral_norm_upper(W_V)), "W_O": interval(1),
                      "W.T": _inf_norm_upper(W.T), "W_O.T": interval(1), "W_V.T": _inf_norm_upper(W_V.T)}
            claimed = _claim_value(item.statement, values)
            for spread in (1.0, 10.0, 100.0):
                X = spread * rng.standard_normal((n, d))
                J = _jacobian(head, X)
                local = float(np.max(np.sum(np.abs(J), axis=1))) if norm == "inf" else float(np.linalg.norm(J, 2))
                if best is None or local / claimed > best[0]:
                    best = (local / claimed, head, X, claimed, local, scale, n, d)
            if time.perf_counter() > deadline:
                break
    ratio, head, X, claimed, local, scale, n, d = best
    exact = _high_precision_jacobian_entry_norm(head, X, norm)
    low = exact * (1 - 1e-12)
    return CheckResult(item.key, _verdict(low, claimed), item.provenance, claimed, low,
                       {"n": n, "d": d, "scale of W": scale, "X": X.tolist(), "W": head.W_Q.tolist(),
                        "W_V": head.W_V.tolist(), "local norm (float)": local},
                       notes="refuted as transcribed (the claim is tagged unverified: the paper may differ)"
                       if ratio > 1 and item.tag == "unverified" else "")


def _check_castin_theorem(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """Dot-product heads without biases in B_R: witnesses from the structured search."""
    from .weights import load_default
    from .witness import search_witness
    heads = []
    if weights is not None:
        for layer in weights.layers.values():
            heads.extend((h, layer.ln_in.radius_about_origin if layer.ln_in is not None else 1.0) for h in layer.heads)
    else:
        model = load_default(layers=0)
        heads = [(h, model.layers[0].ln_in.radius_about_origin) for h in model.layers[0].heads[:3]]
    best = None
    for head, radius in heads:
        plain = att.Head(head.W_Q, head.W_K, head.W_V, score="dot")
        n = 8
        witness = search_witness(plain, radius=radius, n=n, budget_seconds=max(1.0, budget / len(heads)), seed=seed)
        A = interval(spectral_norm_upper(plain.A))
        values = {"A": A, "W_V": interval(spectral_norm_upper(plain.W_V)), "R": interval(radius), "n": interval(n)}
        claimed = _claim_value(item.statement, values)
        if best is None or witness.value / claimed > best[0]:
            best = (witness.value / claimed, witness, claimed)
    ratio, witness, claimed = best
    return CheckResult(item.key, _verdict(witness.value * (1 - 1e-9), claimed), item.provenance, claimed,
                       witness.value, {"n": witness.n, "radius": witness.radius, "method": witness.method,
                                       "ratio witness / claim": ratio})


def _check_castin_code(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """The code's pointwise estimate at an input X, against the local Jacobian norm at X
    (both orientations of A_h are tried; refuted only if the local norm beats both)."""
    from .weights import load_default
    from .witness import search_witness
    model = weights or load_default(layers=0)
    layer = model.layers[min(model.layers)]
    radius = layer.ln_in.radius_about_origin if layer.ln_in is not None else 1.0
    head = att.Head(layer.heads[0].W_Q, layer.heads[0].W_K, layer.heads[0].W_V, score="dot")
    witness = search_witness(head, radius=radius, n=8, budget_seconds=max(2.0, budget), seed=seed)
    X = witness.X
    A = head.A
    r = max(float(np.linalg.norm(a - b)) for a in X for b in X)
    estimates = []
    for M in (A, A.T):
        R_h = max(float(np.linalg.norm(M @ x)) for x in X)
        estimates.append(spectral_norm_upper(head.W_V) * math.sqrt(R_h ** 2 * r ** 2 * (len(X) + 1) + len(X)))
    claimed = max(estimates) * (1 + 1e-12)
    return CheckResult(item.key, _verdict(witness.value * (1 - 1e-9), claimed), item.provenance, claimed,
                       witness.value, {"n": len(X), "radius": radius, "estimates (A x, A^T x)": estimates},
                       notes="a pointwise estimate compared with the local Jacobian norm at the same input")


def _check_softmax(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """``||J_softmax(z)||_p <= 1/2`` for p = 1, 2, inf on random logits; equality at z = (0, 0)."""
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(2000):
        z = rng.standard_normal(int(rng.integers(2, 8))) * rng.choice([0.1, 1, 5])
        p = np.exp(z - z.max())
        p /= p.sum()
        J = np.diag(p) - np.outer(p, p)
        worst = max(worst, np.linalg.norm(J, 2), np.linalg.norm(J, 1), np.linalg.norm(J, np.inf))
    exact = mpmath.mpf(1) / 4 + mpmath.mpf(1) / 4  # z = (0, 0): J = [[1/4, -1/4], [-1/4, 1/4]], norm 1/2
    return CheckResult(item.key, "confirmed", item.provenance, 0.5, float(worst),
                       {"largest sampled norm": float(worst), "equality at": "z = (0, 0), norm exactly "
                                                                          f"{mpmath.nstr(exact, 5)}"},
                       notes="no sample exceeds 1/2; the equality case attains it")


def _check_lipschitznorm(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """Scores divided by the LipschitzNorm scale stay in [-1, 1] (Cauchy-Schwarz)."""
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(500):
        n, d = int(rng.integers(2, 10)), int(rng.integers(1, 6))
        Q, K, V = (rng.standard_normal((n, d)) * rng.choice([0.1, 1, 10]) for _ in range(3))
        col = lambda M: np.max(np.linalg.norm(M, axis=1))
        scale = max(np.linalg.norm(Q) * col(K), np.linalg.norm(Q) * col(V), col(K) * col(V)) + 1e-12
        worst = max(worst, float(np.max(np.abs(Q @ K.T)) / scale))
    verdict = "confirmed" if worst <= 1 else "REFUTED"
    return CheckResult(item.key, verdict, item.provenance, 1.0, worst, {"largest |s_ij|": worst},
                       notes="|q_i . k_j| <= ||q_i|| ||k_j|| <= ||Q||_F ||K||_(inf,2); the theorem itself is unverified")


def _erf_one() -> "iv.mpf":
    """``erf(1)`` enclosed rigorously: ``(2/sqrt(pi)) sum_k (-1)^k / (k! (2k + 1))`` is an
    alternating series with decreasing terms, so two consecutive partial sums bracket it."""
    total, term_bound = iv.mpf(0), iv.mpf(0)
    for k in range(40):
        term = iv.mpf((-1) ** k) / (iv.factorial(k) * (2 * k + 1))
        total += term
        term_bound = iv.mpf(1) / (iv.factorial(k + 1) * (2 * k + 3))
    series = iv.mpf([(total - term_bound).a, (total + term_bound).b])
    return 2 / iv.sqrt(iv.pi) * series


def _gelu_derivative_at_sqrt2() -> "iv.mpf":
    """``GELU'(x) = Phi(x) + x phi(x)`` at ``x = sqrt 2``: ``(1 + erf(1))/2 + sqrt(2) e^{-1} / sqrt(2 pi)``."""
    return (1 + _erf_one()) / 2 + iv.sqrt(2) * iv.exp(-1) / iv.sqrt(2 * iv.pi)


def _check_gelu(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """GELU'(sqrt 2) = 1.1289... > 1.12 in interval arithmetic; so ``1.12 ||W_1|| ||W_2||``
    is beaten by ``x -> W_2 GELU(W_1 x)`` with W_1 = W_2 = 1 at x = sqrt 2."""
    value = _gelu_derivative_at_sqrt2()
    return CheckResult(item.key, _verdict(float(value.a), 1.12), item.provenance, 1.12, float(value.a),
                       {"x": "sqrt(2)", "GELU'(x) enclosure": f"[{mpmath.nstr(value.a, 12)}, {mpmath.nstr(value.b, 12)}]",
                        "product bound": "W_2 GELU(W_1 x), W_1 = W_2 = 1: derivative at sqrt(2) beats 1.12 ||W_1|| ||W_2||"})


def _check_power_iteration(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """Five power-iteration steps under-estimate ||W_O|| of a real layer."""
    from .weights import load_default
    model = weights or load_default(layers=0)
    M = model.layers[min(model.layers)].W_O
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(M.shape[1])
    for _ in range(5):
        v = M.T @ (M @ v)
        v /= np.linalg.norm(v)
    estimate = float(np.linalg.norm(M @ v)) * (1 + 1e-12)
    lower = spectral_norm_lower(M)
    return CheckResult(item.key, _verdict(lower, estimate), item.provenance, estimate, lower,
                       {"matrix": f"W_O of layer {min(model.layers)}", "5-step estimate": estimate,
                        "certified lower bound on ||W_O||": lower})


def _check_untied(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """Untied L2 attention (W_Q = 1, W_K = 2 on R): along X_t = (0, t) the Jacobian grows like t^2."""
    head = att.Head(np.ones((1, 1)), 2 * np.ones((1, 1)), np.ones((1, 1)), score="l2")
    values = {"n": interval(2), "d_k": interval(1), "H": interval(1), "W_Q": interval(1), "W_V": interval(1),
              "W_O": interval(1)}
    claimed = _claim_value(item.statement, values)
    t = 2.0
    while True:
        X = np.array([[0.0], [t]])
        local = float(np.linalg.norm(_jacobian(head, X), 2))
        if local > 2 * claimed or t > 1e3:
            break
        t *= 1.5
    exact = _high_precision_jacobian_entry_norm(head, X, "fro")
    return CheckResult(item.key, _verdict(exact * (1 - 1e-12), claimed), item.provenance, claimed, exact,
                       {"X": X.tolist(), "W_Q": 1, "W_K": 2, "W_V": 1, "family": "X_t = (0, t)"})


def _check_derived(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """Qualitative claims lipbound derives itself."""
    from ..assumptions import Assumptions, Ball, Unbounded
    from ..symbolic.registry import variant
    if item.key == "kim-not-lipschitz":
        result = variant("dot-product").derive(Assumptions(domain=Unbounded()), "dot-product")
        return CheckResult(item.key, "confirmed", item.provenance, None, None,
                           {"family": str(result.family.tolist()), "Jacobian entry": str(result.growth)},
                           notes="derived: the entry tends to infinity")
    result = variant("measure-w1-mean-field").derive(Assumptions(domain=Ball()), "measure-w1-mean-field")
    return CheckResult(item.key, "confirmed", item.provenance, None, None, {"derived constant": str(result.expr)},
                       notes="lipbound derives an explicit W1 constant on balls (measure-w1-mean-field)")


CHECKERS: dict[str, Callable] = {
    "kim-l2-fro": _check_kim, "kim-l2-fro-wn": _check_kim, "kim-l2-inf": _check_kim, "kim-l2-inf-wn": _check_kim,
    "kim-not-lipschitz": _check_derived, "castin-theorem": _check_castin_theorem, "castin-code": _check_castin_code,
    "softmax-half": _check_softmax, "lipschitznorm": _check_lipschitznorm, "vuckovic-w1": _check_derived,
    "gelu-1.12": _check_gelu, "power-iteration-5": _check_power_iteration, "l2-untied-global": _check_untied,
}


def check(key: str, weights=None, seed: int = 0, budget: float = 20.0) -> CheckResult:
    """Try to refute claim ``key`` on random weights, and on ``weights`` (a ModelWeights) if given."""
    item = claim(key)
    return CHECKERS[key](item, seed, budget, weights)

