"""The key path's Gram form in floats with its rounding bounded a posteriori (lemma float-gram,
lipbound.local.rounded_grams), against the same form in exact rationals."""

from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lipbound.local.rounded_grams import block_majorants, key_path_squares, query_squares
from lipbound.rigorous.arrays import IntervalArray


def _symmetric_blocks(rng, heads: int, size: int, scale: float) -> np.ndarray:
    """A Gram matrix of random rows in head blocks (H, k, H, k), exactly symmetric in floats."""
    rows = rng.standard_normal((heads * size, 3 * heads * size)) * scale
    gram = rows @ rows.T
    return ((gram + gram.T) * 0.5).reshape(heads, size, heads, size)


def _box(mid: np.ndarray, rad: np.ndarray) -> IntervalArray:
    return IntervalArray(mid - rad, mid + rad)


def _points_of(boxes: list, rng) -> list:
    """The boxes' midpoints, two corners and two random points inside, each a list with one array per box."""
    points = [[b.mid for b in boxes]]
    for _ in range(2):
        points.append([b.mid + b.rad * rng.choice([-1.0, 1.0], b.shape) for b in boxes])
        points.append([b.mid + b.rad * rng.uniform(-1, 1, b.shape) for b in boxes])
    return [[np.clip(x, b.lo, b.hi) for x, b in zip(point, boxes)] for point in points]


def _assert_above_at_points(exact, bound: np.ndarray, points: list, entries: list, close: bool) -> None:
    """``exact(point, *entry) <= bound[0][entry]`` in rationals at every point; with ``close`` (point boxes) the
    bound within 1e-9 of the exact value at the midpoints."""
    for point in points:
        for entry in entries:
            assert exact(point, *entry) <= Fraction(bound[0][entry])
    if close:
        values = np.array([float(exact(points[0], *entry)) for entry in entries])
        tops = np.array([bound[0][entry] for entry in entries])
        assert np.all(tops - values <= 1e-9 * (1.0 + np.abs(values)))


def _below_the_bare_value(exact, bare: np.ndarray, bound: np.ndarray, entries: list) -> int:
    """How many entries' exact value (rationals) lies above the float value without the rounding term ``bare``,
    asserting it never lies above ``bound``."""
    below = 0
    for entry in entries:
        value = exact(*entry)
        assert value <= Fraction(bound[0][entry])
        below += value > Fraction(bare[0][entry])
    return below


def _exact_squares(q, v, f, p, Omega, Psi, b: int, i: int, j: int) -> Fraction:
    """``S_ij`` of the module docstring in rationals, term by term from its definition."""
    H = q.shape[1]

    def form(x, M, h, g, y):
        return sum(Fraction(x[k]) * Fraction(M[h, k, g, l]) * Fraction(y[l])
                   for k in range(x.size) for l in range(y.size))

    total = Fraction(0)
    for h in range(H):
        for g in range(H):
            keys = form(q[b, h, i], Psi, h, g, q[b, g, i])
            outputs = form(v[b, h, j], Omega, h, g, v[b, g, j]) - form(f[b, h, i], Omega, h, g, v[b, g, j]) \
                - form(f[b, g, i], Omega, g, h, v[b, h, j]) + form(f[b, h, i], Omega, h, g, f[b, g, i])
            total += Fraction(p[b, h, i, j]) * Fraction(p[b, g, i, j]) * keys * outputs
    return total


def _case(seed: int, heads: int, n: int, width: float):
    rng = np.random.default_rng(seed)
    d_k, d_v = 2, 3
    mids = [rng.standard_normal((1, heads, n, d_k)) * 3.0, rng.standard_normal((1, heads, n, d_v)),
            rng.standard_normal((1, heads, n, d_v)), rng.dirichlet(np.ones(n), size=(1, heads, n))]
    Omega, Psi = _symmetric_blocks(rng, heads, d_v, 0.7), _symmetric_blocks(rng, heads, d_k, 0.4)
    rads = [width * rng.random(m.shape) for m in mids + [Omega, Psi]]
    return rng, mids + [Omega, Psi], rads


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 10 ** 6), st.integers(1, 3), st.integers(1, 3), st.sampled_from([0.0, 1e-12, 1e-4, 1e-2]))
def test_the_float_gram_bound_is_above_the_exact_form_at_every_point_of_the_boxes(seed, heads, n, width):
    """``key_path_squares`` against ``S_ij`` in rationals at the boxes' midpoints, corners and random points (every
    operand moved, the head blocks too, not kept symmetric): never below; on point boxes within 1e-9 of it."""
    rng, mids, rads = _case(seed, heads, n, width)
    boxes = [_box(m, r) for m, r in zip(mids, rads)]
    bound = key_path_squares(*boxes, block_majorants(boxes[4], boxes[5]))
    assert bound.shape == (1, n, n)
    _assert_above_at_points(lambda point, i, j: _exact_squares(*point, 0, i, j), bound,
                            _points_of(boxes, rng), [(i, j) for i in range(n) for j in range(n)], width == 0.0)


