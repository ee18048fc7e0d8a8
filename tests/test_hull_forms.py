"""Edit sets as one affine form over the candidate words' points (lipbound.local.hull_forms and the points of
lipbound.rigorous.zonotope): every bound against the exact values of each word, enumerated, on generated models
and on all-MiniLM-L6-v2."""

from __future__ import annotations

import local_models
import numpy as np
import pytest

from lipbound.local.hull_forms import candidate_form, form_cost, form_norm, hull_bounds
from lipbound.local.propagate import embedding_enclosure, embedding_enclosure_tokens, propagate
from lipbound.measures.edits import edit_set
from lipbound.numeric.forward import attention_block, hidden_states
from lipbound.rigorous.arrays import IntervalArray
from lipbound.rigorous.zonotope import AffineForm, Symbols

IDS = [0, 3, 4, 5, 6, 7, 1]
SLOT = 2


def _points_form(rng, points: int = 50, m: int = 4, shape=(3, 5)):
    """A form whose first m box symbols take the values of ``points`` random points, with one more box symbol and
    independent errors; its values at each point (with the other symbols at random corners) for checking."""
    P = rng.uniform(-1, 1, (points, m)).astype(np.float32)
    box = rng.standard_normal((m + 1,) + shape)
    err = 0.01 * rng.random(shape)
    symbols = Symbols(P)
    symbols.fresh(1)
    form = AffineForm(rng.standard_normal(shape), np.zeros((0,) + shape), box, err, symbols)
    t_last = rng.choice([-1.0, 1.0], points)
    u = err * rng.choice([-1.0, 1.0], (points,) + shape)
    values = form.center + np.einsum("pm,m...->p...", P.astype(np.float64), box[:m]) \
        + t_last.reshape((-1,) + (1,) * len(shape)) * box[m] + u
    return form, values


def test_the_points_deviation_is_the_largest_value_over_the_points_and_no_more_than_the_box():
    rng = np.random.default_rng(0)
    form, values = _points_form(rng)
    deviation = form.deviation()
    assert np.all(np.abs(values - form.center) <= deviation)
    m = form.symbols.points.shape[1]
    exact = np.max(np.abs(np.einsum("pm,m...->p...", form.symbols.points.astype(np.float64), form.box[:m])), axis=0)
    rest = np.abs(form.box[m]) + form.err
    assert np.all(deviation <= (exact + rest) * (1 + 1e-5) + 1e-12)
    assert np.all(deviation <= np.abs(form.box).sum(axis=0) + form.err + 1e-12)


def test_products_elementwise_and_shift_hold_at_every_point():
    rng = np.random.default_rng(1)
    form, values = _points_form(rng)
    W = rng.standard_normal((5, 5))
    other = form.linear(W)
    other_values = values @ W
    for spec, exact in (("ik,ik->i", np.einsum("pik,pik->pi", values, other_values)),
                        ("ik,ik->ik", values * other_values)):
        product = form.product(other, spec)
        assert np.all(product.hull().lo <= exact) and np.all(exact <= product.hull().hi)
    # tanh: its value at the centre widened past float error, its slope anywhere in [0, 1]
    bent = form.elementwise(IntervalArray.around(np.tanh(form.center), 1e-12), IntervalArray(np.zeros(form.shape),
                                                                                             np.ones(form.shape)))
    assert np.all(bent.hull().lo <= np.tanh(values)) and np.all(np.tanh(values) <= bent.hull().hi)
    moved = form.shift(np.arange(5.0))
    assert np.all(moved.hull().lo <= values + np.arange(5.0)) and np.all(values + np.arange(5.0) <= moved.hull().hi)


def test_the_candidate_form_holds_every_word_row():
    generated = local_models.model(seed=4, vocab=30)
    own = embedding_enclosure_tokens(generated.embeddings, np.asarray(IDS), np.arange(len(IDS)))
    candidates = embedding_enclosure(generated.embeddings, np.arange(30), SLOT)
    form = candidate_form(own, SLOT, candidates)
    m = form.symbols.points.shape[1]
    rows = form.center[SLOT] + form.symbols.points.astype(np.float64) @ form.box[:m, SLOT]
    assert np.all(np.abs(candidates.mid - rows) <= form.err[SLOT])
    assert np.all(np.abs(np.delete(own.mid, SLOT, 0) - np.delete(form.center, SLOT, 0))
                  <= np.delete(form.err, SLOT, 0))


def test_a_layernorm_on_the_form_holds_every_point():
    rng = np.random.default_rng(2)
    form, values = _points_form(rng, shape=(3, 6))
    norm = local_models.norm(rng, 6)
    out = form_norm(norm, form.shift(np.linspace(-3, 3, 6)))
    moved = values + np.linspace(-3, 3, 6)
    exact = local_models._layernorm(norm, moved)
    assert np.all(out.hull().lo <= exact) and np.all(exact <= out.hull().hi)


