"""The witness starts of rotary layers built from their heads (lipbound.numeric.witness.layer_starts): several heads'
keys tied at one input with a spread whose images through ``W_O`` add, the heads scouted alone through their blocks
of ``W_O``, and the layer witness they lead to, re-checked against a Jacobian computed here."""

from __future__ import annotations

import numpy as np
import pytest
from test_decoder_heads import _layer, _rotate, reference_map, reference_norm

from lipbound.numeric.domains import RMSNormOutputs, TokenBall
from lipbound.numeric.kernels import DotProduct, QKNorm
from lipbound.numeric.model import Head, Layer, RMSNorm
from lipbound.numeric.recheck import recheck
from lipbound.numeric.witness import search_witness
from lipbound.numeric.witness.kernel_starts import head_ties, joint_ties, kernel_starts
from lipbound.numeric.witness.layer_starts import aligned_spread, head_problem, layer_starts, scout_heads, scouted
from lipbound.numeric.witness.problem import SearchProblem

FAMILIES = {"head-scout", "joint-tied", "head-combined", "random", "continuation"}


def _setting(seed: int, d: int = 24, d_k: int = 4, heads: int = 3, groups: int = 3):
    rng = np.random.default_rng(seed)
    layer = _layer("llama", rng, d, d_k, heads, groups, 1.0)
    return rng, layer, RMSNormOutputs(RMSNorm(rng.uniform(0.2, 1.0, d), 1e-5))


def _scores(head, tokens: np.ndarray) -> tuple[list, list]:
    """Rotated queries and keys of every token at its position (the rotations written here), scaled by 1/sqrt(d_k)."""
    kernel, d_k = head.kernel, head.d_k
    dims = kernel.rotated(d_k)
    q = [_rotate(x @ head.W_Q, i, kernel.base, dims, kernel.pairing) / np.sqrt(d_k) for i, x in enumerate(tokens)]
    k = [_rotate(x @ head.W_K, j, kernel.base, dims, kernel.pairing) for j, x in enumerate(tokens)]
    return q, k


@pytest.mark.parametrize("tied", [[0, 1], [0, 2], [0, 1, 2]])
def test_joint_ties_tie_the_two_keys_for_every_query_of_every_head_at_once(tied):
    """:func:`joint_ties`: the input lies in the domain, tokens 0 and 1 score alike for every query 2..n-1 of every
    head tied (scores here, at the queries' own offsets), and the two keys differ in what every tied head's value map
    through its block of ``W_O`` sees (the tie is not had by putting both keys on one point)."""
    _, layer, domain = _setting(31)
    n = 5
    problem = SearchProblem(layer, "self", domain, None, n, None)
    X = problem.lift(joint_ties(problem, tied))[0]
    assert len(X) == 1 and np.all(domain.contains(X[0]))
    tokens = X[0]
    for h in tied:
        head = layer.heads[h]
        q, k = _scores(head, tokens)
        for i in range(2, n):
            np.testing.assert_allclose(q[i] @ k[0], q[i] @ k[1], rtol=1e-7, atol=1e-9 * abs(q[i] @ k[0]))
        spread = (tokens[0] - tokens[1]) @ head.W_V @ layer.output_block(h)
        assert np.linalg.norm(spread) > 1e-3 * np.linalg.norm(tokens[0] - tokens[1]) * np.linalg.norm(
            head.W_V @ layer.output_block(h), 2)


def test_the_aligned_spread_avoids_the_frame_and_adds_heads_whose_images_agree():
    """:func:`aligned_spread` is a unit vector orthogonal to the frame; it is never below the strongest head alone
    (``max_h sigma_h ||P M_h||``, P the frame's complement), nor below random unit vectors of the complement; and two
    heads with one value map add in quadrature: ``(sigma_1^2 + sigma_2^2)^(1/2) ||P M||``, where orthogonal images
    give the stronger head alone."""
    rng = np.random.default_rng(5)
    width, out = 12, 9
    frame = np.linalg.qr(rng.standard_normal((width, 3)))[0]
    complement = np.eye(width) - frame @ frame.T

    def gain(a, maps, strengths):
        z = np.linalg.svd(np.array([s * (a @ M) for s, M in zip(strengths, maps)]).T, full_matrices=False)[0][:, 0]
        return float(np.sqrt(sum((s * (a @ M @ z)) ** 2 for s, M in zip(strengths, maps))))

    maps = [rng.standard_normal((width, out)) for _ in range(3)]
    strengths = np.array([1.0, 2.0, 0.5])
    a = aligned_spread(maps, strengths, frame)
    assert abs(np.linalg.norm(a) - 1) < 1e-12 and np.linalg.norm(frame.T @ a) < 1e-12
    best = gain(a, maps, strengths)
    assert best >= max(s * np.linalg.norm(complement @ M, 2) for s, M in zip(strengths, maps)) * (1 - 1e-9)
    for _ in range(200):
        r = complement @ rng.standard_normal(width)
        assert gain(r / np.linalg.norm(r), maps, strengths) <= best * (1 + 1e-9)
    shared = rng.standard_normal((width, out))
    a = aligned_spread([shared, shared], np.array([3.0, 4.0]), frame)
    np.testing.assert_allclose(gain(a, [shared, shared], [3.0, 4.0]), 5 * np.linalg.norm(complement @ shared, 2),
                               rtol=1e-9)
    # images in orthogonal output spaces do not add: the stronger head alone
    left, right = np.zeros((width, 2 * out)), np.zeros((width, 2 * out))
    left[:, :out], right[:, out:] = shared, shared
    a = aligned_spread([left, right], np.array([3.0, 4.0]), frame)
    np.testing.assert_allclose(gain(a, [left, right], [3.0, 4.0]), 4 * np.linalg.norm(complement @ shared, 2),
                               rtol=1e-9)


