"""Certified per-candidate passes of one-slot edit sets (lipbound.local.candidates), checked against every
edit of the set run through the float forward pass, and their place beside the token-ball route."""

from __future__ import annotations

import local_models
import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lipbound.errors import AssumptionError
from lipbound.local.candidates import candidate_passes
from lipbound.local.point_stages import chain_radii
from lipbound.local.propagate import (
    coupling_bound,
    embedding_enclosure,
    embedding_enclosure_tokens,
    propagate,
    set_bound,
)
from lipbound.measures.edits import edit_set
from lipbound.measures.empirical import EmpiricalMeasure
from lipbound.measures.wasserstein import w1
from lipbound.numeric.forward import attention_block, hidden_states
from lipbound.rigorous.arrays import IntervalArray, gelu, gelu_with_slopes

IDS = [0, 3, 4, 5, 6, 7, 1]
SLOT = 2


@pytest.mark.parametrize("seed", [3, 11])
def test_every_candidate_is_bounded_and_the_bound_is_its_identity_cost(seed):
    """Each candidate's certified bound covers its identity-plan cost and its exact W1 (forward pass of
    lipbound.numeric.forward), and is that cost up to rounding: nothing is relaxed."""
    generated = local_models.model(seed=seed, layers=3, vocab=12)
    vocabulary = np.arange(12)
    sets = propagate(generated, edit_set(IDS, "replace", [SLOT], vocabulary), per_candidate=True)
    passes = sets[0].facts["candidates"]
    assert passes.stopped == "" and sorted(passes.bounds) == [0, 1, 2]
    assert passes.widths[0] <= passes.widths[1] <= passes.widths[2] <= 1e-3 * np.max(passes.bounds[2])
    states = hidden_states(generated, IDS)
    original = [attention_block(generated.layer(l), states[l])[0] for l in range(3)]
    for index, (word,) in enumerate(passes.words):
        edited = list(IDS)
        edited[SLOT] = int(word)
        new = hidden_states(generated, edited)
        for l in range(3):
            z = attention_block(generated.layer(l), new[l])[0]
            cost = float(np.mean(np.linalg.norm(z - sets[l].original, axis=1)))
            bound = passes.bounds[l][index]
            assert cost <= bound * (1 + 1e-9)
            assert bound - cost <= 2 * passes.widths[l] + 1e-12 * bound   # the enclosures' rounding, no more
            exact = w1(EmpiricalMeasure.uniform(original[l]), EmpiricalMeasure.uniform(z))
            assert exact <= set_bound(sets[l], np.eye(len(IDS)) * len(IDS))[0] * (1 + 1e-9)


def test_set_bound_takes_the_smaller_route_and_names_it():
    generated = local_models.model(seed=5, layers=2, vocab=10)
    template = edit_set(IDS, "replace", [SLOT], np.arange(10))
    plan = np.eye(len(IDS)) * len(IDS)
    balls = propagate(generated, template)
    both = propagate(generated, template, per_candidate=True)
    for l in range(2):
        ball = coupling_bound(balls[l], plan)
        enumerated = balls[l].facts.get("enumerated", np.inf)       # the first layer only
        assert (l == 0) == np.isfinite(enumerated)
        bound, route = set_bound(both[l], plan)
        routes = {"balls": ball, "candidates": both[l].facts["per_candidate"], "enumerated": enumerated}
        assert bound == min(routes.values()) and routes[route] == bound
        assert set_bound(balls[l], plan) == min((ball, "balls"), (enumerated, "enumerated"))
    # another plan than the identity: the enumerated edits' identity costs do not apply
    swapped = plan[:, [1, 0, *range(2, len(IDS))]]
    assert set_bound(balls[0], swapped) == (coupling_bound(balls[0], swapped), "balls")
    inserted = propagate(generated, edit_set(IDS, "insert", [2], np.arange(10)), per_candidate=True)
    assert all("candidates" not in s.facts for s in inserted)       # replacements only


