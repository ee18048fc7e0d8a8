"""Every head kind a loader or format can build gets its own theorem, and the certified number
holds against an independent Jacobian.

A head's kind is its attention kernel (dot product, L2 distance, scaled cosine with theorems;
every other registered kernel is enumerated too, and must be refused), whether its score has
biases, whether W_Q = W_K, whether its values go through A (Kim et al. 2021), its causal mask,
and the argument the constant is taken in (self-attention; cross-attention in the queries, the
context, or jointly).  The plain .npz format can store all of them (the BERT loader builds
biased dot-product heads, one of them), so the enumeration below is every kind that exists.

For each kind, on generated heads and a ball or LayerNorm domain, the certified constant of
:func:`lipbound.numeric.certify.head_constant` is compared with lower bounds on the true constant
computed here without lipbound's forward pass or JVP: a plain per-token forward pass written from
the definitions, central finite differences for the Jacobian, and the exact induced norms of
that matrix (spectral; l_inf row sums) or iterated lower bounds ((2,1), (2,inf)); for W1, exact
Wasserstein-1 between small uniform measures by enumerating permutations.  The worst ratio
lower bound / certified number is printed; it must never exceed 1.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from test_kernels import head_reference

from lipbound.errors import AssumptionError
from lipbound.numeric.attention import dense_jacobian, self_jvp
from lipbound.numeric.certify import head_constant
from lipbound.numeric.dispatch import ROLES, head_facts
from lipbound.numeric.domains import LayerNormOutputs, TokenBall
from lipbound.numeric.kernels import (
    KERNELS,
    AttentionMask,
    CustomKernel,
    DotProduct,
    FeatureMap,
    L2Distance,
    QKNorm,
    Rotary,
    ScaledCosine,
    Sigmoid,
)
from lipbound.numeric.model import Head, Layer, LayerNorm, Model, TransformerLayer, load_weights, save_plain
from lipbound.numeric.recheck import recheck
from lipbound.numeric.witness import search_witness

NORMS = ("fro", "2,1", "2,inf", "inf")
MARGIN = 1e-6  # finite differences are accurate to about 1e-9 relative here


def head_kinds():
    """(score, biased, tied, kim_values, causal) for every head the plain format can store."""
    for score in ("dot", "l2", "cosine"):
        for biased, tied, causal in itertools.product((False, True), repeat=3):
            for kim in ((False, True) if score == "l2" else (False,)):
                yield score, biased, tied, kim, causal


def build_head(kind, seed: int, d: int = 3, d_k: int = 2, d_v: int = 2) -> Head:
    score, biased, tied, kim, causal = kind
    rng = np.random.default_rng(seed)
    W_Q = rng.standard_normal((d, d_k)) * 0.8
    W_K = W_Q.copy() if tied else rng.standard_normal((d, d_k)) * 0.8
    biases = {"b_Q": rng.standard_normal(d_k) * 0.5, "b_K": rng.standard_normal(d_k) * 0.5} if biased else {}
    kernel = {"dot": DotProduct(), "l2": L2Distance(), "cosine": ScaledCosine(tau=1.5, eps=0.7)}[score]
    return Head(W_Q, W_K, rng.standard_normal((d, d_v)), b_V=rng.standard_normal(d_v), kernel=kernel,
                mask=AttentionMask(causal=causal), kim_values=kim, **biases)


# An independent forward pass, written from the definitions ------------------------------------
def reference_forward(head: Head, Y: np.ndarray, X: np.ndarray) -> np.ndarray:
    """Queries Y (m, d) attend to X (n, d); returns (m, d_v).  Loops, no lipbound code."""
    if head.kim_values:
        values = X @ (head.W_Q @ head.W_Q.T @ head.W_V) / math.sqrt(head.d_k) + head.b_V
    else:
        values = X @ head.W_V + head.b_V
    out = []
    for i, y in enumerate(Y):
        q = y @ head.W_Q + head.b_Q
        scores = []
        for j, x in enumerate(X):
            if head.causal and j > i:
                continue
            k = x @ head.W_K + head.b_K
            if isinstance(head.kernel, DotProduct):
                s = q @ k / math.sqrt(head.d_k)
            elif isinstance(head.kernel, L2Distance):
                s = -np.sum((q - k) ** 2) / math.sqrt(head.d_k)
            else:
                tau, eps = head.kernel.tau, head.kernel.eps
                s = tau * (q @ k) / (math.sqrt(q @ q + eps) * math.sqrt(k @ k + eps))
            scores.append(s)
        scores = np.array(scores)
        weights = np.exp(scores - scores.max())
        weights /= weights.sum()
        out.append(weights @ values[: len(weights)])
    return np.array(out)


def finite_difference_jacobian(function, Z: np.ndarray) -> np.ndarray:
    """Central differences of ``function`` at Z: outputs (flattened) by inputs (flattened)."""
    flat = Z.ravel()
    columns = []
    for index in range(flat.size):
        h = 1e-6 * (1.0 + abs(flat[index]))
        step = np.zeros_like(flat)
        step[index] = h
        plus = function((flat + step).reshape(Z.shape)).ravel()
        minus = function((flat - step).reshape(Z.shape)).ravel()
        columns.append((plus - minus) / (2 * h))
    return np.array(columns).T


def induced_norm_lower(J: np.ndarray, rows: int, cols: int, out_dim: int, in_dim: int, norm: str, rng) -> float:
    """A lower bound on the norm of J as a map between token matrices (rows x out_dim <- cols x in_dim)."""
    if norm == "fro":
        return float(np.linalg.norm(J, 2))
    if norm == "inf":
        return float(np.max(np.sum(np.abs(J), axis=1)))
    blocks = J.reshape(rows, out_dim, cols, in_dim)
    best = 0.0
    if norm == "2,1":  # max_j sup_{||u|| = 1} sum_i ||J_ij u||
        for j in range(cols):
            for _ in range(3):
                u = rng.standard_normal(in_dim)
                for _ in range(30):
                    u /= np.linalg.norm(u)
                    images = blocks[:, :, j, :] @ u                 # J_ij u for every i, (rows, out_dim)
                    lengths = np.linalg.norm(images, axis=1)
                    best = max(best, float(np.sum(lengths)))
                    u = np.einsum("ia,iab->b", images / np.maximum(lengths, 1e-300)[:, None], blocks[:, :, j, :])
                    if not np.any(u):
                        break
        return best
    for i in range(rows):  # (2,inf): max_i sup_{||e_k|| <= 1} ||sum_k J_ik e_k||
        for _ in range(3):
            E = rng.standard_normal((cols, in_dim))
            for _ in range(30):
                E /= np.maximum(np.linalg.norm(E, axis=1, keepdims=True), 1e-300)
                image = np.einsum("akb,kb->a", blocks[i], E)     # sum_k J_ik e_k
                best = max(best, float(np.linalg.norm(image)))
                v = image / max(np.linalg.norm(image), 1e-300)
                E = np.einsum("akb,a->kb", blocks[i], v)
    return best


def points(domain, count: int, n: int, d: int, rng) -> list[np.ndarray]:
    """Inputs in the domain: random, on the boundary, and with two tokens far apart (softmax ties)."""
    R, c = domain.enclosing_ball()
    c = np.zeros(d) if c is None else c
    out = []
    for index in range(count):
        Z = rng.standard_normal((n, d))
        Z /= np.linalg.norm(Z, axis=1, keepdims=True)
        radii = np.ones((n, 1)) if index % 3 == 0 else rng.uniform(0.3, 1.0, (n, 1))
        if index % 3 == 2 and n >= 2:
            Z[1] = -Z[0]
        X = Z * radii * R
        if isinstance(domain, LayerNormOutputs):  # gamma * z + beta with z centred, ||z|| <= sqrt(d)
            centred = X - X.mean(axis=1, keepdims=True)
            scale = np.minimum(1.0, math.sqrt(d) / np.maximum(np.linalg.norm(centred, axis=1, keepdims=True), 1e-12))
            X = domain.norm.gamma * centred * scale * (1 - 1e-9)
        out.append(X * (1 - 1e-9) + c)
    return out


def w1_uniform(A: np.ndarray, B: np.ndarray) -> float:
    """Exact W1 between uniform measures on the rows of A and B (equal sizes), by permutations."""
    n = len(A)
    return min(sum(np.linalg.norm(A[i] - B[p[i]]) for i in range(n)) for p in itertools.permutations(range(n))) / n


def lower_bound(head: Head, norm: str, role: str, domain, n: int, m: int, rng, count: int) -> float:
    best = 0.0
    d, d_v = head.d, head.d_v
    for _index, X in enumerate(points(domain, count, n, d, rng)):
        Y = points(domain, 1, m, d, rng)[0] if role != "self" else X
        if norm == "w1":
            E = rng.standard_normal((n, d)) * 1e-4
            moved = X + E
            if not np.all(domain.contains(moved)):
                continue
            moved_out = w1_uniform(reference_forward(head, X, X), reference_forward(head, moved, moved))
            ratio = moved_out / w1_uniform(X, moved)
            best = max(best, ratio)
            continue
        if role == "self":
            function, Z, rows, cols = (lambda Z: reference_forward(head, Z, Z)), X, n, n
        elif role == "cross-queries":
            function, Z, rows, cols = (lambda Z: reference_forward(head, Z, X)), Y, m, m
        elif role == "cross-context":
            function, Z, rows, cols = (lambda Z: reference_forward(head, Y, Z)), X, m, n
        else:
            def function(Z):
                return reference_forward(head, Z[:m], Z[m:])
            Z, rows, cols = np.concatenate([Y, X]), m, m + n
        J = finite_difference_jacobian(function, Z)
        best = max(best, induced_norm_lower(J, rows, cols, d_v, d, norm, rng))
    return best * (1 - MARGIN)


def _domain(kind_index: int, d: int, rng):
    if kind_index % 2:
        return LayerNormOutputs(LayerNorm(1 + rng.uniform(-0.5, 0.5, d), rng.standard_normal(d) * 0.3, 1e-5))
    return TokenBall(float(rng.uniform(0.5, 2.5)), rng.standard_normal(d) * 0.3 if kind_index % 4 == 0 else None)


WORST = {"ratio": 0.0, "case": None, "cases": 0}


@pytest.mark.parametrize("kind", list(head_kinds()), ids=lambda k: "-".join(
    [k[0], "bias" if k[1] else "nobias", "tied" if k[2] else "untied", "kim" if k[3] else "plain",
     "causal" if k[4] else "full"]))
def test_every_head_kind_is_certified_by_its_own_theorem(kind, tmp_path):
    index = list(head_kinds()).index(kind)
    rng = np.random.default_rng(1000 + index)
    head = build_head(kind, seed=index)
    # the plain format stores the kind, and the loaded head has the same facts
    model = Model("kinds", {0: TransformerLayer(0, Layer((head,), np.eye(head.d_v, head.d)))}, 1, head.d)
    loaded = load_weights(save_plain(model, tmp_path / "kind.npz")).layer(0).heads[0]
    assert head_facts(loaded) == head_facts(head)
    domain = _domain(index, head.d, rng)
    roles = ("self",) if head.causal else ROLES
    for role in roles:
        n, m = (3, 2) if role != "self" else (3, 3)
        for norm in NORMS:
            certified = head_constant(loaded, norm, domain, n, m=m, role=role)
            assert certified.certified, (kind, role, norm, certified.reason)
            found = lower_bound(head, norm, role, domain, n, m, rng, count=4)
            ratio = found / certified.value
            WORST["cases"] += 1
            if ratio > WORST["ratio"]:
                WORST.update(ratio=ratio, case=(kind, role, norm))
            assert found <= certified.value, (kind, role, norm, found, certified.value)
    if isinstance(head.kernel, DotProduct) and not head.causal:
        certified = head_constant(loaded, "w1", domain, 3)
        assert lower_bound(head, "w1", "self", domain, 3, 3, rng, count=4) <= certified.value
    else:
        with pytest.raises(AssumptionError, match="no theorem applies"):
            head_constant(loaded, "w1", domain, 3)


def test_worst_ratio_is_reported():
    """Printed for the record: how close the independent lower bounds come to the certified numbers."""
    print(f"\nhead kinds: {WORST['cases']} (kind, role, norm) cases; worst lower bound / certified = "
          f"{WORST['ratio']:.3f} at {WORST['case']}")
    assert WORST["ratio"] <= 1.0


def test_the_dot_product_theorem_no_longer_certifies_an_l2_head():
    """Regression: verify bounded a plain-format L2 head by the dot-product theorem (1.0, while the
    Jacobian at X = (2, -2) has spectral norm 7)."""
    head = Head(np.zeros((1, 1)), np.ones((1, 1)), np.ones((1, 1)), kernel=L2Distance())
    X = np.array([[2.0], [-2.0]])
    J = finite_difference_jacobian(lambda Z: reference_forward(head, Z, Z), X)
    np.testing.assert_allclose(np.linalg.norm(J, 2), 7.0, rtol=1e-6)
    certified = head_constant(head, "fro", TokenBall(2.0), 2)
    assert certified.value >= 7.0 and "l2" in certified.provenance


# Every registered kernel --------------------------------------------------------------------------------
def kernel_kinds():
    """One head kind per registered attention kernel (lipbound.numeric.kernels.KERNELS): the three with
    theorems are enumerated above; the others must be refused by dispatch, never bound by another
    kernel's theorem, while the engine, the re-check and the witness search handle them."""
    rng = np.random.default_rng(5)
    return {"dot": DotProduct(), "l2": L2Distance(), "cosine": ScaledCosine(tau=1.5, eps=0.7),
            "rope": Rotary(base=30.0),
            "qk-norm": QKNorm(1 + 0.2 * rng.standard_normal(2), 1 + 0.2 * rng.standard_normal(2),
                              1e-3, rotary=Rotary(base=30.0)),
            "sigmoid": Sigmoid(), "linear": FeatureMap(), "custom": CustomKernel("Inner(q, k)**2 / d_k")}


