"""Witnesses (lower bounds): the batched kernel, the search, the record, and the re-check.

Independent routes must agree: the search kernel (in working coordinates about a centre,
reduced to the span of the projections) against the plain functions of
lipbound.numeric.attention, the stated witness value against the exact-and-interval re-check,
the witness against the dense Jacobian at the same point and against the symbolic upper bound
of the ``dot-product`` variant.  Witness files name the weights they were found on (path and
sha256), and the re-check refuses others.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math

import mpmath
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lipbound.errors import AssumptionError, WeightsError
from lipbound.numeric.attention import (
    dense_jacobian,
    layer_forward,
    layer_jvp,
    layer_vjp,
    self_forward,
    self_jvp,
    self_vjp,
)
from lipbound.numeric.blas import single_threaded_blas
from lipbound.numeric.domains import LayerNormOutputs, TokenBall
from lipbound.numeric.kernels import KERNELS, AttentionMask, DotProduct, L2Distance
from lipbound.numeric.model import DEFAULT_WEIGHTS, Head, Layer, load_default, load_weights
from lipbound.numeric.recheck import ROUNDING_TOLERANCE, Recheck, recheck, recheck_file
from lipbound.numeric.witness import (
    Witness,
    castin_adversarial,
    engine_for,
    in_ball,
    jacobian_norms,
    local_jacobian_norm,
    naive_ascent,
    project_to_ball,
    search_witness,
    structured_starts,
)
from lipbound.numeric.witness.clock import CALL_WORK, INPUT_WORK, STEP_WORK, WORK_PER_SECOND, WorkClock
from lipbound.numeric.witness.problem import SearchProblem
from lipbound.numeric.witness.starts import castin_input
from lipbound.symbolic.assumptions import Assumptions
from lipbound.symbolic.registry import variant


def random_head(rng, d=6, d_k=2, d_v=3, score="dot", causal=False, scale=1.0) -> Head:
    return Head(scale * rng.standard_normal((d, d_k)), scale * rng.standard_normal((d, d_k)),
                rng.standard_normal((d, d_v)), rng.standard_normal(d_k), rng.standard_normal(d_k),
                rng.standard_normal(d_v), kernel=KERNELS[score](), mask=AttentionMask(causal=causal))


@pytest.fixture(scope="module")
def model():
    return load_default()


@pytest.fixture(scope="module")
def l0h0(model):
    layer = model.layers[0]
    return layer.heads[0], layer.ln_in.radius_about_origin


@pytest.fixture(scope="module")
def l0h0_witness(model, l0h0):
    head, radius = l0h0
    # 1 nominal second (about half a CPU second): the value of 3 to six digits (963.47251 against 963.47258)
    return search_witness(head, domain=TokenBall(radius), n=8, budget_seconds=1.0, seed=0, origin=model, layer=0,
                          head=0)


# ---------------------------------------------------------------------------------------------
# The batched kernel against lipbound.numeric.attention
# ---------------------------------------------------------------------------------------------
def _targets(rng, causal):
    heads = [random_head(rng, d=7, d_k=2, d_v=2, causal=causal) for _ in range(2)]
    return [heads[0], Layer(tuple(heads), rng.standard_normal((4, 7)), rng.standard_normal(7)),
            Layer(tuple(heads), rng.standard_normal((4, 7)), residual=True)]


def _reference(target):
    if isinstance(target, Head):
        return (lambda X: self_forward(target, X), lambda X, E: self_jvp(target, X, E)[1],
                lambda X, G: self_vjp(target, X, G))
    return (lambda X: layer_forward(target, X), lambda X, E: layer_jvp(target, X, E)[1],
            lambda X, G: layer_vjp(target, X, G))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("reduce", [False, True])
def test_kernel_agrees_with_attention_module(causal, reduce):
    """Forward, JVP and VJP of the fused kernel (working coordinates about a centre, reduced to
    the head's span) equal those of lipbound.numeric.attention."""
    rng = np.random.default_rng(3)
    for target in _targets(rng, causal):
        center = rng.standard_normal(7)
        kernel = engine_for(target, center, reduce=reduce)
        forward, jvp, vjp = _reference(target)
        X = rng.standard_normal((3, 5, 7))
        Ew = rng.standard_normal((3, 5, kernel.d_in))
        lin = kernel.linearize(kernel.to_work(X))
        np.testing.assert_allclose(lin.F, forward(X), rtol=1e-11, atol=1e-11)   # the residual adds X itself
        np.testing.assert_allclose(lin.jvp(Ew), jvp(X, kernel.direction_from_work(Ew)), rtol=1e-10, atol=1e-10)
        G = rng.standard_normal(lin.F.shape)
        full = vjp(X, G)
        np.testing.assert_allclose(lin.vjp(G), full if kernel.basis is None else full @ kernel.basis,
                                   rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_second_order_term_matches_finite_differences(causal):
    """``curvature(E, G) = grad_X <G, Df(X)[E]>`` against a central difference of JVPs."""
    rng = np.random.default_rng(4)
    for target in _targets(rng, causal):
        kernel = engine_for(target, None)
        Xw = rng.standard_normal((2, 5, kernel.d_in))
        E, D = rng.standard_normal(Xw.shape), rng.standard_normal(Xw.shape)
        G = rng.standard_normal(kernel.linearize(Xw).F.shape)
        h = 1e-6
        plus = np.sum(G * kernel.linearize(Xw + h * D).jvp(E), axis=(1, 2))
        minus = np.sum(G * kernel.linearize(Xw - h * D).jvp(E), axis=(1, 2))
        analytic = np.sum(kernel.linearize(Xw).curvature(E, G) * D, axis=(1, 2))
        np.testing.assert_allclose(analytic, (plus - minus) / (2 * h), rtol=1e-6)


def test_output_space_power_iteration_matches_dense_norm():
    """The Gram-sandwich step equals ``Df (Df^T G)``, and the batched norms converge to the
    spectral norm of the dense Jacobian (never above it)."""
    rng = np.random.default_rng(5)
    head = random_head(rng, d=6, d_k=2, d_v=3)
    kernel = engine_for(head, None, reduce=False)
    X = rng.standard_normal((4, 3, 6))
    lin = kernel.linearize(X)
    G = rng.standard_normal((4, 3, 3))
    np.testing.assert_allclose(lin.gram_step(G), lin.jvp(lin.vjp(G)), rtol=1e-11, atol=1e-11)
    sigma, E = jacobian_norms(kernel, X, steps=500)
    dense = np.array([np.linalg.norm(dense_jacobian(lambda Y, T: self_jvp(head, Y, T), x), 2) for x in X])
    assert np.all(sigma <= dense * (1 + 1e-12))
    np.testing.assert_allclose(sigma, dense, rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(lin.jvp(E), axis=(1, 2)), sigma, rtol=1e-9)


# ---------------------------------------------------------------------------------------------
# The record
# ---------------------------------------------------------------------------------------------
def test_save_load_round_trip_without_pickle(tmp_path, model, l0h0_witness):
    path = l0h0_witness.save(tmp_path / "witness")
    assert path.suffix == ".npz"
    with np.load(path, allow_pickle=False) as data:            # readable with pickling refused
        assert all(data[key].dtype != object for key in data.files)
        assert set(data.files) == {"X", "E", "center", "metadata"}
    loaded = Witness.load(path)
    np.testing.assert_array_equal(loaded.X, l0h0_witness.X)
    np.testing.assert_array_equal(loaded.E, l0h0_witness.E)
    np.testing.assert_array_equal(loaded.center, l0h0_witness.center)
    assert loaded.value == l0h0_witness.value and loaded.radius == l0h0_witness.radius
    assert loaded.metadata() == l0h0_witness.metadata()
    assert (loaded.model, loaded.layer, loaded.head, loaded.score, loaded.residual) == \
        ("sentence-transformers/all-MiniLM-L6-v2", 0, 0, "dot", False)
    # the weights it was found on: their file and its sha256, and the domain searched
    assert loaded.weights == model.path == str(DEFAULT_WEIGHTS)
    assert loaded.sha256 == model.sha256 == hashlib.sha256(DEFAULT_WEIGHTS.read_bytes()).hexdigest()
    assert loaded.domain == TokenBall(l0h0_witness.radius).describe()


def test_load_refuses_pickled_and_foreign_files(tmp_path):
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, X=np.zeros((2, 3)), center=np.zeros(3), metadata=np.array([{"format": 1}], dtype=object))
    with pytest.raises(WeightsError, match="pickle"):
        Witness.load(pickled)
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, weights=np.ones(3))
    with pytest.raises(WeightsError, match="metadata"):
        Witness.load(foreign)
    with pytest.raises(WeightsError, match="no such file"):
        Witness.load(tmp_path / "missing.npz")