@pytest.mark.parametrize("exact_chain", [False, True])
def test_two_slots_enumerate_every_pair(exact_chain):
    """k = 2 over a vocabulary of 6: the 36 edited sentences, each bounded, the largest covering every pair's W1
    (the chains by reference slopes, and by their certified norms at the points)."""
    generated = local_models.model(seed=13, layers=2, vocab=8)
    vocabulary = np.arange(6)
    sets = propagate(generated, edit_set(IDS, "replace", [2, 4], vocabulary), per_candidate=True,
                     exact_chain=exact_chain)
    passes = sets[0].facts["candidates"]
    assert passes.words.shape == (36, 2) and passes.stopped == ""
    states = hidden_states(generated, IDS)
    original = [attention_block(generated.layer(l), states[l])[0] for l in range(2)]
    for index, (first, second) in enumerate(passes.words):
        edited = list(IDS)
        edited[2], edited[4] = int(first), int(second)
        new = hidden_states(generated, edited)
        for l in range(2):
            z = attention_block(generated.layer(l), new[l])[0]
            assert np.mean(np.linalg.norm(z - sets[l].original, axis=1)) <= passes.bounds[l][index] * (1 + 1e-9)
            exact = w1(EmpiricalMeasure.uniform(original[l]), EmpiricalMeasure.uniform(z))
            assert exact <= set_bound(sets[l], np.eye(len(IDS)) * len(IDS))[0] * (1 + 1e-9)
    assert {tuple(w) for w in passes.words} == {(a, b) for a in vocabulary for b in vocabulary}


@pytest.mark.parametrize("layers, asked, used", [((0, 3), None, [False] * 2), ((0, 4), None, [[SLOT], [SLOT]]),
                                                 ((0, 4), False, [False] * 2)])
def test_per_candidate_passes_take_the_exact_chain_where_the_cheap_one_stops_being_tight(monkeypatch, layers, asked,
                                                                                        used):
    """``exact_chain=None``: the exact chain bound when layer 4 is asked (the cheaper one's radii grow ~350x per
    layer), the screening passes' chains exact from layer 3 on and at the edited token before; the passes' first two
    chains say which they took."""
    import lipbound.local.candidates as module
    seen = []

    class Stop(Exception):
        pass

    def recording(*args, exact, **kwargs):
        seen.append(exact)
        if len(seen) == 2:
            raise Stop
        return chain_radii(*args, exact=exact, **kwargs)
    monkeypatch.setattr(module, "chain_radii", recording)
    generated = local_models.model(seed=5, layers=5, vocab=8)
    with pytest.raises(Stop):
        propagate(generated, edit_set(IDS, "replace", [SLOT], np.arange(8)), layers=layers, per_candidate=True,
                  exact_chain=asked)
    assert seen == used


def test_screened_passes_refine_only_what_could_be_the_maximum(monkeypatch):
    """``screen``: every sentence bounded with the chains exact from layer 2 here (3 on MiniLM; the edited token's
    before it), the ones whose bound could be the set's maximum passed again with every chain exact (with
    ``refine_within`` only those half above it, and the set's value within 1.5 times the all-exact one).  Each bound
    still covers its sentence's identity-plan cost (independent forward pass), no set value is above the all-exact
    passes', and some sentences are left unrefined."""
    import lipbound.local.candidates as module
    monkeypatch.setattr(module, "SCREEN_EXACT_FROM", 2)
    generated, sets, arguments = _four_layer_set(8)
    screened = candidate_passes(*arguments, exact_chain=True, chunk=4)
    exact = candidate_passes(*arguments, exact_chain=True, screen=False)
    assert 0 < screened.refined < 8 and exact.refined == 0 and sorted(screened.bounds) == [0, 1, 2, 3]
    assert sorted(screened.seconds) == ["attention", "bounds", "edited exact chain", "exact chain", "refine"]
    assert sorted(exact.seconds) == ["attention", "bounds", "exact chain"]
    loose = candidate_passes(*arguments, exact_chain=True, chunk=4, refine_within=0.5)
    assert loose.refined <= screened.refined
    for layer in range(4):
        assert screened.largest(layer) <= exact.largest(layer)
        assert loose.largest(layer) <= 1.5 * exact.largest(layer)
    _assert_bounds_cover_the_costs(screened, generated, sets)


