"""Edit sets by groups of candidates (lipbound.local.candidate_groups): every group's certified bound against the
exact movement of each of its words, enumerated, on generated models and on all-MiniLM-L6-v2."""

from __future__ import annotations

import local_models
import numpy as np
import pytest

from lipbound.local.candidate_groups import GroupBalls, bisect, group_balls, group_certificate, group_pass_bounds
from lipbound.local.candidates import candidate_passes
from lipbound.local.propagate import embedding_enclosure, embedding_enclosure_tokens, propagate
from lipbound.measures.edits import edit_set
from lipbound.numeric.forward import attention_block, hidden_states

IDS = [0, 3, 4, 5, 6, 7, 1]
SLOT = 2


def _setting(generated, ids, slot, words, last):
    own = embedding_enclosure_tokens(generated.embeddings, np.asarray(ids), np.arange(len(ids)))
    candidates = embedding_enclosure(generated.embeddings, words, slot)
    references = [s.original for s in propagate(generated, edit_set(ids, "replace", [slot], [ids[slot]]),
                                                layers=[last])]
    return own, candidates, references


def _costs(generated, ids, slot, word, references, last):
    """The identity plan's cost ``(1/n) sum_i ||z_i(w) - z_i^0||`` of one edit per layer (it bounds W1 and is what
    the bounds cover), by the float forward pass of lipbound.numeric.forward."""
    edited = list(ids)
    edited[slot] = int(word)
    states = hidden_states(generated, edited)
    return np.array([np.mean(np.linalg.norm(attention_block(generated.layer(l), states[l])[0] - references[l],
                                            axis=1)) for l in range(last + 1)])


def test_bisection_halves_every_group_deterministically_and_loses_no_word():
    rows = np.random.default_rng(0).standard_normal((37, 5))
    low, high = bisect(rows, np.arange(37))
    assert sorted(np.concatenate([low, high])) == list(range(37)) and abs(low.size - high.size) <= 1
    again = bisect(rows, np.arange(37))
    assert np.array_equal(low, again[0]) and np.array_equal(high, again[1])
    # along a dominant direction the halves are the two sides of it
    rows[:, 0] *= 100.0
    low, high = bisect(rows, np.arange(37))
    assert np.max(rows[low, 0]) <= np.min(rows[high, 0]) or np.max(rows[high, 0]) <= np.min(rows[low, 0])


def test_a_group_radius_holds_every_exact_row():
    generated = local_models.model(seed=4, vocab=30)
    candidates = embedding_enclosure(generated.embeddings, np.arange(30), SLOT)
    members = list(bisect(candidates.mid, np.arange(30)))
    balls = group_balls(candidates, members)
    for group, centre, radius in zip(balls.members, balls.centres, balls.radii):
        # any point of an enclosure is within the radius: its corners farthest from the centre too
        far = np.where(candidates.hi[group] - centre >= centre - candidates.lo[group], candidates.hi[group],
                       candidates.lo[group])
        assert np.all(np.linalg.norm(far - centre, axis=1) <= radius)
        assert radius <= np.max(np.linalg.norm(candidates.mid[group] - centre, axis=1)) * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize("seed", [3, 8])
def test_every_group_bound_covers_each_of_its_words(seed):
    """Groups of every size of the tree, no threshold: each bound is above every member's exact movement, and a
    group of one word is that word's movement up to rounding."""
    generated = local_models.model(seed=seed, layers=3, vocab=24)
    words = np.arange(24)
    own, candidates, references = _setting(generated, IDS, SLOT, words, 2)
    groups = [np.arange(24)]
    for _ in range(3):
        groups += [half for g in groups[-2 ** _:] for half in bisect(candidates.mid, g)]
    groups.append(np.array([5]))
    balls = group_balls(candidates, groups)
    bounds = group_pass_bounds(generated, own, SLOT, balls, references, 2, np.full(3, np.inf))
    costs = {int(w): _costs(generated, IDS, SLOT, w, references, 2) for w in words}
    for group, bound in zip(balls.members, bounds):
        assert np.all(np.isfinite(bound))
        for w in group:
            assert np.all(costs[int(w)] <= bound * (1 + 1e-9))
    assert np.allclose(bounds[-1], costs[5], rtol=1e-6)
    # bigger balls, larger bounds: the whole set's ball is above each of its halves'
    assert np.all(bounds[0] >= bounds[1]) and np.all(bounds[0] >= bounds[2])