def test_scouts_and_layer_starts_are_points_of_the_domain_and_scouts_report_their_heads_values():
    """Every start of a scouted layer lifts to tokens of the RMSNorm image; each scout's value is its head's
    Jacobian norm through its block of ``W_O`` at its tokens (recomputed in the head's own problem)."""
    rng, layer, domain = _setting(37, heads=4, groups=2)
    problem = SearchProblem(layer, "self", domain, None, 5, None)
    assert scouted(problem)
    found = scout_heads(problem, rng, problem.clock() + 0.05, 1.0, kernel_starts, head_ties)
    assert found and [value for _, value, _ in found] == sorted((value for _, value, _ in found), reverse=True)
    for h, value, tokens in found:
        assert np.all(domain.contains(tokens))
        alone = head_problem(problem, h)
        sigma, _ = alone.sigma(alone.to_work(tokens[None]), steps=200)
        np.testing.assert_allclose(sigma[0], value, rtol=1e-3)
    pool = layer_starts(problem, rng, problem.clock() + 0.05, 1.0, kernel_starts, head_ties, joint_ties)
    assert {"head-scout", "joint-tied", "head-combined"} <= {family for _, family in pool}
    for inputs, _ in pool:
        assert np.all(domain.contains(problem.lift(inputs)[0]))


def test_the_layer_witness_from_scouted_starts_holds_against_a_jacobian_computed_here():
    """The witness of a scouted rotary GQA layer: found by one of the layer's start families, its tokens in the
    domain, its value ``||DF(X)[E]||`` equal to that of the reference forward's central differences at (X, E) and at
    most that Jacobian's top singular value, and the high-precision re-check encloses it."""
    _, layer, domain = _setting(41, d=12, heads=4, groups=2)
    witness = search_witness(layer, domain=domain, n=4, budget_seconds=0.3, seed=2)
    assert witness.details["family"] in FAMILIES
    assert np.all(domain.contains(witness.X))
    f, X, E = reference_map(layer), witness.X, witness.E
    step = 1e-6
    columns = []
    for index in range(X.size):
        move = np.zeros(X.size)
        move[index] = step
        columns.append(((f(X + move.reshape(X.shape)) - f(X - move.reshape(X.shape))) / (2 * step)).reshape(-1))
    J = np.array(columns).T
    np.testing.assert_allclose(np.linalg.norm(J @ E.reshape(-1)) / np.linalg.norm(E), witness.value, rtol=1e-5)
    assert witness.value <= np.linalg.norm(J, 2) * (1 + 1e-6)
    checked = recheck(witness, layer)
    assert checked.valid and checked.lower <= witness.value <= checked.upper * (1 + 1e-12)


def _dot_layer(seed: int, d: int = 16, d_k: int = 4, heads: int = 3):
    """A BERT-like layer: dot-product heads with query, key and value biases, no mask, and ``W_O``."""
    rng = np.random.default_rng(seed)
    parts = [Head(W_Q=rng.standard_normal((d, d_k)), W_K=rng.standard_normal((d, d_k)),
                  W_V=rng.standard_normal((d, d_k)), b_Q=rng.standard_normal(d_k), b_K=rng.standard_normal(d_k),
                  b_V=rng.standard_normal(d_k)) for _ in range(heads)]
    layer = Layer(heads=tuple(parts), W_O=rng.standard_normal((heads * d_k, d)) / np.sqrt(heads * d_k))
    return layer, TokenBall(2.0, center=rng.uniform(-0.5, 0.5, d))


def test_a_dot_product_kernel_acts_at_every_offset_as_itself_and_ties_its_layers_keys_through_that():
    """``DotProduct.relative_rotation`` is the identity at every offset (a kernel without one matrix per offset says
    None), and through it :func:`joint_ties` ties tokens 0 and 1 for every query 2..n-1 of every tied head of a
    dot-product layer with biases (scores written here): the starts are points of the ball whose Jacobian norm, as the
    search evaluates it, is that of the reference forward's central differences."""
    for offset in (-3, 0, 2):
        np.testing.assert_array_equal(DotProduct().relative_rotation(5, offset), np.eye(5))
    assert QKNorm(gamma_q=np.ones(4), gamma_k=np.ones(4)).relative_rotation(4, 0) is None
    layer, domain = _dot_layer(43)
    n = 5
    problem = SearchProblem(layer, "self", domain, None, n, None)
    for tied in ([0, 1], [0, 1, 2]):
        inputs = joint_ties(problem, tied)
        tokens = problem.lift(inputs)[0][0]
        assert np.all(domain.contains(tokens))
        for h in tied:
            head = layer.heads[h]
            q, k = tokens @ head.W_Q + head.b_Q, tokens @ head.W_K + head.b_K
            for i in range(2, n):     # exact up to the pull into the domain (scale 1 - 1e-6; the biases stay)
                np.testing.assert_allclose(q[i] @ k[0], q[i] @ k[1], rtol=1e-5)
        sigma, _ = problem.sigma(inputs, steps=300)
        np.testing.assert_allclose(sigma[0], reference_norm(layer, tokens), rtol=1e-4)


def test_only_positional_layers_are_scouted_through_their_heads():
    """A rotary layer's search starts from its heads; a dot-product layer, which has a relative rotation too (the
    identity), keeps its own starts (:func:`scouted`)."""
    _, rotary, rms = _setting(47)
    assert scouted(SearchProblem(rotary, "self", rms, None, 5, None))
    layer, domain = _dot_layer(47)
    assert not scouted(SearchProblem(layer, "self", domain, None, 5, None))