@pytest.mark.parametrize("refine_within, keep", [(-0.99, True), pytest.param(0.0, True, marks=pytest.mark.slow),
                                                  pytest.param(0.5, True, marks=pytest.mark.slow),
                                                  pytest.param(-0.99, False, marks=pytest.mark.slow)])
def test_the_cheap_tier_settles_sentences_below_the_maximum_and_keeps_the_set_value(monkeypatch, refine_within, keep):
    """The cheapest screening tier (the edited token's chain exact at layer 0 only here; before layer 4 on MiniLM) then
    the second (every chain exact from layer 2) then the all-exact passes: every sentence left by some tier, each
    bound covering its sentence's identity-plan cost (independent forward pass), the set's value within ``1 +
    refine_within`` of the all-exact passes' at every layer and no sentence left above that, as without the cheap
    tier; the cheap tier's own passes bound every chain but the edited token's at layer 0 by reference slopes.  With
    ``refine_within`` -0.99 every sentence goes through every tier (the cheap one is as tight as the others on these
    small models): the second tier starts at layer 1 from the states the cheap one kept there (both chain layer 0
    alike), or at layer 0 when there is no room to keep them."""
    import lipbound.local.candidates as module
    resumed = []
    evaluate = module._evaluate

    def recording(*args, resume=None, **kwargs):
        resumed.append(None if resume is None else resume.layer)
        return evaluate(*args, resume=resume, **kwargs)
    monkeypatch.setattr(module, "_evaluate", recording)
    if not keep:
        monkeypatch.setattr(module, "MOST_KEPT_FLOATS", 0)
    monkeypatch.setattr(module, "SCREEN_EXACT_FROM", 2)
    monkeypatch.setattr(module, "CHEAP_EDITED_UNTIL", 1)
    monkeypatch.setattr(module, "SEED_PER_LAYER", 1)
    assert module._screen_tiers(3) == [("edited", "none", "none"), 2, 0]
    generated, sets, arguments = _four_layer_set(10)
    tiered = candidate_passes(*arguments, exact_chain=True, chunk=4, refine_within=refine_within)
    before = candidate_passes(*arguments, exact_chain=True, chunk=4, refine_within=refine_within, cheap_tier=False)
    assert set(resumed) <= {None, 1} and (1 in resumed) == (keep and refine_within < 0)
    exact = candidate_passes(*arguments, exact_chain=True, screen=False)
    assert len(tiered.settled) == 3 and sum(tiered.settled) == 10 and tiered.settled[2] == tiered.refined >= 1
    assert refine_within >= 0 or (tiered.settled[1] == 0 and tiered.refined >= 9)   # the original word may stay
    assert len(before.settled) == 2 and sum(before.settled) == 10 and exact.settled == ()
    assert "chain" in tiered.seconds and "chain" not in before.seconds
    for layer in range(4):
        for passes in (tiered, before):
            assert passes.largest(layer) <= (1 + max(refine_within, 0.0)) * exact.largest(layer) * (1 + 1e-12)
    _assert_bounds_cover_the_costs(tiered, generated, sets)


def test_passes_stop_where_rounding_dominates_and_leave_the_rest_to_the_balls():
    generated = local_models.model(seed=7, layers=3, vocab=10)
    embeddings = generated.embeddings
    own = embedding_enclosure_tokens(embeddings, np.array(IDS), np.arange(len(IDS)))
    words = np.arange(10)
    sets = propagate(generated, edit_set(IDS, "replace", [SLOT], words))
    passes = candidate_passes(generated, own, [SLOT], [embedding_enclosure(embeddings, words, SLOT)], [words],
                              [s.original for s in sets], 2, widest=1e-30)
    assert sorted(passes.bounds) == [0] and "radius" in passes.stopped
    assert np.isnan(passes.largest(1)) and passes.largest(0) == np.max(passes.bounds[0])