def test_without_the_rounding_term_the_bound_falls_below_the_exact_form():
    """The ``gamma_m`` term is needed: on point boxes (no radius to hide behind) the float value alone is below the
    exact form in rationals for some entries, the bound with it never."""
    below = 0
    for seed in range(40):
        _, mids, _ = _case(seed, 2, 3, 0.0)
        boxes = [IntervalArray(m) for m in mids]
        majorants = block_majorants(boxes[4], boxes[5])
        bare = key_path_squares(*boxes, majorants, rounding=False)
        bound = key_path_squares(*boxes, majorants)
        below += _below_the_bare_value(lambda i, j: _exact_squares(*mids, 0, i, j), bare, bound,
                                       [(i, j) for i in range(3) for j in range(3)])
    assert below > 0


def _exact_query_squares(k, v, f, p, gram, b: int, h: int, i: int) -> Fraction:
    """``S_hi`` of :func:`query_squares` in rationals from its definition."""
    n = k.shape[2]

    def keys(j, l):
        return sum(Fraction(k[b, h, j, a]) * Fraction(gram[h, a, c]) * Fraction(k[b, h, l, c])
                   for a in range(k.shape[-1]) for c in range(k.shape[-1]))

    def values(j, l):
        mean = [Fraction(x) for x in f[b, h, i]]
        return sum((Fraction(v[b, h, j, w]) - mean[w]) * (Fraction(v[b, h, l, w]) - mean[w]) for w in range(len(mean)))
    return sum(Fraction(p[b, h, i, j]) * Fraction(p[b, h, i, l]) * keys(j, l) * values(j, l)
               for j in range(n) for l in range(n))


def _query_case(seed: int, heads: int, n: int, width: float):
    rng = np.random.default_rng(seed)
    mids = [rng.standard_normal((1, heads, n, 2)) * 3.0, rng.standard_normal((1, heads, n, 3)),
            rng.standard_normal((1, heads, n, 3)), rng.dirichlet(np.ones(n), size=(1, heads, n))]
    rows = rng.standard_normal((heads, 4, 2))
    gram = np.matmul(rows.swapaxes(1, 2), rows)
    mids.append((gram + gram.swapaxes(1, 2)) * 0.5)
    return rng, mids, [width * rng.random(m.shape) for m in mids]


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 10 ** 6), st.integers(1, 2), st.integers(1, 3), st.sampled_from([0.0, 1e-12, 1e-4, 1e-2]))
def test_the_float_query_form_is_above_the_exact_form_at_every_point_of_the_boxes(seed, heads, n, width):
    """``query_squares`` against ``S_hi`` in rationals at the boxes' midpoints, corners and random points: never
    below; on point boxes within 1e-9 of it."""
    rng, mids, rads = _query_case(seed, heads, n, width)
    boxes = [_box(m, r) for m, r in zip(mids, rads)]
    bound = query_squares(*boxes)
    assert bound.shape == (1, heads, n)
    _assert_above_at_points(lambda point, h, i: _exact_query_squares(*point, 0, h, i), bound,
                            _points_of(boxes, rng), [(h, i) for h in range(heads) for i in range(n)], width == 0.0)


def test_without_the_rounding_term_the_query_form_falls_below_the_exact_form():
    """As for the key path: on point boxes the float value alone is below the exact form for some rows."""
    below = 0
    for seed in range(40):
        _, mids, _ = _query_case(seed, 2, 3, 0.0)
        boxes = [IntervalArray(m) for m in mids]
        bare, bound = query_squares(*boxes, rounding=False), query_squares(*boxes)
        below += _below_the_bare_value(lambda h, i: _exact_query_squares(*mids, 0, h, i), bare, bound,
                                       [(h, i) for h in range(2) for i in range(3)])
    assert below > 0