def test_witness_validates_its_fields():
    X = np.zeros((2, 3))
    with pytest.raises(AssumptionError, match="E"):
        Witness(kind="jacobian", X=X, value=1.0, radius=1.0, center=None)
    with pytest.raises(WeightsError, match="shape"):
        Witness(kind="secant", X=X, Y=np.zeros((3, 3)), value=1.0, radius=1.0, center=None)
    with pytest.raises(AssumptionError, match="radius"):
        Witness(kind="secant", X=X, Y=X + 1, value=1.0, radius=-1.0, center=None)
    with pytest.raises(AssumptionError, match="norm"):
        Witness(kind="jacobian", X=X, E=X + 1, value=1.0, radius=1.0, center=None, norm="2,1")
    with pytest.raises(WeightsError, match="finite"):
        Witness(kind="secant", X=X + np.nan, Y=X, value=1.0, radius=1.0, center=None)


# ---------------------------------------------------------------------------------------------
# The re-check
# ---------------------------------------------------------------------------------------------
def test_recheck_reproduces_the_real_witness(l0h0, l0h0_witness):
    head, _ = l0h0
    result = recheck(l0h0_witness, head)
    assert isinstance(result, Recheck) and result.valid and result.in_domain
    assert result.lower <= float(result.value) <= result.upper
    assert (result.upper - result.lower) <= 1e-12 * result.upper   # 50 digits leave a tight enclosure
    np.testing.assert_allclose(float(result.value), l0h0_witness.value, rtol=1e-9)
    assert result.certified_lower_bound == result.lower