def test_a_layer_the_passes_do_not_cover_is_refused():
    generated = local_models.model(seed=7, layers=2, vocab=10)
    generated.layers[1] = generated.layer(1).__class__(**{**generated.layer(1).__dict__,
                                                          "attn_scale": np.ones(6)})
    embeddings = generated.embeddings
    own = embedding_enclosure_tokens(embeddings, np.array(IDS), np.arange(len(IDS)))
    with pytest.raises(AssumptionError, match="layer 1"):
        candidate_passes(generated, own, [SLOT], [embedding_enclosure(embeddings, np.arange(3), SLOT)],
                         [np.arange(3)], [np.zeros((len(IDS), 6))] * 2, 1)


@settings(max_examples=40, deadline=None)
@given(st.floats(-9, 9), st.floats(0, 1e-3), st.floats(0, 1))
def test_gelu_with_its_global_slope_range_encloses_the_exact_gelu(center, radius, where):
    box = IntervalArray(np.array([center - radius]), np.array([center + radius]))
    enclosed = gelu(box, global_slopes=True)
    x = mpmath.mpf(center - radius) + mpmath.mpf(where) * 2 * mpmath.mpf(radius)
    with mpmath.workdps(40):
        exact = x * mpmath.ncdf(x)
    assert enclosed.lo[0] <= exact <= enclosed.hi[0]
    assert enclosed.hi[0] - enclosed.lo[0] <= 2.5 * radius + 1e-12
    same, slope = gelu_with_slopes(box)
    np.testing.assert_array_equal(same.lo, enclosed.lo)
    m = mpmath.mpf(float(box.mid[0]))
    with mpmath.workdps(40):
        exact_slope = mpmath.ncdf(m) + m * mpmath.npdf(m)
    assert slope.lo[0] <= exact_slope <= slope.hi[0] and slope.hi[0] - slope.lo[0] < 1e-14


def test_perturb_names_the_route_and_the_passes_meet_the_worst_edit_on_minilm():
    """all-MiniLM-L6-v2, a set of 9 tokens at one position, layers 0 and 1: the passes certify within 1% of
    the worst edit (found by the exhaustive search) where the balls alone are 1.1 and ~100 times above it."""
    from lipbound.measures.bert import load_text_model
    from lipbound.measures.perturb import perturb
    bert = load_text_model()
    common = {"k": 1, "positions": (2,), "layers": (0, 1), "seed": 0, "model": bert, "vocabulary": 8, "search": "all"}
    balls = perturb("The cat slept all afternoon.", **common)
    both = perturb("The cat slept all afternoon.", per_candidate=True, **common)
    assert both.violations == 0
    assert both.edit_set["routes"] == {"k=1, layer 0": "candidates", "k=1, layer 1": "candidates"}
    assert balls.edit_set["routes"] == {"k=1, layer 0": "enumerated", "k=1, layer 1": "balls"}
    assert 1 <= both.search[1]["passes_evaluated"] <= 8 and "passes_evaluated" not in balls.search[1]
    for old, new in zip(balls.rows, both.rows):
        np.testing.assert_allclose(new.worst_witness, old.worst_witness, rtol=1e-12)
        assert new.worst_witness <= new.predicted_set <= min(old.predicted_set, 1.01 * new.worst_witness)
    assert balls.rows[1].predicted_set > 20 * balls.rows[1].worst_witness
    assert balls.rows[0].worst_witness <= balls.rows[0].predicted_set <= 1.01 * balls.rows[0].worst_witness


@pytest.mark.parametrize("seed", [2, 9])
def test_the_enumerated_first_layer_bounds_each_edit_by_its_identity_cost(seed):
    """The first layer of a one-slot replacement: the largest identity cost over the enumerated words bounds every
    edit's cost (float forward pass), is within rounding of the largest, and is below the balls' bound (per-token
    maxima, which may come from different words)."""
    generated = local_models.model(seed=seed, layers=1, vocab=30)
    sets = propagate(generated, edit_set(IDS, "replace", [SLOT], np.arange(30)), layers=[0])
    costs = []
    for word in range(30):
        edited = list(IDS)
        edited[SLOT] = word
        z = attention_block(generated.layer(0), hidden_states(generated, edited)[0])[0]
        costs.append(float(np.mean(np.linalg.norm(z - sets[0].original, axis=1))))
    enumerated = sets[0].facts["enumerated"]
    assert max(costs) <= enumerated <= max(costs) * (1 + 1e-9) + 1e-12
    plan = np.eye(len(IDS)) * len(IDS)
    assert enumerated <= coupling_bound(sets[0], plan)
    assert set_bound(sets[0], plan) == (enumerated, "enumerated")
    inserted = propagate(generated, edit_set(IDS, "insert", [SLOT], np.arange(30)), layers=[0])
    assert "enumerated" not in inserted[0].facts      # the reference is not the centres' output there