def test_every_registered_kernel_is_in_the_soundness_suite():
    """A kernel added to KERNELS without a head kind here fails this test: add it to kernel_kinds (and,
    when its theorem is dispatched, to head_kinds with an independent lower bound)."""
    assert {type(kernel) for kernel in kernel_kinds().values()} == set(KERNELS.values())
    assert set(kernel_kinds()) == set(KERNELS)
    from test_decoder_heads import soundness_kernels  # rotary and QK-norm heads: the decoder soundness test
    covered = {kind[0] for kind in head_kinds()} | soundness_kernels()
    assert covered == {name for name, kernel in kernel_kinds().items() if _has_theorem(kernel)}


def _has_theorem(kernel) -> bool:
    try:
        head_facts(Head(np.eye(2), np.eye(2), np.eye(2), kernel=kernel))
    except AssumptionError:
        return False
    return True


@pytest.mark.parametrize("name", [name for name, kernel in kernel_kinds().items() if not _has_theorem(kernel)])
def test_kernels_without_a_theorem_are_refused_and_handled_exactly(name):
    """No certified number for them (refused, never another kernel's bound); their Jacobian is exact
    against finite differences of the independent reference; a witness re-checks in high precision."""
    kernel = kernel_kinds()[name]
    rng = np.random.default_rng(list(KERNELS).index(name))
    head = Head(rng.standard_normal((3, 2)), rng.standard_normal((3, 2)), rng.standard_normal((3, 2)),
                0.5 * rng.standard_normal(2), 0.5 * rng.standard_normal(2), rng.standard_normal(2), kernel=kernel,
                mask=AttentionMask(causal=True))
    domain = TokenBall(1.5)
    for norm in NORMS:
        with pytest.raises(AssumptionError, match="no theorem applies"):
            head_constant(head, norm, domain, 3)
    X = points(domain, 1, 3, 3, rng)[0]
    J = finite_difference_jacobian(lambda Z: head_reference(head, Z, Z), X)
    np.testing.assert_allclose(dense_jacobian(lambda Y, E: self_jvp(head, Y, E), X), J, rtol=1e-6, atol=1e-8)
    witness = search_witness(head, domain=domain, n=3, budget_seconds=0.1, seed=0)
    result = recheck(witness, head)
    assert result.valid and result.lower > 0, result.message