def test_a_bound_above_the_threshold_stops_the_group_there():
    generated = local_models.model(seed=3, layers=3, vocab=16)
    own, candidates, references = _setting(generated, IDS, SLOT, np.arange(16), 2)
    balls = group_balls(candidates, [np.arange(16), np.array([2])])
    free = group_pass_bounds(generated, own, SLOT, balls, references, 2, np.full(3, np.inf))
    limits = np.array([np.inf, 0.5 * (free[0, 1] + free[1, 1]), np.inf])
    stopped = group_pass_bounds(generated, own, SLOT, balls, references, 2, limits)
    assert np.array_equal(stopped[:, :2], free[:, :2])
    assert np.isinf(stopped[0, 2])
    # the other group goes on (its chain's reference slopes are its own batch's now: another sound bound)
    assert stopped[1, 2] == pytest.approx(free[1, 2], rel=1e-6)


def test_an_overflowing_group_stops_alone():
    """A ball so large that its softmax bounds overflow stops where it does; the groups passed beside it go on as
    if passed alone."""
    generated = local_models.model(seed=3, layers=3, vocab=16)
    own, candidates, references = _setting(generated, IDS, SLOT, np.arange(16), 2)
    single = group_balls(candidates, [np.array([9]), np.array([7])])
    alone = group_pass_bounds(generated, own, SLOT, single, references, 2, np.full(3, np.inf))
    mixed = GroupBalls((np.arange(16), *single.members), np.vstack([single.centres[:1], single.centres]),
                       np.concatenate([[1e60], single.radii]))
    together = group_pass_bounds(generated, own, SLOT, mixed, references, 2, np.full(3, np.inf))
    assert not np.all(np.isfinite(together[0]))
    np.testing.assert_allclose(together[1:], alone, rtol=1e-3)    # the chains' reference slopes: their own batch


@pytest.mark.parametrize("factor", [0.0, 1.5, np.inf])
def test_the_set_bound_covers_every_word_whatever_the_threshold(factor):
    """The threshold only decides where the work goes: at 0 every word is passed alone (the per-candidate passes'
    own bound), at infinity the undivided set settles as one ball; the bound covers every edit either way."""
    generated = local_models.model(seed=11, layers=3, vocab=20)
    words = np.arange(20)
    own, candidates, references = _setting(generated, IDS, SLOT, words, 2)
    passes = candidate_passes(generated, own, [SLOT], [candidates], [words], references, 2)
    alone = np.array([passes.largest(l) for l in range(3)])
    certificate = group_certificate(generated, own, SLOT, candidates, words, references, 2, factor * alone)
    covered = np.concatenate([m for m, _ in certificate.settled] + [certificate.singles])
    assert sorted(covered) == list(range(20))
    worst = np.max([_costs(generated, IDS, SLOT, w, references, 2) for w in words], axis=0)
    assert np.all(worst <= certificate.bounds * (1 + 1e-9))
    if factor == 0.0:
        assert certificate.singles.size == 20 and not certificate.settled
        assert np.allclose(certificate.bounds, alone, rtol=1e-12)
    if factor == np.inf:
        assert len(certificate.settled) == 1 and certificate.singles.size == 0
    if np.isfinite(factor) and factor > 0:
        assert np.all(certificate.bounds <= factor * alone * (1 + 1e-12))


@pytest.mark.parametrize("last", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_a_group_of_minilm_words_is_bounded_above_each_word(last):
    """all-MiniLM-L6-v2, "The cat sat on the mat." at position 3: a group of the words nearest 'sat' (its ball
    about their mean) and its halves, through layers 0..last, above every member's exact movement."""
    from lipbound.measures.bert import load_text_model

    bert = load_text_model()
    model = bert.model
    ids = bert.encode("The cat sat on the mat.")
    table = model.embeddings.word.astype(np.float64)
    nearest = np.argsort(np.linalg.norm(table - table[ids[3]], axis=1), kind="stable")[1:7]
    own, candidates, references = _setting(model, ids, 3, nearest, last)
    groups = [np.arange(6), *bisect(candidates.mid, np.arange(6))]
    balls = group_balls(candidates, groups)
    bounds = group_pass_bounds(model, own, 3, balls, references, last, np.full(last + 1, np.inf))
    assert np.all(np.isfinite(bounds))
    costs = [_costs(model, ids, 3, word, references, last) for word in nearest]
    for group, bound in zip(balls.members, bounds):
        for w in group:
            assert np.all(costs[w] <= bound * (1 + 1e-9))