def test_more_sentences_than_the_passes_take_are_refused_and_left_to_the_balls():
    from lipbound.local.candidates import MOST_SENTENCES
    generated = local_models.model(seed=7, layers=1, vocab=400)
    embeddings = generated.embeddings
    own = embedding_enclosure_tokens(embeddings, np.array(IDS), np.arange(len(IDS)))
    words = np.arange(400)
    assert words.size ** 2 > MOST_SENTENCES
    with pytest.raises(AssumptionError, match="candidates: expected at most"):
        candidate_passes(generated, own, [2, 4], [embedding_enclosure(embeddings, words, p) for p in (2, 4)],
                         [words, words], [np.zeros((len(IDS), 6))], 0)
    sets = propagate(generated, edit_set(IDS, "replace", [2, 4], words), per_candidate=True)
    assert "candidates" not in sets[0].facts


@pytest.mark.parametrize("tolerance", [-1.0, -2.0, float("nan"), float("inf")])
def test_a_refining_tolerance_at_or_below_minus_one_is_refused(tolerance):
    generated = local_models.model(seed=7, layers=1, vocab=40)
    own = embedding_enclosure_tokens(generated.embeddings, np.array(IDS), np.arange(len(IDS)))
    words = np.arange(3)
    with pytest.raises(AssumptionError, match="refine_within: expected a number above -1"):
        candidate_passes(generated, own, [SLOT], [embedding_enclosure(generated.embeddings, words, SLOT)], [words],
                         [np.zeros((len(IDS), 6))], 0, refine_within=tolerance)


def _in_balls(rng, X, radii, count):
    """``count`` points of the token balls (each token on a random direction at a random fraction of its radius,
    half of them on the sphere)."""
    directions = rng.standard_normal((count,) + X.shape)
    directions /= np.linalg.norm(directions, axis=-1, keepdims=True)
    scale = np.where(np.arange(count)[:, None] % 2, 1.0, rng.random((count, X.shape[0])))
    return X[None] + directions * (radii * scale)[..., None]


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 10 ** 6), st.sampled_from([1e-6, 1e-3, 3e-2, 0.5]))
def test_each_stage_moves_every_point_of_its_balls_within_the_new_radii(seed, size):
    """Points of the balls about float states through the float forward pass of lipbound.numeric (the attention
    block, the LayerNorms, the feed-forward block): each lands within the stage's new radius of its new point."""
    from lipbound.local.point_stages import (
        PointStates,
        SlopeReference,
        attention_radii,
        chain_radii,
        feedforward_radii,
        norm_radii,
    )
    from lipbound.numeric.attention import AttentionMap
    rng = np.random.default_rng(seed)
    generated = local_models.model(seed=seed % 97, layers=1, vocab=10)
    item = generated.layer(0)
    X = hidden_states(generated, IDS)[0] + 0.3 * rng.standard_normal((len(IDS), 6))
    radii = size * rng.random(len(IDS)) * np.linalg.norm(X, axis=-1)
    balls = PointStates(X[None], radii[None])
    stages = [(lambda S: attention_radii(AttentionMap(item.as_layer(residual=True)), S),
               lambda Y: attention_block(item, Y)[0]),
              (lambda S: norm_radii(item.ln_out, S), item.ln_out),
              (lambda S: feedforward_radii(item.ffn, S), lambda Y: Y + item.ffn(Y)),
              (lambda S: norm_radii(item.ffn_norm, S), item.ffn_norm)]
    stages.insert(1, (lambda S: chain_radii(item, S), lambda Y: _chain(item, Y)))
    # the reference slopes of another batch (any reference is sound) and the exact route, each a stage of its own
    elsewhere = SlopeReference.of(item, X[None] + rng.standard_normal((3,) + X.shape))
    stages.insert(1, (lambda S: chain_radii(item, S, elsewhere), lambda Y: _chain(item, Y)))
    stages.insert(1, (lambda S: chain_radii(item, S, exact=True), lambda Y: _chain(item, Y)))
    for enclose, forward in stages:
        image = enclose(balls)
        assert np.all(image.radii >= 0) and image.points.shape == balls.points.shape
        for Y in _in_balls(rng, balls.points[0], balls.radii[0], 12):
            moved = np.linalg.norm(forward(Y) - image.points[0], axis=-1)
            assert np.all(moved <= image.radii[0] * (1 + 1e-9) + 1e-12)
        balls = image


