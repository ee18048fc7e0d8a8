"""Published claims: every claim has a checker; known-wrong constants are refuted; on the same
weights, the measured relation between derived and published bounds is printed."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import sympy as sp

from lipbound.numeric.claims import CHECKERS, check
from lipbound.numeric.domains import AllTokens, TokenBall
from lipbound.numeric.evaluate import evaluate_bound
from lipbound.numeric.kernels import L2Distance
from lipbound.numeric.model import Head, Layer, load_default
from lipbound.symbolic.assumptions import Assumptions, Ball, Unbounded
from lipbound.symbolic.claims import CLAIMS
from lipbound.symbolic.registry import variant


def test_every_claim_has_a_checker():
    assert set(CHECKERS) == set(CLAIMS)


@pytest.mark.parametrize("key", ["gelu-1.12", "power-iteration-5", "l2-untied-global"])
def test_known_wrong_constants_are_refuted_with_certified_witnesses(key):
    result = check(key, budget=5)
    print(result.describe())
    assert result.verdict == "REFUTED"
    assert result.witness_value > result.claimed


@pytest.mark.parametrize("key", ["softmax-half", "lipschitznorm", "kim-not-lipschitz", "vuckovic-w1"])
def test_true_claims_are_confirmed(key):
    assert check(key, budget=5).verdict == "confirmed"


def test_kim_l2_transcription_is_refuted_as_transcribed():
    """The recalled l_2 statement is linear in ||W_Q||, the map quadratic: large scales refute it."""
    result = check("kim-l2-fro", budget=5)
    print(result.describe())
    assert result.verdict == "REFUTED" and "as transcribed" in result.notes
    assert CLAIMS["kim-l2-fro"].tag == "unverified"


def test_derived_against_castin_on_the_same_real_heads():
    """Layer 0 of all-MiniLM-L6-v2 with the biases dropped (the claim's setting), R = LayerNorm radius."""
    layer = load_default(layers=0).layers[0]
    domain = TokenBall(layer.ln_in.radius_about_origin)
    derived = variant("dot-product-nobias").derive(Assumptions(domain=Ball()), "dot-product-nobias")
    castin = CLAIMS["castin-theorem"].statement
    for n in (8, 32):
        ratios = []
        for head in layer.heads:
            plain = Head(head.W_Q, head.W_K, head.W_V)
            ours = evaluate_bound(derived, plain, domain, n).value
            theirs = evaluate_bound(castin, plain, domain, n).details["interval"][0]
            ratios.append(ours / theirs)
            assert ours < theirs
        print(f"n = {n}: derived / Castin et al. (recalled) on the 12 heads: min {min(ratios):.3f}, "
              f"median {np.median(ratios):.3f}, max {max(ratios):.3f}")


def test_derived_against_kim_on_the_same_random_l2_weights():
    """Tied L2, values through A, one head, W_O = I, on R^{n x d}: the ratio derived / Kim (as transcribed)."""
    rng = np.random.default_rng(0)
    derived = variant("multi-head-l2").derive(Assumptions(domain=Unbounded(), tied=True), "multi-head-l2")
    rows = []
    for scale in (0.25, 1.0, 4.0):
        d = 4
        W = scale * rng.standard_normal((d, d)) / np.sqrt(d)
        head = Head(W, W, rng.standard_normal((d, d)) / np.sqrt(d), kernel=L2Distance(), kim_values=True)
        layer = Layer((head,), np.eye(d))
        for n in (2, 8, 32):
            ours = evaluate_bound(derived, layer, AllTokens(), n, H=1).value
            kim = evaluate_bound(CLAIMS["kim-l2-fro"].statement, layer, AllTokens(), n, H=1).value
            rows.append((scale, n, ours / kim))
    for scale, n, ratio in rows:
        print(f"||W|| scale {scale}, n = {n}: derived / Kim et al. (transcribed, W_0((N-1)/e)) = {ratio:.3f}")
    # smaller than the transcription at small scale, larger at large scale: the transcription is linear in ||W||
    assert min(r for s, _, r in rows if s == 0.25) < 1 < max(r for s, _, r in rows if s == 4.0)


# Regression: the softmax and derived-bound checkers once confirmed whatever they were given.
@pytest.mark.parametrize("constant", [sp.Rational(49, 100), sp.Rational(1, 4)])
def test_the_softmax_checker_refutes_a_constant_below_one_half(constant):
    """||J_softmax(0, 0)||_2 = 1/2 exactly, so any smaller claimed constant is refuted."""
    wrong = dataclasses.replace(CLAIMS["softmax-half"], key="softmax-wrong", statement=constant)
    result = CHECKERS["softmax-half"](wrong, 0, 5.0, None)
    assert result.verdict == "REFUTED", result.describe()
    assert result.witness_value > float(constant)


@pytest.mark.parametrize("key", ["kim-not-lipschitz", "vuckovic-w1"])
def test_the_derived_checker_refutes_the_opposite_qualitative_claim(key):
    """Flipping a qualitative claim (Lipschitz <-> not Lipschitz) must turn 'confirmed' into 'REFUTED'."""
    original = CLAIMS[key]
    flipped = dataclasses.replace(original, key=f"{key}-flipped", lipschitz=not original.lipschitz)
    assert CHECKERS[key](original, 0, 5.0, None).verdict == "confirmed"
    assert CHECKERS[key](flipped, 0, 5.0, None).verdict == "REFUTED"


def test_the_lipschitznorm_checker_refutes_a_range_below_the_largest_score():
    wrong = dataclasses.replace(CLAIMS["lipschitznorm"], key="lipschitznorm-wrong", statement=sp.Rational(1, 100))
    assert CHECKERS["lipschitznorm"](wrong, 0, 5.0, None).verdict == "REFUTED"