def test_recheck_file_uses_the_recorded_weights(tmp_path, model, l0h0_witness):
    path = l0h0_witness.save(tmp_path / "w.npz")
    result = recheck_file(path)                                     # the file the witness records
    assert result.valid
    np.testing.assert_allclose(float(result.value), l0h0_witness.value, rtol=1e-9)
    assert (result.weights, result.sha256) == (model.path, model.sha256)   # it says which weights it used
    from_file = recheck_file(path, weights=DEFAULT_WEIGHTS)         # a checkpoint path, loaded afresh
    assert from_file.valid and from_file.lower == result.lower
    assert (from_file.weights, from_file.sha256) == (str(DEFAULT_WEIGHTS), model.sha256)
    from_model = recheck_file(path, weights=model)                  # a loaded model
    assert from_model.valid and from_model.lower == result.lower and from_model.sha256 == model.sha256
    # a witness that names another model but no file cannot fall back on the embedded weights
    renamed = dataclasses.replace(l0h0_witness, model="some/other-model", weights="", sha256="")
    with pytest.raises(WeightsError, match="other-model"):
        recheck_file(renamed.save(tmp_path / "other.npz"))
    # nor one whose weights file has gone
    moved = dataclasses.replace(l0h0_witness, weights=str(tmp_path / "gone.safetensors"))
    with pytest.raises(WeightsError, match="gone.safetensors"):
        recheck_file(moved.save(tmp_path / "moved.npz"))


def _flip_a_weight_bit(path):
    """Flip the lowest bit of the first byte of a safetensors file's tensor data (after the 8-byte
    header length and the JSON header): a mantissa bit of the first weight, so the file still
    loads, with finite weights, but has another sha256."""
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    data[start] ^= 1
    path.write_bytes(bytes(data))


def test_recheck_refuses_weights_with_another_hash(tmp_path, model, l0h0_witness):
    """The sha256 a witness records must match the weights it is re-checked against, whether
    they are passed explicitly or read from the recorded file."""
    copy = tmp_path / "copy.safetensors"
    copy.write_bytes(DEFAULT_WEIGHTS.read_bytes())
    found_on_copy = dataclasses.replace(l0h0_witness, weights=str(copy)).save(tmp_path / "w.npz")
    before = recheck_file(found_on_copy)                            # the copy is byte-identical: accepted
    assert before.valid and (before.weights, before.sha256) == (str(copy), model.sha256)
    _flip_a_weight_bit(copy)
    modified = load_weights(copy, layers=[0])
    assert modified.sha256 != model.sha256
    found_on_default = l0h0_witness.save(tmp_path / "default.npz")
    # the recorded file, changed since; or the changed file passed as a path or as a loaded model
    attempts = [(found_on_copy, None), (found_on_copy, copy), (found_on_copy, modified),
                (found_on_default, copy), (found_on_default, modified)]
    for witness_file, weights in attempts:
        with pytest.raises(WeightsError, match="sha256") as error:
            recheck_file(witness_file, weights=weights)
        # the message names both hashes: the recorded one and the one of the weights offered
        assert model.sha256[:16] in str(error.value) and modified.sha256[:16] in str(error.value)


def test_recheck_flags_tampered_witnesses(l0h0, l0h0_witness):
    head, radius = l0h0
    inflated = dataclasses.replace(l0h0_witness, value=l0h0_witness.value * (1 + 100 * ROUNDING_TOLERANCE))
    result = recheck(inflated, head)
    assert not result.valid and result.in_domain and "below the stated" in result.message
    X = np.array(l0h0_witness.X)
    X[3] *= radius * 1.000001 / np.linalg.norm(X[3])
    outside = recheck(dataclasses.replace(l0h0_witness, X=X), head)
    assert not outside.in_domain and not outside.valid and outside.certified_lower_bound is None
    assert outside.max_distance > radius