def _chain(item, Y):
    """The float LayerNorm, residual feed-forward block and output LayerNorm of lipbound.numeric."""
    normed = item.ln_out(Y)
    return item.ffn_norm(normed + item.ffn(normed))


@settings(max_examples=4, deadline=None)
@given(st.integers(0, 10 ** 6), st.sampled_from([1e-4, 1e-2]))
def test_the_chain_radius_is_local_and_fails_when_scaled_down(seed, size):
    """The LayerNorm-feed-forward-LayerNorm radius (lemma point-chain) against the chain's own Jacobian, written here
    by central differences: a point of each ball along the Jacobian's top singular direction lands inside the radius,
    and outside a quarter of it (the radius follows the local slope, not the global one)."""
    from lipbound.local.point_stages import PointStates, chain_radii
    rng = np.random.default_rng(seed)
    generated = local_models.model(seed=seed % 97, layers=1, vocab=10)
    item = generated.layer(0)
    X = hidden_states(generated, IDS)[0] + 0.3 * rng.standard_normal((len(IDS), 6))
    radii = size * np.linalg.norm(X, axis=-1)
    step = 1e-6
    for exact in (False, True):   # the reference route (the batch's own slopes) and the exact route
        image = chain_radii(item, PointStates(X[None], radii[None]), exact=exact)
        ratios = []
        for i, x in enumerate(X):
            basis = np.eye(x.size) * step
            jacobian = (_chain(item, x + basis) - _chain(item, x - basis)) / (2 * step)    # rows: input directions
            _, slope, right = np.linalg.svd(jacobian.T)
            for sign in (1.0, -1.0):
                moved = np.linalg.norm(_chain(item, x + sign * radii[i] * right[0]) - image.points[0, i])
                assert moved <= image.radii[0, i] * (1 + 1e-9) + 1e-12
                ratios.append(moved / image.radii[0, i])
        assert max(ratios) > 0.25, (exact, max(ratios))


@settings(max_examples=5, deadline=None)
@given(st.integers(0, 10 ** 6), st.sampled_from([1e-4, 1e-2]))
def test_the_attention_radius_meets_the_jacobians_top_direction(seed, size):
    """The attention block's radius (lemma point-attention, query part through the key-value covariance) against
    the block's Jacobian written here by central differences: per output token, the inputs moved along the top
    right singular vector of its Jacobian rows, scaled into the balls, land inside the radius; on small balls
    (1e-4 of the states) outside a third of it."""
    from lipbound.local.point_stages import PointStates, attention_radii
    from lipbound.numeric.attention import AttentionMap
    rng = np.random.default_rng(seed)
    generated = local_models.model(seed=seed % 97, layers=1, vocab=10)
    item = generated.layer(0)
    X = hidden_states(generated, IDS)[0] + 0.3 * rng.standard_normal((len(IDS), 6))
    n, d = X.shape
    radius = size * float(np.mean(np.linalg.norm(X, axis=-1)))
    image = attention_radii(AttentionMap(item.as_layer(residual=True)), PointStates(X[None], np.full((1, n), radius)))
    block = lambda Y: attention_block(item, Y)[0]  # noqa: E731
    step = 1e-6
    jacobian = np.stack([((block(X + E) - block(X - E)) / (2 * step)).ravel()
                         for E in np.eye(n * d).reshape(n * d, n, d) * step])                  # rows: input entries
    ratios = []
    for i in range(n):
        top = np.linalg.svd(jacobian[:, i * d:(i + 1) * d].T)[2][0].reshape(n, d)
        move = top / np.max(np.linalg.norm(top, axis=-1)) * radius
        for sign in (1.0, -1.0):
            moved = np.linalg.norm(block(X + sign * move)[i] - image.points[0, i])
            assert moved <= image.radii[0, i] * (1 + 1e-9) + 1e-12
            ratios.append(moved / image.radii[0, i])
    if size < 1e-3:
        assert max(ratios) > 1 / 3, max(ratios)



