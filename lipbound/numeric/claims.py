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
from collections.abc import Callable

import mpmath
import numpy as np
import sympy as sp

from ..errors import AssumptionError, LipboundError
from ..rigorous.compiler import compile_interval
from ..rigorous.functions import erf, maximum
from ..rigorous.intervals import IV, Verdict, certify_le, interval, lower, upper
from ..rigorous.linalg import spectral_norm_lower, spectral_norm_upper
from ..symbolic.assumptions import Assumptions, Ball, LayerNormImage, Unbounded
from ..symbolic.claims import PublishedClaim, claim
from ..symbolic.registry import variant
from ..symbolic.rotary import UNROTATED_FAMILY, unrotated_counterexample
from .attention import dense_jacobian, self_jvp
from .claim_checks import RECENT_CHECKERS
from .claim_result import CheckResult
from .claim_result import claim_verdict as _verdict
from .domains import TokenBall
from .kernels import L2Distance, Rotary, softmax
from .model import Head, load_default
from .recheck import directional_norm
from .witness import search_witness

__all__ = ["CheckResult", "check", "CHECKERS"]


def _claim_value(statement: sp.Expr, values: dict) -> float:
    """Upper end of the claim's statement at the given symbol values (intervals)."""
    symbols = sorted(statement.free_symbols, key=str)
    missing = [str(s) for s in symbols if str(s) not in values]
    if missing:
        raise AssumptionError("values", "a value for every symbol of the claim", f"missing {missing}",
                              "this is a bug in the checker for this claim")
    return upper(compile_interval(statement, symbols)(*[values[str(s)] for s in symbols]))


def _inf_norm_upper(M: np.ndarray) -> IV.mpf:
    """``||M||_inf`` (largest absolute row sum) enclosed exactly by interval sums."""
    best = interval(0)
    for row in np.abs(np.asarray(M, dtype=float)):
        total = sum((interval(float(v)) for v in row), interval(0))
        best = maximum(best, total)
    return best


def _jacobian(head: Head, X: np.ndarray) -> np.ndarray:
    return dense_jacobian(lambda X_, E: self_jvp(head, X_, E), X)


def _certified_local_norm(head: Head, X: np.ndarray, norm: str) -> float:
    """A certified lower bound on ``||Df(X)||`` (spectral norm for ``"fro"``, the l_inf operator norm
    for ``"inf"``): the direction comes from the float Jacobian, the value from the rigorous
    re-check (:func:`lipbound.numeric.recheck.directional_norm`)."""
    J = _jacobian(head, X)
    if norm == "inf":
        row = int(np.argmax(np.sum(np.abs(J), axis=1)))
        E = np.where(J[row] >= 0, 1.0, -1.0).reshape(X.shape)
        return directional_norm(head, X, E, "inf")[0]
    _, _, vt = np.linalg.svd(J)
    return directional_norm(head, X, vt[0].reshape(X.shape), "fro")[0]


# Checkers -------------------------------------------------------------------------------------
def _check_kim(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """Tied L2 attention with Kim values, one head, W_O = I: the hard-attention regime.

    With tokens far apart relative to the scores, each token attends to itself and
    f(X) ~ X A W_V, so Lip >= ||A W_V|| grows like ||W||^2 while the transcribed l_2
    statement grows like ||W||: large scales refute it if the transcription is right.  A fixed set of
    54 small instances (well under a second): ``budget`` is not needed, and the seed alone fixes the
    answer (a wall-clock deadline made it depend on the machine).
    """
    rng = np.random.default_rng(seed)
    norm = item.norm
    best = None
    scales = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]
    for scale in scales:
        for _ in range(3):
            d = int(rng.integers(1, 4))
            n = int(rng.integers(2, 5))
            W = scale * rng.standard_normal((d, d)) / np.sqrt(d)
            W_V = rng.standard_normal((d, d)) / np.sqrt(d)
            head = Head(W, W, W_V, kernel=L2Distance(), kim_values=True)
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
    ratio, head, X, claimed, local, scale, n, d = best
    low = _certified_local_norm(head, X, norm)
    return CheckResult(item.key, _verdict(low, claimed), item.provenance, claimed, low,
                       {"n": n, "d": d, "scale of W": scale, "X": X.tolist(), "W": head.W_Q.tolist(),
                        "W_V": head.W_V.tolist(), "local norm (float)": local},
                       notes="refuted as transcribed (the claim is tagged unverified: the paper may differ)"
                       if ratio > 1 and item.tag == "unverified" else "")