def test_domain_is_decided_exactly():
    """A token exactly on the sphere is inside; the next float outward is not."""
    rng = np.random.default_rng(6)
    head = random_head(rng, d=3, d_k=2, d_v=2)
    radius = 1.5
    X = np.array([[radius, 0.0, 0.0], [0.0, 0.0, -radius]])
    E = np.ones((2, 3)) / math.sqrt(6)
    _, dF = self_jvp(head, X[None], E[None])
    on_sphere = Witness(kind="jacobian", X=X, E=E, value=float(np.linalg.norm(dF)), radius=radius, center=None)
    assert recheck(on_sphere, head).in_domain
    X_out = X.copy()
    X_out[0, 0] = math.nextafter(radius, math.inf)
    assert not recheck(dataclasses.replace(on_sphere, X=X_out), head).in_domain
    centred = dataclasses.replace(on_sphere, X=X + 10.0, center=np.full(3, 10.0))
    # X + 10 rounds, so the shifted tokens may sit a few ulps off the sphere: the check must decide exactly
    exact = [sum((float(mpmath.mpf(x) - 10)) ** 2 for x in row) for row in X + 10.0]
    assert recheck(centred, head).in_domain == all(e <= radius ** 2 for e in exact)


@pytest.mark.parametrize("score", ["dot", "l2", "cosine"])
@pytest.mark.parametrize("causal", [False, True])
def test_recheck_agrees_with_dense_jacobian_for_every_score(score, causal):
    """The high-precision JVP (written again in recheck.py) against the float64 dense Jacobian."""
    rng = np.random.default_rng(7)
    head = random_head(rng, d=5, d_k=2, d_v=3, score=score, causal=causal)
    X = rng.standard_normal((4, 5))
    J = dense_jacobian(lambda Y, T: self_jvp(head, Y, T), X)
    _, _, right = np.linalg.svd(J)
    E = right[0].reshape(X.shape)
    value = float(np.linalg.norm(J @ E.ravel()))
    witness = Witness(kind="jacobian", X=X, E=E, value=value, radius=10.0, center=None, score=score)
    result = recheck(witness, head)
    assert result.valid
    np.testing.assert_allclose(float(result.value), np.linalg.norm(J, 2), rtol=1e-10)


def test_secant_recheck_in_both_norms():
    rng = np.random.default_rng(8)
    head = random_head(rng)
    X, Y = rng.standard_normal((3, 6)), rng.standard_normal((3, 6))
    diff_out = self_forward(head, X[None])[0] - self_forward(head, Y[None])[0]
    ratios = {"fro": np.linalg.norm(diff_out) / np.linalg.norm(X - Y),
              "2,1": np.linalg.norm(diff_out, axis=1).sum() / np.linalg.norm(X - Y, axis=1).sum()}
    for norm, ratio in ratios.items():
        witness = Witness(kind="secant", X=X, Y=Y, value=ratio, radius=5.0, center=None, norm=norm)
        result = recheck(witness, head)
        assert result.valid
        np.testing.assert_allclose(float(result.value), ratio, rtol=1e-12)


def test_recheck_refuses_the_wrong_map(l0h0_witness, model):
    layer = model.layers[0]
    with pytest.raises(AssumptionError, match="single Head"):
        recheck(l0h0_witness, layer.as_layer())
    with pytest.raises(WeightsError, match="width"):
        recheck(l0h0_witness, random_head(np.random.default_rng(0)))


# ---------------------------------------------------------------------------------------------
# Soundness against independent routes
# ---------------------------------------------------------------------------------------------
def test_witness_never_exceeds_the_dense_jacobian_norm():
    """On small heads the stated value is ||Df(X)[E]|| with ||E|| = 1: at most the exact
    spectral norm of the dense Jacobian at the same point, and close to it."""
    rng = np.random.default_rng(9)
    # 0.2 nominal seconds: about 0.2 CPU seconds on these tiny heads, and every stage of the search runs
    for trial in range(4):
        head = random_head(rng, d=5, d_k=2, d_v=2, causal=trial % 2 == 1)
        witness = search_witness(head, domain=TokenBall(2.0), n=3, budget_seconds=0.2, seed=trial)
        J = dense_jacobian(lambda Y, T: self_jvp(head, Y, T), witness.X)
        exact = np.linalg.norm(J, 2)
        assert witness.value <= exact * (1 + 1e-12)
        np.testing.assert_allclose(witness.value, exact, rtol=1e-6)


@functools.lru_cache(maxsize=1)
def _dot_product_bound_function():
    return variant("dot-product").derive(Assumptions()).lambdify("mpmath")


def _dot_product_bound(head: Head, radius: float, n: int) -> float:
    """The symbolic ``dot-product`` bound (ball about 0, Frobenius norm), evaluated in mpmath."""
    symbols, function = _dot_product_bound_function()
    values = {"A": np.linalg.norm(head.A, 2), "R": radius, "W_K": np.linalg.norm(head.W_K, 2),
              "W_Q": np.linalg.norm(head.W_Q, 2), "W_V": np.linalg.norm(head.W_V, 2),
              "W_K*b_Q": np.linalg.norm(head.W_K @ head.b_Q), "b_Q": np.linalg.norm(head.b_Q),
              "d_k": head.d_k, "n": n}
    return float(function(*[values[str(s)] for s in symbols]))