@settings(max_examples=8, deadline=None)
@given(st.integers(0, 10 ** 6), st.sampled_from([1e-3, 0.3, 3.0, 30.0, 800.0]))
def test_weight_moves_cover_every_score_deviation_and_the_linear_bound_is_reached(seed, scale):
    """How far the softmax weights move (lemma point-attention, its linear caps): for score deviations ``|ds_ij| <=
    sigma_ij`` drawn at random and at the box's corners, and any ``t`` in [0, 1], every ``|p_ij(t) - p~_ij|`` and each
    row's l1 change lie within the bounds; at equal weights and a two-key row the entry bound is met to first order
    (the linear cap is not loose by more than the exponential's curvature)."""
    from lipbound.local.point_stages import _weight_moves
    from lipbound.rigorous.arrays import softmax
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal((1, 2, 5, 5)) * 3.0
    P = softmax(IntervalArray(scores), np.ones(5))
    sigma = IntervalArray(scale * rng.random((1, 2, 5, 5)))
    moved, total = _weight_moves(P, sigma)
    for _ in range(30):
        corner = rng.random() < 0.5
        unit = np.sign(rng.standard_normal(scores.shape)) if corner else rng.uniform(-1, 1, scores.shape)
        shifted = scores + rng.random() * unit * sigma.hi
        weights = np.exp(shifted - shifted.max(axis=-1, keepdims=True))
        change = weights / weights.sum(axis=-1, keepdims=True) - P.mid
        assert np.all(np.abs(change) <= moved.hi * (1 + 1e-12) + 1e-15)
        assert np.all(np.abs(change).sum(axis=-1, keepdims=True) <= total.hi * (1 + 1e-12) + 1e-15)
    # two keys at equal weights, deviations +sigma and -sigma: the change is tanh(sigma) / 2 ~ sigma / 2
    tiny = 1e-3
    P2 = softmax(IntervalArray(np.zeros((1, 1, 1, 2))), np.ones(2))
    moved2, _ = _weight_moves(P2, IntervalArray(np.full((1, 1, 1, 2), tiny)))
    reached = np.tanh(tiny) / 2
    assert reached <= moved2.hi[0, 0, 0, 0] and 0.9 * moved2.hi[0, 0, 0, 0] < reached


def test_per_block_facts_are_kept_for_the_most_recent_blocks_only(monkeypatch):
    from lipbound.local import enclosed, point_stages
    monkeypatch.setattr(point_stages, "_SLOPE_GRAMS", {})
    monkeypatch.setattr(enclosed, "_HADAMARDS", {})
    monkeypatch.setattr(enclosed, "BLOCKS_KEPT", 2)
    rng = np.random.default_rng(0)
    blocks = [local_models.layer(rng, d_ff=4) for _ in range(3)]
    first = [point_stages._slope_gram(b.ffn, b.ffn_norm.gamma) for b in blocks]
    hadamards = [enclosed.feedforward_hadamards(b.ffn) for b in blocks]
    for cache in (point_stages._SLOPE_GRAMS, enclosed._HADAMARDS):
        assert len(cache) == 2 and all(key[0] != id(blocks[0].ffn) for key in cache)
    again = point_stages._slope_gram(blocks[0].ffn, blocks[0].ffn_norm.gamma)   # formed anew, the same facts
    assert np.array_equal(again[0].hi, first[0][0].hi) and again[1] == first[0][1]
    assert len(point_stages._SLOPE_GRAMS) == 2 and all(key[0] != id(blocks[1].ffn) for key in point_stages._SLOPE_GRAMS)
    assert enclosed.feedforward_hadamards(blocks[2].ffn) is hadamards[2]           # kept: not formed again
    other_gamma = blocks[2].ffn_norm.gamma.copy()                                  # another gain: formed anew
    assert point_stages._slope_gram(blocks[2].ffn, other_gamma) is not first[2]