def _check_castin_theorem(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """Dot-product heads without biases in B_R: witnesses from the structured search."""
    heads = []
    if weights is not None:
        for layer in weights.layers.values():
            heads.extend((h, layer.ln_in.radius_about_origin if layer.ln_in is not None else 1.0) for h in layer.heads)
    else:
        model = load_default(layers=0)
        heads = [(h, model.layers[0].ln_in.radius_about_origin) for h in model.layers[0].heads[:3]]
    best = None
    for head, radius in heads:
        plain = Head(head.W_Q, head.W_K, head.W_V)
        n = 8
        witness = search_witness(plain, domain=TokenBall(radius), n=n, budget_seconds=max(1.0, budget / len(heads)),
                                 seed=seed)
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
    model = weights or load_default(layers=0)
    layer = model.layers[min(model.layers)]
    radius = layer.ln_in.radius_about_origin if layer.ln_in is not None else 1.0
    head = Head(layer.heads[0].W_Q, layer.heads[0].W_K, layer.heads[0].W_V)
    witness = search_witness(head, domain=TokenBall(radius), n=8, budget_seconds=max(2.0, budget), seed=seed)
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


def _softmax_jacobian_norm(z: np.ndarray):
    """An interval enclosing ``||J(z)||_2`` from below at the float logits z: ``J = diag(p) - p p^T``
    with p enclosed, and the Rayleigh quotient at the computed top eigenvector (a lower bound)."""
    exps = [IV.exp(interval(float(v)) - interval(float(np.max(z)))) for v in z]
    total = sum(exps, IV.mpf(0))
    p = [e / total for e in exps]
    J = np.diag(softmax(z))
    J = J - np.outer(np.diag(J), np.diag(J))
    v = np.linalg.eigh(J)[1][:, -1]
    Jv = [p[i] * float(v[i]) - p[i] * sum((p[k] * float(v[k]) for k in range(len(z))), IV.mpf(0))
          for i in range(len(z))]
    return IV.sqrt(sum((x * x for x in Jv), IV.mpf(0))) / IV.sqrt(sum((interval(float(x)) ** 2 for x in v), IV.mpf(0)))


def _check_softmax(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """``||J_softmax(z)||_2 <= c`` for the claimed c.  Search over logits for the largest norm,
    certified in interval arithmetic: REFUTED when it exceeds c.  Confirmed when c >= 1/2, by
    proof: every row of ``|J|`` sums to ``2 p_i (1 - p_i) <= 1/2``, so ``||J||_1 = ||J||_inf <= 1/2``
    and ``||J||_2 <= (||J||_1 ||J||_inf)^(1/2) <= 1/2``; the maximum 1/2 is attained at z = (0, 0)."""
    rng = np.random.default_rng(seed)
    claimed = interval(item.statement)
    candidates = [np.zeros(2)] + [rng.standard_normal(int(rng.integers(2, 8))) * rng.choice([0.1, 1, 5])
                                  for _ in range(2000)]

    def norm(z):
        p = softmax(z)
        return np.linalg.norm(np.diag(p) - np.outer(p, p), 2)

    best = max(candidates, key=norm)
    certified = _softmax_jacobian_norm(best)
    answer = certify_le(certified.a, claimed)
    details = {"logits": best.tolist(), "certified ||J||_2 >=": lower(certified)}
    if answer is Verdict.FAILS:
        return CheckResult(item.key, "REFUTED", item.provenance, upper(claimed), lower(certified), details)
    if certify_le(interval(1) / 2, claimed) is Verdict.HOLDS:
        return CheckResult(item.key, "confirmed", item.provenance, upper(claimed), lower(certified), details,
                           notes="proved: row sums of |J| are 2 p_i (1 - p_i) <= 1/2, and ||J||_2 <= "
                                 "(||J||_1 ||J||_inf)^(1/2); equality at z = (0, 0)")
    return CheckResult(item.key, "not refuted" if answer is Verdict.HOLDS else "not certified", item.provenance,
                       upper(claimed), lower(certified), details)


def _check_lipschitznorm(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """Scores divided by the LipschitzNorm scale stay in ``[-c, c]`` for the claimed c.  The largest
    sampled ratio is certified in interval arithmetic (REFUTED when it exceeds c); confirmed when
    c >= 1, by Cauchy-Schwarz: ``|q_i . k_j| <= ||q_i|| ||k_j|| <= ||Q||_F ||K||_(inf,2) < scale``."""
    rng = np.random.default_rng(seed)
    claimed = interval(item.statement)
    best, best_case = -1.0, None
    for trial in range(500):
        n, d = int(rng.integers(1, 10)), int(rng.integers(1, 6))
        Q = rng.standard_normal((n, d)) * rng.choice([0.1, 1, 10])
        K = Q.copy() if trial % 5 == 0 else rng.standard_normal((n, d)) * rng.choice([0.1, 1, 10])
        V = rng.standard_normal((n, d)) * rng.choice([1e-3, 1, 10])
        def col(M):
            return np.max(np.linalg.norm(M, axis=1))
        scale = max(np.linalg.norm(Q) * col(K), np.linalg.norm(Q) * col(V), col(K) * col(V)) + 1e-12
        ratio = float(np.max(np.abs(Q @ K.T)) / scale)
        if ratio > best:
            best, best_case = ratio, (Q, K, V)
    Q, K, V = best_case
    def exact(M):
        return [[interval(float(x)) for x in row] for row in M]
    q, k, v = exact(Q), exact(K), exact(V)
    def norm(rows):
        return [IV.sqrt(sum((x * x for x in row), IV.mpf(0))) for row in rows]
    frob_Q = IV.sqrt(sum((x * x for row in q for x in row), IV.mpf(0)))
    col_K, col_V = maximum(*norm(k)), maximum(*norm(v))
    scale = maximum(frob_Q * col_K, frob_Q * col_V, col_K * col_V) + interval("1e-12")
    top = maximum(*[abs(sum((a * b for a, b in zip(qi, kj)), IV.mpf(0))) for qi in q for kj in k])
    certified = top / scale
    details = {"largest |s_ij| (float)": best, "certified |s_ij| >=": lower(certified)}
    if certify_le(certified.a, claimed) is Verdict.FAILS:
        return CheckResult(item.key, "REFUTED", item.provenance, upper(claimed), lower(certified), details)
    if certify_le(1, claimed) is Verdict.HOLDS:
        return CheckResult(item.key, "confirmed", item.provenance, upper(claimed), lower(certified), details,
                           notes="proved by Cauchy-Schwarz; the theorem itself is unverified")
    return CheckResult(item.key, "not refuted", item.provenance, upper(claimed), lower(certified), details)


def _gelu_derivative_at_sqrt2() -> IV.mpf:
    """``GELU'(x) = Phi(x) + x phi(x)`` at ``x = sqrt 2``: ``(1 + erf(1))/2 + sqrt(2) e^{-1} / sqrt(2 pi)``."""
    return (1 + erf(1)) / 2 + IV.sqrt(2) * IV.exp(-1) / IV.sqrt(2 * IV.pi)


def _check_gelu(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """GELU'(sqrt 2) = 1.1289... > 1.12 in interval arithmetic; so ``1.12 ||W_1|| ||W_2||``
    is beaten by ``x -> W_2 GELU(W_1 x)`` with W_1 = W_2 = 1 at x = sqrt 2."""
    value = _gelu_derivative_at_sqrt2()
    return CheckResult(item.key, _verdict(float(value.a), 1.12), item.provenance, 1.12, float(value.a),
                       {"x": "sqrt(2)",
                        "GELU'(x) enclosure": f"[{mpmath.nstr(value.a, 12)}, {mpmath.nstr(value.b, 12)}]",
                        "product bound": "W_2 GELU(W_1 x), W_1 = W_2 = 1: derivative at sqrt(2) beats "
                                         "1.12 ||W_1|| ||W_2||"})


def _check_power_iteration(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """Five power-iteration steps under-estimate ||W_O|| of a real layer."""
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
    head = Head(np.ones((1, 1)), 2 * np.ones((1, 1)), np.ones((1, 1)), kernel=L2Distance())
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
    exact = _certified_local_norm(head, X, "fro")
    return CheckResult(item.key, _verdict(exact, claimed), item.provenance, claimed, exact,
                       {"X": X.tolist(), "W_Q": 1, "W_K": 2, "W_V": 1, "family": "X_t = (0, t)"})


def _unrotated_values(head: Head, radius: float, n: int) -> dict:
    """The symbols of the unrotated claim on a rotary head: its W_Q W_K^T as if no rotation applied."""
    return {"A": interval(spectral_norm_upper(head.W_Q @ head.W_K.T)) / IV.sqrt(IV.mpf(head.d_k)),
            "W_V": interval(spectral_norm_upper(head.W_V)), "W_Q": interval(spectral_norm_upper(head.W_Q)),
            "W_K": interval(spectral_norm_upper(head.W_K)),
            "b_Q": interval(float(np.linalg.norm(head.b_Q)) * (1 + 1e-15)),
            "W_K*b_Q": interval(float(np.linalg.norm(head.W_K @ head.b_Q)) * (1 + 1e-12)), "R": interval(radius),
            "n": interval(n), "d_k": interval(head.d_k)}


def _check_rope_unrotated(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """The dot-product bound with the unrotated ``W_Q W_K^T`` put forward for rotary heads.  Refuted exactly on
    ``d = 1, d_k = 2, W_Q = (1, 0), W_K = (0, 1), W_V = 1`` (``W_Q W_K^T = 0``: the claim is ``||W_V|| = 1``): with
    rotations of pi/2 per position, two tokens in [-1, 1] give a Jacobian whose norm is enclosed above 1.2
    (:func:`lipbound.symbolic.rotary.unrotated_counterexample`, SymPy and interval arithmetic).  The same weights
    under lipbound's rotary kernel (one radian per position) and, with ``weights``, the real rotary heads of the
    model's first layer are searched too; their witness values are reported beside the claim."""
    exact = unrotated_counterexample()
    head = Head(np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]]), np.ones((1, 1)), kernel=Rotary(dims=2))
    claimed = _claim_value(item.statement, _unrotated_values(head, 1.0, 2))
    details = {"instance": UNROTATED_FAMILY, "certified ||Df|| >=": exact["lower"], "claim": claimed}
    generated = search_witness(head, domain=TokenBall(1.0), n=2, budget_seconds=max(1.0, budget / 4), seed=seed)
    details["rotary kernel (1 rad per position), n = 2, R = 1: witness (float)"] = generated.value
    try:   # certified when the re-check encloses rotary scores
        details["rotary kernel witness, certified >="] = directional_norm(head, generated.X, generated.E)[0]
    except AssumptionError:
        pass
    if weights is not None:
        layer = weights.layers[min(weights.layers)]
        best = None
        for index, real in enumerate(layer.heads):
            if not isinstance(real.kernel, Rotary):
                continue
            radius = layer.ln_in.radius_about_origin if layer.ln_in is not None else 1.0
            value = _claim_value(item.statement, _unrotated_values(real, radius, 8))
            found = search_witness(real, domain=TokenBall(radius), n=8, budget_seconds=max(1.0, budget / 8), seed=seed)
            if best is None or found.value / value > best[0]:
                best = (found.value / value, index, found.value, value)
        if best is not None:
            details.update({"real head": best[1], "real head witness (float)": best[2], "real head claim": best[3]})
    return CheckResult(item.key, _verdict(exact["lower"], claimed), item.provenance, claimed, exact["lower"], details,
                       notes="a is the largest ||A_Delta|| over the offsets that occur; the unrotated W_Q W_K^T "
                             "can vanish while every A_Delta with Delta != 0 does not")


_DOMAINS = {"ball": Ball, "layernorm": LayerNormImage, "unbounded": Unbounded}


def _check_derived(item: PublishedClaim, seed: int, budget: float, weights) -> CheckResult:
    """Qualitative claims: is the variant Lipschitz on the domain?  lipbound's derivation decides:
    a derived bound proves Lipschitzness (it refutes a claim that it is not), an exact witness
    family proves the opposite (it refutes a claim that it is)."""
    try:
        result = variant(item.variant).derive(Assumptions(domain=_DOMAINS[item.domain](), norm=item.norm),
                                              item.variant)
    except LipboundError as error:
        return CheckResult(item.key, "not refuted", item.provenance, notes=f"lipbound derives nothing here: {error}")
    if result.lipschitz:
        found = {"derived constant": str(result.expr), "theorem": result.theorem}
    else:
        found = {"family": str(result.family.tolist()), "Jacobian entry": str(result.growth),
                 "instance": result.instance}
    verdict = "confirmed" if result.lipschitz == item.lipschitz else "REFUTED"
    return CheckResult(item.key, verdict, item.provenance, None, None, found,
                       notes=("derived: Lipschitz on this domain" if result.lipschitz
                              else "derived: an exact Jacobian entry tends to infinity along the family"))


CHECKERS: dict[str, Callable] = {
    "kim-l2-fro": _check_kim, "kim-l2-fro-wn": _check_kim, "kim-l2-inf": _check_kim, "kim-l2-inf-wn": _check_kim,
    "kim-not-lipschitz": _check_derived, "castin-theorem": _check_castin_theorem, "castin-code": _check_castin_code,
    "softmax-half": _check_softmax, "lipschitznorm": _check_lipschitznorm, "vuckovic-w1": _check_derived,
    "gelu-1.12": _check_gelu, "power-iteration-5": _check_power_iteration, "l2-untied-global": _check_untied,
    "rope-unrotated": _check_rope_unrotated,
}
CHECKERS.update(RECENT_CHECKERS)


def check(key: str, weights=None, seed: int = 0, budget: float = 20.0) -> CheckResult:
    """Try to refute claim ``key`` on random weights, and on ``weights`` (a Model) if given.

    ``budget``: nominal seconds of witness search, counted in work as in every witness search
    (:mod:`lipbound.numeric.witness.clock`), so that the seed fixes the answer on any machine; claims
    decided by a fixed construction do not use it."""
    item = claim(key)
    return CHECKERS[key](item, seed, budget, weights)