def test_witnesses_stay_below_the_symbolic_upper_bound(model):
    rng = np.random.default_rng(10)
    for trial in range(3):
        head = random_head(rng, d=6, d_k=2, d_v=3, scale=1.5)
        radius, n = [0.5, 2.0, 4.0][trial], [3, 4, 6][trial]
        witness = search_witness(head, domain=TokenBall(radius), n=n, budget_seconds=0.2, seed=trial)
        assert witness.value <= _dot_product_bound(head, radius, n)
    layer = model.layers[5]
    head, radius = layer.heads[3], layer.ln_in.radius_about_origin
    witness = search_witness(head, domain=TokenBall(radius), n=8, budget_seconds=1.5)
    bound = _dot_product_bound(head, radius, 8)
    assert 300 < witness.value <= bound


# ---------------------------------------------------------------------------------------------
# The searches on the real model
# ---------------------------------------------------------------------------------------------
def test_structured_search_beats_300_on_layer0_head0(l0h0_witness, l0h0):
    """On all-MiniLM-L6-v2 layer 0 head 0, n = 8, R = 20.25 (the LayerNorm radius about the
    origin, max|gamma| sqrt(d) + ||beta||), tuned naive ascent of the secant ratio reaches 12 to
    85, while two far keys with a query tied between them (the alpha/beta inputs of
    lipbound.numeric.witness) reach about 340."""
    _, radius = l0h0
    assert l0h0_witness.value > 300
    assert l0h0_witness.in_domain() and l0h0_witness.radius == radius
    np.testing.assert_array_equal(l0h0_witness.center, np.zeros(384))
    # the budget (1 nominal second) is work, not wall-clock time: the search stays within it
    assert l0h0_witness.details["pool_work"] + l0h0_witness.details["polish_work"] <= 1.0


def _arithmetic(target, n: int, width: int) -> int:
    """Multiply-adds of one input's step by the cost model, from the weights' shapes: ``H r (r (d_k + d_v) + k (2 d_k
    + d_v))`` for ``H`` heads, ``r`` rows and working width ``k``."""
    heads = target.heads if isinstance(target, Layer) else (target,)
    d_k, d_v = heads[0].W_K.shape[1], heads[0].W_V.shape[1]
    return len(heads) * n * (n * (d_k + d_v) + width * (2 * d_k + d_v))


def test_the_clock_charges_the_arithmetic_on_real_maps_and_the_dispatch_on_tiny_ones(model):
    """An evaluation of ``b`` inputs in ``s`` power steps is charged ``(s + 3) b w + c_call`` multiply-adds on MiniLM's
    head and layer at verify's n = 8 (the floors lie below them, so the real models' witnesses are those of the
    arithmetic alone), and the steps' dispatch on a tiny head, whose arithmetic would buy several times the CPU."""
    layer = model.layer(0)
    rng = np.random.default_rng(4)
    tiny = random_head(rng, d=5, d_k=2, d_v=2)
    for target, domain, n, floored in ((layer.heads[0], LayerNormOutputs(layer.ln_in), 8, False),
                                       (layer.as_layer(), LayerNormOutputs(layer.ln_in), 8, False),
                                       (tiny, TokenBall(1.0), 3, True)):
        problem = SearchProblem(target, "self", domain, None, n, None, WorkClock())
        w = _arithmetic(target, n, problem.width)
        assert w == problem.work_per_input
        for batch, steps in ((1, 0), (1, 6), (4, 8), (32, 30)):
            Z = problem.random(rng, batch, 0.9)
            before = problem.clock()
            problem.evaluate(Z, rng.standard_normal(Z.shape), steps)
            charged = (problem.clock() - before) * WORK_PER_SECOND - CALL_WORK
            arithmetic = (steps + 3) * batch * w
            if not floored:
                assert charged == pytest.approx(arithmetic, rel=1e-12)
            else:
                assert charged == pytest.approx((steps + 3) * max(batch * INPUT_WORK, STEP_WORK), rel=1e-12)
                assert charged >= 4 * arithmetic


def test_structured_starts_predict_the_jacobian_norm(l0h0):
    head, radius = l0h0
    kernel = engine_for(head, None)
    W_Q, W_K, W_V, b_Q, _, _ = kernel.head_weights(0)
    X, phi = structured_starts(W_Q, W_K, W_V, b_Q, radius * (1 - 1e-6), 8, count=16, steps=150)
    assert np.all(np.diff(phi) <= 0)
    sigma, _ = jacobian_norms(kernel, X[:4], steps=80)
    np.testing.assert_allclose(sigma, phi[:4], rtol=0.02)
    # the tie: the queries' scores of the two keys agree to rounding, (b A + u) . (x_1 - x_2) = 0
    A, u = W_Q @ W_K.T / math.sqrt(32), W_K @ b_Q / math.sqrt(32)
    g, spread = X[0, 2] @ A + u, X[0, 0] - X[0, 1]
    assert abs(g @ spread) < 1e-9 * np.linalg.norm(g) * np.linalg.norm(spread)
    assert np.all(np.linalg.norm(X, axis=-1) <= radius)
    with pytest.raises(AssumptionError, match="at least 3"):
        structured_starts(W_Q, W_K, W_V, b_Q, radius, 2)


