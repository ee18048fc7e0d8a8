"""Shared machinery of the soundness tests: weights, domains and exact lower bounds.

A bound is sound when no input beats it.  These helpers build concrete weights for
each registry variant, sample points of its domain (random, on the boundary, and
adversarial "tie" configurations where attention is most sensitive), and compute
*exact* local quantities there from dense Jacobians (SVD, exact mixed operator
norms), which are valid lower bounds on the Lipschitz constant.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import sympy as sp

from lipbound.numeric import attention as att
from lipbound.numeric.domains import LayerNormOutputs, TokenBall, TokenDomain
from lipbound.numeric.evaluate import evaluate_bound
from lipbound.numeric.kernels import AttentionMask, DotProduct, L2Distance, ScaledCosine
from lipbound.numeric.model import Head, Layer, LayerNorm
from lipbound.symbolic.assumptions import Assumptions, Ball, LayerNormImage, Unbounded
from lipbound.symbolic.registry import variant

TOKEN_VARIANTS = ("dot-product", "dot-product-nobias", "causal", "l2-tied", "l2-untied", "l2-tied-plain-values",
                  "cosine", "cross-queries", "cross-context", "cross-joint", "multi-head", "multi-head-l2",
                  "residual", "residual-multi-head")
MEASURE_VARIANTS = ("measure-w1", "measure-w1-mean-field", "measure-w1-residual", "measure-cross-queries",
                    "measure-cross-context")
NORMS = ("fro", "2,1", "2,inf", "inf")


@dataclass
class Case:
    """A variant instantiated on concrete weights and a domain."""

    name: str
    norm: str
    domain: str          # "ball", "layernorm", "unbounded"
    n: int
    d: int
    heads: list
    layer: Layer | None
    numeric_domain: TokenDomain | None
    ln: LayerNorm | None
    values: dict
    m: int | None = None

    @property
    def cross(self) -> bool:
        return self.name.startswith("cross") or self.name.startswith("measure-cross")

    @property
    def target(self):
        return self.layer if self.layer is not None else self.heads[0]


def make_case(name: str, norm: str, domain: str, rng: np.random.Generator, n: int, d: int, d_k: int,
              d_v: int, radius: float, scale: float = 1.0, heads: int = 2) -> Case:
    """Random weights for ``name``; ``scale`` multiplies W_Q and W_K (score sharpness)."""

    def matrix(rows, cols, s=1.0):
        return s * rng.standard_normal((rows, cols)) / np.sqrt(rows)

    def head() -> Head:
        W_Q, W_K, W_V = matrix(d, d_k, scale), matrix(d, d_k, scale), matrix(d, d_v)
        biases = dict(b_Q=rng.standard_normal(d_k), b_K=rng.standard_normal(d_k), b_V=rng.standard_normal(d_v))
        if name in ("dot-product-nobias",):
            return Head(W_Q, W_K, W_V)
        if name in ("l2-tied", "multi-head-l2"):
            return Head(W_Q, W_Q, W_V, kernel=L2Distance(), kim_values=True)
        if name == "l2-tied-plain-values":
            return Head(W_Q, W_Q, W_V, kernel=L2Distance())
        if name == "l2-untied":
            return Head(W_Q, W_K, W_V, kernel=L2Distance())
        if name == "cosine":
            return Head(W_Q, W_K, W_V, kernel=ScaledCosine(tau=2.0, eps=0.3))
        return Head(W_Q, W_K, W_V, mask=AttentionMask(causal=name == "causal"), **biases)

    count = heads if name.startswith(("multi-head", "residual-multi-head")) else 1
    head_list = [head() for _ in range(count)]
    layer = None
    if count > 1:
        layer = Layer(tuple(head_list), matrix(count * d_v, d), residual=name.startswith("residual"))
    values = {"tau": 2.0, "epsilon": 0.3} if name == "cosine" else {}
    ln = None
    numeric_domain = None
    if domain == "ball":
        numeric_domain = TokenBall(radius)
    elif domain == "layernorm":
        gamma = rng.uniform(0.3, 1.2, d) * radius / np.sqrt(d)
        ln = LayerNorm(gamma=gamma, beta=0.3 * rng.standard_normal(d), eps=1e-12)
        numeric_domain = LayerNormOutputs(ln)
    return Case(name, norm, domain, n, d, head_list, layer, numeric_domain, ln, values,
                m=max(1, n - 1) if name.startswith(("cross", "measure-cross")) else None)


def assumptions_for(case: Case) -> Assumptions:
    domain = {"ball": Ball(), "layernorm": LayerNormImage(), "unbounded": Unbounded()}[case.domain]
    return Assumptions(domain=domain, norm=case.norm, tied=True if "l2-tied" in case.name or "l2" in case.name and
                       case.name != "l2-untied" else None)


def certified_upper(case: Case) -> float:
    """The variant's bound on these weights, evaluated rigorously (upper end)."""
    result = variant(case.name).derive(assumptions_for(case), case.name)
    assert result.lipschitz, f"{case.name} is not Lipschitz on {case.domain}"
    domain = case.numeric_domain or TokenBall(1.0)  # the unbounded bound does not use R
    evaluation = evaluate_bound(result, case.target, domain, case.n, m=case.m,
                                H=len(case.heads) if case.layer is not None else None, values=case.values)
    assert evaluation.certified
    return evaluation.value