def test_the_majorants_bound_the_blocks_norms():
    """``M = psi o omega`` is at least the product of the blocks' spectral norms of magnitudes, and ``M_r`` is only
    the rounding of zero on point blocks."""
    rng = np.random.default_rng(5)
    Omega, Psi = _symmetric_blocks(rng, 3, 4, 1.0), _symmetric_blocks(rng, 3, 2, 1.0)
    M, M_r, psi_top, omega_top = block_majorants(IntervalArray(Omega), IntervalArray(Psi))
    for h in range(3):
        for g in range(3):
            psi = np.linalg.norm(np.abs(Psi[h, :, g]), 2)
            omega = np.linalg.norm(np.abs(Omega[h, :, g]), 2)
            assert M[h, g] >= psi * omega * (1 - 1e-12) and psi <= psi_top and omega <= omega_top
    assert np.all(M_r <= 1e-150)


def _interval_squares(Q: IntervalArray, V: IntervalArray, F: IntervalArray, P: IntervalArray, Omega: IntervalArray,
                      Psi: IntervalArray) -> IntervalArray:
    """``S_ij`` (B, n, n) of the module docstring in interval arithmetic, piece by piece (outward rounded)."""
    Qt, Vt, Ft = (A.swapaxes(1, 2) for A in (Q, V, F))                                       # (B, n, H, .)
    keys = Qt.einsum("bihk,hkgl->bihgl", Psi).einsum("bihgl,bigl->bihg", Qt)                 # (B, i, H, H)
    VO, FO = Vt.einsum("bjhw,hwgz->bjhgz", Omega), Ft.einsum("bihw,hwgz->bihgz", Omega)
    values = VO.einsum("bjhgz,bjgz->bjhg", Vt)
    means = FO.einsum("bihgz,bigz->bihg", Ft)
    cross = FO.einsum("bihgz,bjgz->bijhg", Vt)                                               # f_i^h Omega_hg v_j^g
    outputs = values.expand(1) - cross - cross.swapaxes(3, 4) + means.expand(2)
    weights = P.swapaxes(1, 2).swapaxes(2, 3)                                                # (B, i, j, H)
    return (weights.expand(-1) * weights.expand(-2) * keys.expand(2) * outputs).sum(axis=-1).sum(axis=-1)


def test_on_minilm_the_float_gram_bound_meets_the_interval_route():
    """all-MiniLM-L6-v2, layers 0 and 3, two edited sentences: the key path's squares by the float route lie in the
    interval route's enclosure, up to its upper end times 1 + 1e-8 (on layer 0
    the float route's error terms are 1.7e-9 of the value, the interval route's radius 1.1e-10)."""
    from lipbound.local.point_stages import _head_block_grams
    from lipbound.measures.bert import load_text_model
    from lipbound.numeric.attention import AttentionMap
    from lipbound.rigorous.arrays import softmax

    bert = load_text_model()
    ids = np.array(bert.encode("The cat sat on the mat."))
    batch = np.stack([ids, ids])
    batch[1, 3] = 17129
    X = np.stack([bert.model.embeddings.word[b] for b in batch]).astype(np.float64)
    X += bert.model.embeddings.position[:ids.size]
    for layer in (0, 3):
        engine = AttentionMap(bert.model.layer(layer).as_layer(residual=True))
        projected = IntervalArray(X).matmul(engine.W, exact_sums=True) + IntervalArray(engine.bias)
        Q, K, V = (engine.per_head(projected, part) for part in ("queries", "keys", "values"))
        P = softmax(Q.einsum("bhik,bhjk->bhij", K) * (1.0 / np.sqrt(engine.d_k)), np.ones(ids.size))
        F = P.einsum("bhij,bhjv->bhiv", V)
        Omega, Psi, majorants = _head_block_grams(engine)
        bound = key_path_squares(Q, V, F, P, Omega, Psi, majorants)
        enclosed = _interval_squares(Q, V, F, P, Omega, Psi)
        assert np.all(bound >= enclosed.lo)
        assert np.all(bound <= enclosed.hi + 1e-8 * np.abs(enclosed.hi))
        assert float(np.max(enclosed.hi - enclosed.lo)) < 1e-6 * float(np.max(enclosed.hi))    # not a vacuous box