def test_naive_and_castin_baselines_run_and_recheck(l0h0, l0h0_witness):
    head, radius = l0h0
    naive = naive_ascent(head, domain=TokenBall(radius), n=8, budget_seconds=1.0, seed=1)
    assert naive.kind == "secant" and naive.method == "naive-ascent"
    assert recheck(naive, head).valid
    castin = castin_adversarial(head, domain=TokenBall(radius), n=8)
    assert recheck(castin, head).valid
    # all-MiniLM L0H0: lambda_max <= -8 lambda_min, so x_1 = -R u and x_2 = .. = x_8 = R u
    np.testing.assert_allclose(castin.X[1:], np.broadcast_to(castin.X[1], (7, 384)), rtol=0, atol=0)
    np.testing.assert_allclose(castin.X[0], -castin.X[1], rtol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(castin.X[1]), radius, rtol=1e-8)
    assert 0 < castin.value < naive.value < l0h0_witness.value


def test_castin_reduced_eigenpairs_match_the_literal_recipe(model):
    """The d_k x d_k route to A^T's eigenpairs picks the same eigenvector (up to sign) as
    numpy.linalg.eig on the full d x d matrix, as in Castin et al.'s code."""
    for head in model.layers[5].heads[:2]:
        with single_threaded_blas():
            literal = castin_input(head.W_Q, head.W_K, 1.0, 3, literal=True)
            reduced = castin_input(head.W_Q, head.W_K, 1.0, 3, literal=False)
        assert min(np.abs(literal - reduced).max(), np.abs(literal + reduced).max()) < 1e-10


def test_secant_witness_in_the_21_norm(l0h0):
    head, radius = l0h0
    witness = search_witness(head, domain=TokenBall(radius), n=6, budget_seconds=1.5, norm="2,1")
    assert witness.kind == "secant" and witness.norm == "2,1"
    moved = np.flatnonzero(np.any(witness.X != witness.Y, axis=1))
    assert moved.tolist() == [witness.details["moved_token"]]
    result = recheck(witness, head)
    assert result.valid
    np.testing.assert_allclose(float(result.value), witness.value, rtol=1e-9)
    assert witness.value > 300


def test_layer_witness_on_a_small_random_layer():
    rng = np.random.default_rng(11)
    heads = tuple(random_head(rng, d=8, d_k=2, d_v=2) for _ in range(3))
    for residual in (False, True):
        layer = Layer(heads, rng.standard_normal((6, 8)), rng.standard_normal(8), residual=residual)
        # 0.3 nominal seconds (about 0.3 CPU seconds on this tiny layer): every stage of the search runs
        witness = search_witness(layer, domain=TokenBall(1.5, center=rng.standard_normal(8)), n=4, budget_seconds=0.3)
        assert witness.head is None and witness.residual == residual
        assert recheck(witness, layer).valid
        dense = dense_jacobian(lambda Y, T: layer_jvp(layer, Y, T), witness.X)
        assert witness.value <= np.linalg.norm(dense, 2) * (1 + 1e-12)


def test_polish_best_turns_to_each_family_when_the_best_converges(monkeypatch):
    """Once the best point has converged, the time left goes to each other family's two best points together,
    constructed families before random ones, and then one by one to the rest; every candidate comes back once."""
    from lipbound.numeric.witness import ascent
    from lipbound.numeric.witness.problem import SearchProblem
    rng = np.random.default_rng(7)
    head = random_head(rng, d=8, d_k=3, d_v=3)
    problem = SearchProblem(head, "self", TokenBall(2.0), None, 4, None)
    families = ["random", "structured", "random", "structured", "structured", "rotary-tied", "rotary-tied"]
    starts = ascent.start_candidates(problem, problem.random(rng, len(families)), families, rng)
    turns, plain = [], ascent.polish
    monkeypatch.setattr(ascent, "polish", lambda p, c, *a, **k: turns.append(list(c.family)) or plain(p, c, *a, **k))
    result = ascent.polish_best(problem, starts, problem.clock() + 1e3)      # ample: every turn converges
    assert sorted(result.family) == sorted(families) and turns[0] == families and len(turns[1]) == 1
    first = turns[1][0]
    constructed = {"structured", "rotary-tied"} - {first}
    later = turns[2:2 + len(constructed)]
    assert all(len(turn) == 2 and len(set(turn)) == 1 for turn in later)
    assert {turn[0] for turn in later} == constructed
    if first != "random":
        assert turns[2 + len(constructed)] == ["random", "random"]
    assert sum(len(turn) for turn in turns[1:]) == len(families)
    assert np.all(np.sort(result.sigma) >= np.sort(starts.sigma) * (1 - 1e-12))