# Points of the domain ---------------------------------------------------------------------
def sample_points(case: Case, rng: np.random.Generator, count: int, rows: int | None = None) -> np.ndarray:
    """``count`` inputs (count, rows, d) in the case's domain: interior, boundary and ties."""
    rows = rows or case.n
    d = case.d
    if case.domain == "unbounded":
        scales = rng.choice([0.1, 1.0, 3.0, 10.0], size=(count, 1, 1))
        points = scales * rng.standard_normal((count, rows, d))
        points[: count // 4, 1:] = points[: count // 4, :1] + 0.3 * rng.standard_normal((count // 4, rows - 1, d))
        return points
    if case.domain == "layernorm":
        z = rng.standard_normal((count, rows, d))
        z -= z.mean(axis=-1, keepdims=True)
        z *= np.sqrt(d) / np.maximum(np.linalg.norm(z, axis=-1, keepdims=True), 1e-300)
        shrink = np.where(rng.random((count, rows, 1)) < 0.5, 1.0, rng.uniform(0.2, 1.0, (count, rows, 1)))
        return case.ln.gamma * z * shrink + case.ln.beta
    R = case.numeric_domain.enclosing_ball()[0]
    directions = rng.standard_normal((count, rows, d))
    directions /= np.linalg.norm(directions, axis=-1, keepdims=True)
    lengths = np.where(rng.random((count, rows, 1)) < 0.6, 1.0, rng.random((count, rows, 1)) ** (1 / d))
    points = R * (1 - 1e-9) * directions * lengths
    ties = count // 3
    if ties and rows >= 2 and d >= 2 and isinstance(case.heads[0].kernel, DotProduct):
        points[:ties] = _ties(case.heads[0], R, rows, ties, rng)
    return points


def _ties(head: Head, R: float, rows: int, count: int, rng) -> np.ndarray:
    """Keys at +-R a, queries at R b with b^T A a = 0: queries split their attention between
    two far-apart keys, where the covariance term of the Jacobian is largest."""
    A = head.A
    out = np.empty((count, rows, head.d))
    for k in range(count):
        a = rng.standard_normal(head.d)
        a /= np.linalg.norm(a)
        b = rng.standard_normal(head.d)
        direction = A @ a
        if np.linalg.norm(direction) > 1e-12:
            b -= direction * (b @ direction) / (direction @ direction)
        b /= max(np.linalg.norm(b), 1e-300)
        out[k, 0], out[k, 1 % rows] = R * a, -R * a
        out[k, 2:] = R * b
    return out * (1 - 1e-9)


# Exact local quantities -------------------------------------------------------------------
def jacobian(case: Case, X: np.ndarray, Y: np.ndarray | None = None, wrt: str = "self") -> np.ndarray:
    """Dense Jacobian (outputs x inputs) at one input."""
    head = case.heads[0]
    if case.layer is not None:
        return att.dense_jacobian(lambda X_, E: att.layer_jvp(case.layer, X_, E), X)
    if wrt == "self":
        return att.dense_jacobian(lambda X_, E: att.self_jvp(head, X_, E), X)
    if wrt == "queries":
        return att.dense_jacobian(lambda Y_, E: att.cross_jvp(head, Y_, np.broadcast_to(X, (len(Y_),) + X.shape),
                                                               E, 0 * np.broadcast_to(X, (len(Y_),) + X.shape)), Y)
    if wrt == "context":
        return att.dense_jacobian(lambda X_, E: att.cross_jvp(head, np.broadcast_to(Y, (len(X_),) + Y.shape), X_,
                                                               0 * np.broadcast_to(Y, (len(X_),) + Y.shape), E), X)
    both = np.concatenate([Y, X])
    m = len(Y)

    def joint(Z, E):
        return att.cross_jvp(head, Z[:, :m], Z[:, m:], E[:, :m], E[:, m:])

    return att.dense_jacobian(joint, both)


def operator_norm(J: np.ndarray, norm: str, rows_out: int, rows_in: int, rng) -> float:
    """Exact (fro, 2,1, inf) or a certified-feasible lower bound (2,inf) of the operator norm."""
    if norm == "fro":
        return float(np.linalg.norm(J, 2))
    if norm == "inf":
        return float(np.max(np.sum(np.abs(J), axis=1)))
    out_dim, in_dim = J.shape[0] // rows_out, J.shape[1] // rows_in
    blocks = J.reshape(rows_out, out_dim, rows_in, in_dim)
    if norm == "2,1":
        return float(max(sum(np.linalg.norm(blocks[i, :, j, :], 2) for i in range(rows_out))
                         for j in range(rows_in)))
    best = 0.0
    for i in range(rows_out):
        E = rng.standard_normal((4, rows_in, in_dim))   # four starts, ascending side by side
        for _ in range(20):  # alternating ascent; every iterate is feasible
            E /= np.maximum(np.linalg.norm(E, axis=2, keepdims=True), 1e-300)
            y = np.einsum("ajb,sjb->sa", blocks[i], E)
            lengths = np.linalg.norm(y, axis=1, keepdims=True)
            best = max(best, float(np.max(lengths)))
            y /= np.maximum(lengths, 1e-300)
            E = np.einsum("ajb,sa->sjb", blocks[i], y)
    return best


def local_lower_bound(case: Case, X: np.ndarray, rng, Y: np.ndarray | None = None) -> float:
    """A lower bound on the Lipschitz constant from the Jacobian at X (and Y for cross)."""
    if case.cross:
        wrt = case.name.split("-")[-1]
        J = jacobian(case, X, Y, wrt)
        rows_in = {"queries": len(Y), "context": len(X), "joint": len(X) + len(Y)}[wrt]
        return operator_norm(J, case.norm, len(Y), rows_in, rng)
    J = jacobian(case, X)
    return operator_norm(J, case.norm, len(X), len(X), rng)


def climb(case: Case, X: np.ndarray, rng, steps: int = 30, Y=None) -> float:
    """Random local search from X, kept inside the domain; returns the best lower bound."""
    best = local_lower_bound(case, X, rng, Y)
    for step in range(steps):
        candidate = X + (0.3 / (1 + step / 5)) * rng.standard_normal(X.shape) * _spread(case)
        candidate = project(case, candidate)
        value = local_lower_bound(case, candidate, rng, Y)
        if value > best:
            best, X = value, candidate
    return best


def _spread(case: Case) -> float:
    if case.numeric_domain is None:
        return 1.0
    return case.numeric_domain.enclosing_ball()[0]


def project(case: Case, X: np.ndarray) -> np.ndarray:
    """Back into the domain: the closed ball, or the LayerNorm image, or nothing."""
    if case.domain == "unbounded":
        return X
    if case.domain == "layernorm":
        z = (X - case.ln.beta) / case.ln.gamma
        z -= z.mean(axis=-1, keepdims=True)
        norms = np.maximum(np.linalg.norm(z, axis=-1, keepdims=True), 1e-300)
        z *= np.minimum(1.0, np.sqrt(case.d) / norms)
        return case.ln.gamma * z + case.ln.beta
    R = case.numeric_domain.enclosing_ball()[0]
    norms = np.linalg.norm(X, axis=-1, keepdims=True)
    return X * np.minimum(1.0, R * (1 - 1e-9) / np.maximum(norms, 1e-300))


_ = sp
