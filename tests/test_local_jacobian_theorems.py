"""The theorems on an attention layer's Jacobian over a ball (lipbound.symbolic.local_jacobian) against sampled points.

Each statement is evaluated through the compiled interval path the numeric layer uses (``evaluate_theorem``) with its
quantities computed here from their hypotheses, and compared with what it bounds: the Jacobian written path by path
(tests/test_jacobian_forms.py) at sampled points of small random layers, and the pairs' half ranges and the
variances of a few points for the covering form, whose equality case shows that a smaller form would fail.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_jacobian_forms import _jacobian
from test_relational import _ball_points, _layer, _layer_forward

from lipbound.local.bounds import evaluate_theorem
from lipbound.local.enclosed import EnclosedAttention
from lipbound.local.joint_heads import JointHeads
from lipbound.local.relational import RelationalAttention
from lipbound.symbolic import local_jacobian as T
from lipbound.symbolic.local import LOCAL_THEOREMS


def test_the_theorems_are_local_theorems_with_proofs():
    for theorem in T.JACOBIAN_THEOREMS.values():
        assert LOCAL_THEOREMS[theorem.id] is theorem
        assert theorem.proof.steps and theorem.proof.hypotheses


def _path_sums(target, Y) -> float:
    """``sum_h (nu_h + kappa^Q_h + kappa^K_h)`` at Y, from the hypotheses of ``local-attention-jacobian``."""
    _, weights, _ = _layer_forward(target, Y)
    total = 0.0
    for h, head in enumerate(target.heads):
        c = 1 / np.sqrt(head.W_Q.shape[1])
        P = weights[h]
        Q, K, V = Y @ head.W_Q + head.b_Q, Y @ head.W_K + head.b_K, Y @ head.V + head.b_V
        W_O = target.output_block(h)
        U = V @ W_O
        b = Q @ head.W_K.T
        nu = np.sqrt(P.sum(axis=0).max()) * np.linalg.norm(head.V @ W_O, 2)
        kappa_q = c * max(np.linalg.norm(head.W_Q @ K.T @ (np.diag(p) - np.outer(p, p)) @ U, 2) for p in P)
        spread = max(np.linalg.norm(U[j] - U[m]) for j in range(len(U)) for m in range(len(U)))
        kappa_k = c * np.sqrt((P * np.sum(b ** 2, axis=1)[:, None]).sum(axis=0).max()) * spread / 2
        total += nu + kappa_q + kappa_k
    return total


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 5), st.floats(1e-3, 2.0), st.floats(0.3, 2.0), st.integers(1, 3))
def test_jacobian_theorems_hold_at_sampled_points(seed, n, eps, scale, heads):
    target, rng = _layer(seed, scale=scale, heads=heads)
    X = rng.standard_normal((n, 6))
    E = EnclosedAttention(target, X)
    joint = JointHeads(target, E)
    lam_s, lam_t = joint.tops(joint.terms(eps, RelationalAttention(target, X, eps, E).weights))
    joined = float(evaluate_theorem(T.heads_joint(), **{r"\lambda_S": np.float64(lam_s),
                                                        r"\lambda_T": np.float64(lam_t)}))
    name = r"\textstyle\sum_h (\nu_h + \kappa^Q_h + \kappa^K_h)"
    for Y in _ball_points(rng, X, eps, 4) + [X]:
        norm = np.linalg.norm(_jacobian(target, Y), 2)
        assert norm <= joined + 1e-6 * (1 + norm)
        path_by_path = float(evaluate_theorem(T.attention_jacobian(), **{name: np.float64(_path_sums(target, Y))}))
        assert norm <= path_by_path * (1 + 1e-9) + 1e-9


def _covering_bound(points: np.ndarray, centre: np.ndarray, x: np.ndarray, ridge: float, s2: float = 1 - 1e-4) -> float:
    """The statement of ``local-jacobian-heads-covering`` at x for the rows ``points - centre``, with M the inverse of
    N scaled by ``s2^(-1/2)`` (so that ``M N M - s2 M`` is PSD) and mu at its least."""
    rows = points - centre
    n = len(points)
    N = rows @ rows.T + ridge * np.eye(n)
    M = np.linalg.inv(N) / s2 ** 0.5
    first, second = np.triu_indices(n, 1)
    mu = max(np.sum((points[first] - points[second]) ** 2, axis=1) + 2 * ridge) / (4 * s2)
    form = np.float64(x @ rows.T @ M @ rows @ x)
    return float(evaluate_theorem(T.heads_covering(), **{r"\mu": np.float64(mu), r"x C^\top M C x^\top": form}))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 7), st.integers(2, 9), st.floats(1e-2, 10.0))
def test_covering_theorem_holds_for_pairs_and_variances_and_is_reached(seed, n, d, ridge_share):
    rng = np.random.default_rng(seed)
    points = rng.standard_normal((n, d)) * rng.uniform(0.1, 3.0, d)
    centre = points[0] if seed % 2 else np.zeros(d)
    rows = points - centre
    ridge = ridge_share * np.linalg.eigvalsh(rows @ rows.T)[-1]
    first, second = np.triu_indices(n, 1)
    for x in [rng.standard_normal(d) for _ in range(6)] + list(points[first] - points[second]):
        bound = _covering_bound(points, centre, x, ridge)
        values = points @ x
        assert (values.max() - values.min()) ** 2 / 4 <= bound * (1 + 1e-9) + 1e-12
        p = rng.dirichlet(np.full(n, 0.3))
        assert p @ values ** 2 - (p @ values) ** 2 <= bound * (1 + 1e-9) + 1e-12
    # equality: z = C x = N d for the widest pair in N's norm (C = the points, of full row rank when n <= d)
    if n <= d and not seed % 2:
        N = rows @ rows.T + ridge * np.eye(n)
        pairs = np.zeros((len(first), n))
        pairs[np.arange(len(first)), first], pairs[np.arange(len(first)), second] = 1.0, -1.0
        widest = pairs[np.argmax(np.einsum("pi,ij,pj->p", pairs, N, pairs))]
        x = np.linalg.lstsq(rows, N @ widest, rcond=None)[0]
        values = points @ x
        assert (values.max() - values.min()) ** 2 / 4 >= 0.999 * _covering_bound(points, centre, x, ridge)