def test_polish_best_keeps_every_candidate_and_never_loses():
    """The focused polish returns every candidate, none below its start, the best at least what a plain polish of
    the whole batch reaches by the first deadline, and every value the Jacobian norm at its point."""
    from lipbound.numeric.witness.ascent import polish, polish_best, start_candidates
    from lipbound.numeric.witness.problem import SearchProblem
    rng = np.random.default_rng(5)
    head = random_head(rng, d=8, d_k=3, d_v=3)
    problem = SearchProblem(head, "self", TokenBall(2.0), None, 4, None)
    starts = start_candidates(problem, problem.random(rng, 6), ["random"] * 6, rng)
    began = problem.clock()
    focused = polish_best(problem, starts, began + 0.02)
    assert sorted(focused.family) == sorted(starts.family) and len(focused.sigma) == 6
    assert np.sort(focused.sigma)[-1] >= np.sort(starts.sigma)[-1]
    assert np.all(np.sort(focused.sigma) >= np.sort(starts.sigma) * (1 - 1e-12))
    clock = problem.clock()
    plain = polish(problem, starts, clock + 0.3 * 0.02)
    assert np.max(focused.sigma) >= np.max(plain.sigma) * (1 - 1e-9)
    lifted = problem.lift(focused.X)[0]
    for X, value in zip(lifted, focused.sigma):
        dense = dense_jacobian(lambda Y, T: self_jvp(head, Y, T), X)
        assert value <= np.linalg.norm(dense, 2) * (1 + 1e-9)


def test_search_on_layernorm_outputs(model):
    """A LayerNormOutputs domain is searched on the image itself, ``gamma * z + beta`` with ``z``
    orthogonal to 1 and ``||z|| <= sqrt(d)`` (an ellipsoid in a hyperplane): the witness stores the
    exact coordinates z of its tokens and w of its direction (``E = gamma * w``, ``sum w = 0``,
    tangent to the image), which the re-check decides exactly."""
    layer = model.layers[0]
    head, norm = layer.heads[0], layer.ln_in
    domain = LayerNormOutputs(norm)
    witness = search_witness(head, domain=domain, n=8, budget_seconds=1.0, origin=model, layer=0, head=0)
    assert witness.radius == norm.radius_about_center < norm.radius_about_origin
    np.testing.assert_array_equal(witness.center, norm.beta)
    np.testing.assert_array_equal(witness.gamma, norm.gamma)
    assert witness.domain == domain.describe() and witness.in_domain()
    z, w = witness.coordinates["X"], witness.coordinates["E"]
    assert all(math.fsum(row) == 0 for row in z) and all(math.fsum(row) == 0 for row in w)
    np.testing.assert_allclose(witness.X, norm.beta + norm.gamma * z, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(witness.E, norm.gamma * w)
    result = recheck(witness, head)
    assert result.valid and result.in_domain and result.max_distance <= math.sqrt(norm.d)
    np.testing.assert_allclose(float(result.value), witness.value, rtol=1e-9)
    assert witness.value > 300
    # a direction off the image, or a token off the hyperplane, is refused
    off = dataclasses.replace(witness, coordinates={"X": z, "E": w + 1e-3})
    assert not recheck(off, head).valid
    shifted = z.copy()
    shifted[0, 0] += 2.0 ** -30
    assert not recheck(dataclasses.replace(witness, coordinates={"X": shifted, "E": w}), head).in_domain


@pytest.mark.slow
def test_real_layer_witness_rechecks(model):
    layer = model.layers[0]
    target, radius = layer.as_layer(), layer.ln_in.radius_about_origin
    witness = search_witness(target, domain=TokenBall(radius), n=8, budget_seconds=10.0, origin=model, layer=0)
    result = recheck(witness, target)
    assert result.valid
    np.testing.assert_allclose(float(result.value), witness.value, rtol=1e-9)
    assert witness.value > 500


@pytest.mark.slow
def test_real_head_n32_beats_castin_and_naive(model):
    layer = model.layers[0]
    head, radius = layer.heads[0], layer.ln_in.radius_about_origin
    ours = search_witness(head, domain=TokenBall(radius), n=32, budget_seconds=5.0)
    naive = naive_ascent(head, domain=TokenBall(radius), n=32, budget_seconds=5.0)
    castin = castin_adversarial(head, domain=TokenBall(radius), n=32)
    assert ours.value > 3 * naive.value and ours.value > castin.value
    assert recheck(ours, head).valid


def test_search_arguments_are_checked(l0h0):
    head, radius = l0h0
    ball = TokenBall(radius)
    with pytest.raises(AssumptionError, match="radius"):
        search_witness(head, domain=TokenBall(-1.0), n=4, budget_seconds=1)
    with pytest.raises(AssumptionError, match="domain"):                 # a bare radius is not a domain
        search_witness(head, domain=radius, n=4, budget_seconds=1)
    with pytest.raises(AssumptionError, match="n"):
        search_witness(head, domain=ball, n=0, budget_seconds=1)
    with pytest.raises(AssumptionError, match="norm"):
        search_witness(head, domain=ball, n=4, budget_seconds=1, norm="inf")
    with pytest.raises(AssumptionError, match="centre of shape"):         # a centre of the wrong width
        search_witness(head, domain=TokenBall(radius, center=np.zeros(3)), n=4, budget_seconds=1)
    with pytest.raises(WeightsError, match="Head or a Layer"):
        search_witness("head", domain=ball, n=4, budget_seconds=1)


def test_projection_onto_the_ball():
    rng = np.random.default_rng(12)
    center = rng.standard_normal(4)
    X = center + 10 * rng.standard_normal((5, 3, 4))
    projected = project_to_ball(X, 2.0, center)
    assert np.all(in_ball(projected, center, 2.0))
    inside = center + 0.1 * rng.standard_normal((3, 4))
    np.testing.assert_array_equal(project_to_ball(inside, 2.0, center), inside)


# ---------------------------------------------------------------------------------------------
# Properties over small shapes, radii and seeds
# ---------------------------------------------------------------------------------------------
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=st.integers(2, 6), d_k=st.integers(1, 3), n=st.integers(2, 5), radius=st.floats(0.05, 6.0),
       seed=st.integers(0, 2 ** 16), score=st.sampled_from(["dot", "dot", "l2", "cosine"]),
       causal=st.booleans(), centred=st.booleans())
