"""The second-order local theorems (lipbound.symbolic.local_second_order) against sampled points.

Each statement is evaluated through the same compiled interval path the numeric layer uses and compared with the
quantity it bounds, computed directly at sampled points of its set; an equality case shows that a weaker
statement would fail.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from lipbound.local.bounds import evaluate_theorem
from lipbound.symbolic import local_second_order as T
from lipbound.symbolic.local import LOCAL_THEOREMS

SQRT_2PI = math.sqrt(2 * math.pi)


def gelu_first(x):
    return 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2))) + x * np.exp(-x**2 / 2) / SQRT_2PI


def gelu_second(x):
    return np.exp(-x**2 / 2) / SQRT_2PI * (2 - x**2)


#: |GELU'''| is at most this (its largest magnitude is about 0.7788, at x^2 = (7 - sqrt 33) / 2)
GELU_THIRD_CAP = 0.7789


def _top(matrix: np.ndarray) -> float:
    return float(np.linalg.eigvalsh((matrix + matrix.T) / 2)[-1])


def _remainder_bound(theorem, R, S, W1, A_gram, B_gram, names=(r"\lambda_A", r"\lambda_B")):
    root = np.sqrt(S)
    lam_a = _top(root[:, None] * (W1.T @ W1 * A_gram) * root[None, :])
    lam_b = _top(root[:, None] * (W1.T @ W1 * B_gram) * root[None, :])
    return lam_a, lam_b, float(evaluate_theorem(theorem, R=np.float64(R), **{names[0]: np.float64(lam_a),
                                                                               names[1]: np.float64(lam_b)}))


def test_the_new_theorems_are_local_theorems_with_proofs():
    for theorem in T.SECOND_ORDER_THEOREMS.values():
        assert LOCAL_THEOREMS[theorem.id] is theorem
        assert theorem.proof.steps and theorem.proof.hypotheses


@pytest.mark.parametrize("seed", range(4))
def test_slope_remainder_joint_holds_for_gelu_at_sampled_directions(seed):
    rng = np.random.default_rng(seed)
    d, m, d_a, d_b = 5, 12, 4, 3
    W1, A, B = rng.normal(size=(d, m)), rng.normal(size=(d_a, m)), rng.normal(size=(m, d_b))
    h, R = rng.normal(size=m), 0.7
    S = np.full(m, GELU_THIRD_CAP)
    *_, bound = _remainder_bound(T.slope_remainder_joint(), R, S, W1, A.T @ A, B @ B.T)
    worst = 0.0
    for _ in range(200):
        e = rng.normal(size=d)
        e *= R / np.linalg.norm(e)
        t = e @ W1
        rho = gelu_first(h + t) - gelu_first(h) - gelu_second(h) * t
        worst = max(worst, float(np.linalg.norm(A @ np.diag(rho) @ B, 2)))
    assert 0 < worst <= bound


def test_slope_remainder_joint_is_attained_by_one_neuron_with_a_constant_third_derivative():
    """act = x^3 / 6 has act''' = 1, so rho = (e . w)^2 / 2 exactly; with e along w the bound is an equality."""
    rng = np.random.default_rng(7)
    w, a, b, R = rng.normal(size=(3, 1)), rng.normal(size=(4, 1)), rng.normal(size=(1, 2)), 0.9
    *_, bound = _remainder_bound(T.slope_remainder_joint(), R, np.ones(1), w, a.T @ a, b @ b.T)
    e = R * w[:, 0] / np.linalg.norm(w)
    rho = (e @ w) ** 2 / 2
    exact = float(np.linalg.norm(a @ np.diag(rho) @ b, 2))
    assert exact == pytest.approx(bound, rel=1e-12)
    assert bound >= exact


@pytest.mark.parametrize("seed", range(3))
def test_feedforward_curvature_joint_holds_at_sampled_points_of_the_ball(seed):
    rng = np.random.default_rng(10 + seed)
    d, m, R = 4, 10, 0.5
    W1, W2, b1 = rng.normal(size=(d, m)), rng.normal(size=(m, d)), rng.normal(size=m)
    x = rng.normal(size=d)
    g = gelu_second(x @ W1 + b1)
    G1, G2 = W1.T @ W1, W2 @ W2.T
    # Lambda of local-feedforward-curvature: the smaller of the two top eigenvalues
    Lam = min(_top(W1 @ np.diag(g) @ (G1 * G2) @ np.diag(g) @ W1.T),
              _top(W2.T @ np.diag(g) @ (G1 * G1) @ np.diag(g) @ W2))
    S = np.full(m, GELU_THIRD_CAP)
    root = np.sqrt(S)
    lam_1, lam_2 = (_top(root[:, None] * M * root[None, :]) for M in (G1 * G1, G1 * G2))
    bound = float(evaluate_theorem(T.feedforward_curvature_joint(), R=np.float64(R),
                                   **{r"\Lambda^{1/2}": np.float64(math.sqrt(Lam)), r"\lambda_1": np.float64(lam_1),
                                      r"\lambda_2": np.float64(lam_2)}))

    def jacobian(point):
        return W1 @ np.diag(gelu_first(point @ W1 + b1)) @ W2

    worst = 0.0
    for _ in range(200):
        e = rng.normal(size=d)
        e *= R * rng.uniform(0.5, 1) / np.linalg.norm(e)
        worst = max(worst, float(np.linalg.norm(jacobian(x + e) - jacobian(x), 2)))
    assert 0 < worst <= bound


def test_attention_token_reach_holds_on_a_small_attention_layer():
    """One head on n = 4 tokens: each token's movement on a Frobenius ball against c_i theta eps plus the largest
    sampled remainder of that token (the theorem's hypothesis on rest_i, met by construction)."""
    rng = np.random.default_rng(3)
    n, d = 4, 3
    WQ, WK, WV = (rng.normal(size=(d, d)) for _ in range(3))
    X, eps = rng.normal(size=(n, d)), 0.05

    def attention(Y):
        s = (Y @ WQ) @ (Y @ WK).T / math.sqrt(d)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        return Y + (p / p.sum(axis=1, keepdims=True)) @ (Y @ WV)

    step = 1e-6
    jac = np.stack([((attention(X + step * E) - attention(X - step * E)) / (2 * step)).ravel()
                    for E in np.eye(n * d).reshape(n * d, n, d)])      # rows: inputs, columns: outputs
    columns = [float(np.linalg.norm(jac[:, i * d:(i + 1) * d], 2)) for i in range(n)]
    points = [eps * E / np.linalg.norm(E) for E in rng.normal(size=(300, n, d))]
    moves = np.array([np.linalg.norm(attention(X + D) - attention(X), axis=1) for D in points])
    rests = np.array([np.linalg.norm(attention(X + D) - attention(X) - (D.ravel() @ jac).reshape(n, d), axis=1)
                      for D in points]).max(axis=0)
    for i in range(n):
        bound = float(evaluate_theorem(T.attention_token_reach(), c_i=np.float64(columns[i] * (1 + 1e-6)),
                                       **{r"\theta_U": np.float64(1.0), r"\epsilon": np.float64(eps),
                                          r"\operatorname{rest}_i": np.float64(rests[i])}))
        assert moves[:, i].max() <= bound