def _assert_bounds_cover_the_costs(passes, generated, sets, layers: int = 4) -> None:
    """Every edited sentence's certified bound at least its cost, run here through an independent forward pass."""
    for index, (word,) in enumerate(passes.words):
        edited = list(IDS)
        edited[SLOT] = int(word)
        new = hidden_states(generated, edited)
        for layer in range(layers):
            cost = float(np.mean(np.linalg.norm(attention_block(generated.layer(layer), new[layer])[0]
                                                - sets[layer].original, axis=1)))
            assert cost <= passes.bounds[layer][index] * (1 + 1e-9)


def _four_layer_set(vocab: int):
    """A generated four-layer model, the sets of every replacement at SLOT by its ``vocab`` words through its layers,
    and the arguments of :func:`candidate_passes` for them through layer 3."""
    generated = local_models.model(seed=9, layers=4, vocab=vocab)
    embeddings = generated.embeddings
    own = embedding_enclosure_tokens(embeddings, np.array(IDS), np.arange(len(IDS)))
    words = np.arange(vocab)
    sets = propagate(generated, edit_set(IDS, "replace", [SLOT], words))
    return generated, sets, (generated, own, [SLOT], [embedding_enclosure(embeddings, words, SLOT)], [words],
                             [s.original for s in sets], 3)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 10 ** 6), st.sampled_from([0.0, 1e-9, 1e-3, 0.3]))
def test_the_slope_norm_over_a_box_is_above_every_point_of_it_in_rationals(seed, width):
    """``sup (s^T G s)^(1/2)`` over a box of slopes, from one float product by G's midpoint and its error bound,
    against ``||diag(gamma) W_1 diag(s) W_2||_F^2`` in rationals at the box's centre and corners; a bound that
    forgets the box's spread is told apart at the corners."""
    from fractions import Fraction

    from lipbound.local.point_stages import _frobenius_over_box, _slope_gram
    rng = np.random.default_rng(seed)
    item = local_models.model(seed=seed % 97, layers=1).layer(0)
    ffn, gamma = item.ffn, item.ln_out.gamma
    slope_gram = _slope_gram(ffn, gamma)
    d_ff = ffn.W_1.shape[1]
    center = rng.uniform(-0.2, 1.2, (2, 3, d_ff))
    spread = width * rng.random(center.shape)
    bound = _frobenius_over_box(slope_gram, center, IntervalArray(spread)).hi
    forgetful = _frobenius_over_box(slope_gram, center, IntervalArray(np.zeros_like(spread))).hi
    W_1 = [[Fraction(float(gamma[i])) * Fraction(float(w)) for w in row] for i, row in enumerate(ffn.W_1)]
    W_2 = [[Fraction(float(w)) for w in row] for row in ffn.W_2]

    def exact_square(s):
        s = [Fraction(float(v)) for v in s]
        M = [[sum(W_1[i][k] * s[k] * W_2[k][j] for k in range(d_ff)) for j in range(len(W_2[0]))]
             for i in range(len(W_1))]
        return sum(v * v for row in M for v in row)
    told_apart = False
    for index in np.ndindex(center.shape[:2]):
        signs = rng.choice([-1.0, 1.0], d_ff)
        for s in (center[index], center[index] + signs * spread[index]):
            value = exact_square(s)
            assert value <= Fraction(float(bound[index])) ** 2
            told_apart |= value > Fraction(float(forgetful[index])) ** 2
    assert told_apart or width < 1e-3