def test_search_results_lie_in_the_ball_and_recheck(d, d_k, n, radius, seed, score, causal, centred):
    rng = np.random.default_rng(seed)
    head = random_head(rng, d=d, d_k=d_k, d_v=2, score=score, causal=causal)
    center = rng.standard_normal(d) if centred else None
    # 0.2 nominal seconds: every stage of the search runs in all ten (at 0.1 the continuation did not in four)
    witness = search_witness(head, domain=TokenBall(radius, center=center), n=n, budget_seconds=0.2, seed=seed)
    assert witness.in_domain()
    result = recheck(witness, head)
    assert result.in_domain and result.valid
    np.testing.assert_allclose(float(result.value), witness.value, rtol=1e-9)
    _, dF = self_jvp(head, witness.X[None], witness.E[None])
    np.testing.assert_allclose(np.linalg.norm(dF), witness.value, rtol=1e-12)
    assert local_jacobian_norm(head, witness.X, iterations=300, start=witness.E)[0] >= witness.value * (1 - 1e-9)


def test_recheck_uses_the_values_the_head_applies():
    """Tied L2 heads with Kim et al.'s values go through A: the re-check must use Head.V, not W_V."""
    rng = np.random.default_rng(4)
    W = rng.standard_normal((3, 2))
    head = Head(W, W, rng.standard_normal((3, 2)), kernel=L2Distance(), kim_values=True)
    witness = search_witness(head, domain=TokenBall(1.5), n=3, budget_seconds=0.5)
    result = recheck(witness, head)
    assert result.valid, result.message
    with pytest.raises(WeightsError, match="kim_values"):
        Head(W, W, W, kernel=DotProduct(), kim_values=True)


@given(rows=st.integers(3, 40), rank=st.integers(1, 6), columns=st.integers(1, 30), seed=st.integers(0, 2 ** 16))
@settings(max_examples=25, deadline=None)
def test_the_starts_factored_decompositions_agree_with_the_dense_ones(rows, rank, columns, seed):
    """``product_norm`` and ``left_singular`` (a product through its thin factors) against the SVD of the product."""
    from lipbound.numeric.witness.starts import left_singular, product_norm

    rng = np.random.default_rng(seed)
    A, B = rng.standard_normal((rows, rank)), rng.standard_normal((rank, columns))
    left, values, _ = np.linalg.svd(A @ B, full_matrices=False)
    assert product_norm(A, B) == pytest.approx(values[0], rel=1e-10)
    factored, widths = left_singular(A, B)
    k = min(rank, columns)
    np.testing.assert_allclose(widths[:k], values[:k], rtol=1e-9, atol=1e-12 * values[0])
    # the top direction, up to its sign, where the top value is simple
    if k == 1 or values[0] > values[1] * (1 + 1e-6):
        assert abs(factored[:, 0] @ left[:, 0]) == pytest.approx(1.0, abs=1e-8)
    alone, alone_widths = left_singular(A, None)
    np.testing.assert_allclose(alone_widths, np.linalg.svd(A, compute_uv=False))


def test_mirror_starts_of_one_family_take_one_polish_slot():
    """Starts whose values agree to 1e-3 count once within their family, never across families."""
    from lipbound.numeric.witness.ascent import Candidates
    from lipbound.numeric.witness.search import _distinct

    sigma = np.array([510.7913, 510.7905, 490.64, 490.6416, 510.7910, 90.0, 98.82])
    family = ["self-tied", "self-tied", "self-tied", "self-tied", "structured", "structured", "structured"]
    cands = Candidates(np.zeros((7, 1, 1)), np.zeros((7, 1, 1)), sigma, family)
    order = list(np.argsort(-sigma))
    assert _distinct(cands, order) == [0, 4, 3, 6, 5]