def _mp(array) -> np.ndarray:
    return np.vectorize(mpmath.mpf, otypes=[object])(np.asarray(array, dtype=np.float64))


def _mp_layer_norm(X: np.ndarray, norm) -> np.ndarray:
    d = X.shape[-1]
    centred = X - (X.sum(axis=-1, keepdims=True) / d) if norm.centred else X
    scale = np.vectorize(lambda s: 1 / mpmath.sqrt(s / d + mpmath.mpf(norm.eps)), otypes=[object])(
        (centred * centred).sum(axis=-1, keepdims=True))
    return _mp(norm.gamma) * centred * scale + _mp(norm.center)


def _mp_block_outputs(model, ids, layers: int) -> list[np.ndarray]:
    """``X + MHA(X)`` of each layer for one sentence in 50-digit arithmetic, written from the weights (the softmax,
    LayerNorms and the erf GELU evaluated by mpmath): an independent forward pass."""
    from lipbound.numeric.attention import AttentionMap
    e = model.embeddings
    n = len(ids)
    X = _mp_layer_norm(_mp(e.word[ids]) + _mp(e.position[e.position_offset:e.position_offset + n])
                       + _mp(e.token_type[0]), e.norm)
    exp = np.vectorize(mpmath.exp, otypes=[object])
    gelu = np.vectorize(lambda h: h * (1 + mpmath.erf(h / mpmath.sqrt(2))) / 2, otypes=[object])
    out = []
    for index in range(layers):
        item = model.layer(index)
        engine = AttentionMap(item.as_layer(residual=True))
        projected = X.dot(_mp(engine.W)) + _mp(engine.bias)
        Q, K, V = (engine.per_head(projected, part) for part in ("queries", "keys", "values"))   # (H, n, .)
        heads = []
        for h in range(engine.H):
            S = Q[h].dot(K[h].T) / mpmath.sqrt(engine.d_k)
            P = exp(S)
            P = P / P.sum(axis=-1, keepdims=True)
            heads.append(P.dot(V[h]))
        Z = np.concatenate(heads, axis=-1).dot(_mp(engine.W_O)) + _mp(engine.b_O) + X
        out.append(Z)
        Y = _mp_layer_norm(Z, item.ln_out)
        hidden = gelu(Y.dot(_mp(item.ffn.W_1)) + _mp(item.ffn.b_1))
        X = _mp_layer_norm(Y + hidden.dot(_mp(item.ffn.W_2)) + _mp(item.ffn.b_2), item.ffn_norm)
    return out


@settings(max_examples=4, deadline=None)
@given(st.integers(0, 10 ** 6), st.sampled_from([4, 6]), st.sampled_from([0.5, 1.0, 2.0]), st.booleans())
def test_every_pass_bound_covers_the_identity_cost_in_50_digits(seed, d, scale, exact_chain):
    """Generated models (hypothesis over seeds, widths and weight scales): every edited sentence's certified bound
    of the per-candidate passes (the Gram forms in floats) at every layer is at least its identity-plan cost
    ``(1/n) sum_i ||z_i(w) - z_i^0||`` (which bounds its W1) with ``z(w)`` from an independent forward pass in 50-digit
    arithmetic; no slack is allowed for the float side, and the bound is that cost up to the passes' radii (the
    two forwards agree)."""
    import local_models

    from lipbound.local.propagate import propagate
    from lipbound.measures.edits import edit_set
    generated = local_models.model(seed=seed % 97, d=d, layers=2, vocab=6, scale=scale)
    ids, slot = [0, 3, 4, 1], 1
    sets = propagate(generated, edit_set(ids, "replace", [slot], np.arange(6)), per_candidate=True,
                     exact_chain=exact_chain)
    passes = sets[0].facts["candidates"]
    with mpmath.workdps(50):
        for index, (word,) in enumerate(passes.words):
            edited = list(ids)
            edited[slot] = int(word)
            for layer, Z in enumerate(_mp_block_outputs(generated, edited, len(passes.bounds))):
                reference = _mp(sets[layer].original)
                cost = sum(mpmath.sqrt(sum(x * x for x in row)) for row in Z - reference) / len(ids)
                bound = passes.bounds[layer][index]
                assert cost <= mpmath.mpf(bound)
                assert mpmath.mpf(bound) - cost <= 2 * passes.widths[layer] + 1e-9 * bound   # the same forward