def _costs(generated, ids, slot, word, references, last):
    edited = list(ids)
    edited[slot] = int(word)
    states = hidden_states(generated, edited)
    return np.array([np.mean(np.linalg.norm(attention_block(generated.layer(l), states[l])[0] - references[l],
                                            axis=1)) for l in range(last + 1)])


@pytest.mark.parametrize("seed, words", [(3, np.arange(24)), (8, np.arange(24)), (5, np.array([3, 9, 11, 17]))])
def test_the_hull_bound_covers_every_word_at_every_layer_reached(seed, words):
    generated = local_models.model(seed=seed, layers=3, vocab=24)
    own = embedding_enclosure_tokens(generated.embeddings, np.asarray(IDS), np.arange(len(IDS)))
    candidates = embedding_enclosure(generated.embeddings, words, SLOT)
    references = [s.original for s in propagate(generated, edit_set(IDS, "replace", [SLOT], [IDS[SLOT]]),
                                                layers=[2])]
    found = hull_bounds(generated, own, SLOT, candidates, references, 2)
    assert 0 in found.bounds
    costs = np.array([_costs(generated, IDS, SLOT, w, references, 2) for w in words])
    for layer, bound in found.bounds.items():
        assert np.all(costs[:, layer] <= bound * (1 + 1e-9))
        assert found.spans[layer].shape == (len(IDS),) and np.all(found.radii[layer] >= 0)


def test_the_words_part_of_the_cost_is_each_words_own_distance():
    """With the form of the sentence itself (no symbols beyond the words'), the cost of each word at the input is
    its distance to the reference rows, up to rounding."""
    generated = local_models.model(seed=6, vocab=20)
    own = embedding_enclosure_tokens(generated.embeddings, np.asarray(IDS), np.arange(len(IDS)))
    candidates = embedding_enclosure(generated.embeddings, np.arange(20), SLOT)
    form = candidate_form(own, SLOT, candidates)
    cost, spans, rho = form_cost(form, own.mid)
    exact = np.linalg.norm(candidates.mid - own.mid[SLOT], axis=1) / len(IDS)
    assert np.all(exact <= cost) and np.all(cost <= exact + np.sum(rho) / len(IDS) + 1e-5)


@pytest.mark.slow
def test_minilm_hull_bound_covers_sampled_words():
    """all-MiniLM-L6-v2, position 3 of 'The cat sat on the mat.': a sample of 96 words, each word's exact cost
    below the set's bound at layers 0 and 1 where reached."""
    from lipbound.measures.bert import load_text_model
    bert = load_text_model()
    ids = np.array(bert.encode("The cat sat on the mat."))
    words = np.union1d(np.random.default_rng(0).choice(np.arange(1000, 30522), 94, replace=False), [2028, 1996])
    model = bert.model
    own = embedding_enclosure_tokens(model.embeddings, ids, np.arange(ids.size))
    candidates = embedding_enclosure(model.embeddings, words, 3)
    references = [s.original for s in propagate(model, edit_set(ids, "replace", [3], ids[[3]][:, None]), layers=[1])]
    found = hull_bounds(model, own, 3, candidates, references, 1)
    costs = np.array([_costs(model, ids, 3, w, references, 1) for w in words])
    for layer, bound in found.bounds.items():
        assert np.all(costs[:, layer] <= bound)


def test_the_softmax_of_every_point_lies_in_the_points_softmax_form_and_ranges():
    from lipbound.local.hull_forms import points_softmax
    rng = np.random.default_rng(3)
    form, values = _points_form(rng, points=200, m=3, shape=(2, 4, 5))
    S = form.scale(IntervalArray(3.0))                 # wide scores: the weights swing over most of [0, 1]
    P, weights = points_softmax(S)
    scores = 3.0 * values
    exact = np.exp(scores - scores.max(axis=-1, keepdims=True))
    exact /= exact.sum(axis=-1, keepdims=True)
    assert np.all(P.hull().lo <= exact) and np.all(exact <= P.hull().hi)
    assert np.all(weights.lo <= exact) and np.all(exact <= weights.hi)


def test_a_function_of_every_point_as_new_point_symbols_holds_each_value():
    from lipbound.local.hull_forms import as_points
    rng = np.random.default_rng(4)
    form, values = _points_form(rng, points=300, m=3, shape=(4,))
    values = values if values.ndim == 2 else values.reshape(300, 4)
    image = as_points(form, lambda x: (x * x + IntervalArray(1.0)).sqrt())
    assert image.symbols.points.shape == (300, 3 + 4)
    exact = np.sqrt(values * values + 1.0)
    m = image.symbols.points.shape[1]
    at_points = image.center + image.symbols.points.astype(np.float64) @ image.box[:m]
    assert np.all(np.abs(exact - at_points) <= image.err * (1 + 1e-9) + 1e-12)
    assert np.all(image.hull().lo <= exact) and np.all(exact <= image.hull().hi)
