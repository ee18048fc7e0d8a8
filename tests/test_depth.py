"""Weight-shared iteration of a certified tied-L2 block built from real weights.

Banach: with Lip_F(Att) <= L < 1, X -> Y - Att(X) and X -> Att(X) converge geometrically at rate
<= L; every measured rate ||X_{k+2} - X_{k+1}|| / ||X_{k+1} - X_k|| is bounded by L whatever L is.
Independent routes: the certified constant against the closed form of the global L2 theorem
evaluated in numpy (SVD norms), against secant ratios at far-apart inputs and against the
power-iteration witness at the data.  Layers and heads are counted from 0.
"""

from __future__ import annotations

import json

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lipbound.cli import main
from lipbound.errors import AssumptionError
from lipbound.measures.bert import load_text_model
from lipbound.measures.depth import depth_experiment, invert, iterate, scale_sweep, sweep_table, tied_l2_block
from lipbound.numeric import attention
from lipbound.numeric.kernels import L2Distance

SENTENCE = "The cat slept all afternoon."  # n = 8 tokens


@pytest.fixture(scope="module")
def model():
    return load_text_model()


@pytest.fixture(scope="module")
def inputs(model):
    return model.hidden_states(model.encode(SENTENCE))[0]


@pytest.fixture(scope="module")
def contraction(model):
    return tied_l2_block(model, layer=0, head=0, n=8, certified=0.5)


@pytest.fixture(scope="module")
def sweep(model):
    return scale_sweep((0.5, 16.0, 64.0), steps=100, sentence=SENTENCE, model=model)


# The certified constant ----------------------------------------------------------------------------
def test_block_is_rescaled_to_the_requested_constant(contraction, model):
    np.testing.assert_allclose(contraction.certified, 0.5, rtol=1e-9)
    head = contraction.head
    assert isinstance(head.kernel, L2Distance) and head.kim_values and np.array_equal(head.W_Q, head.W_K)
    assert head.V.shape == (384, 384)
    np.testing.assert_array_equal(head.W_Q, model.heads(0)[0].W_Q)  # layer 0, head 0: the first of each
    X = np.random.default_rng(0).standard_normal((8, 384)) * 5
    np.testing.assert_allclose(contraction(X), attention.self_forward(head, X)[0], rtol=1e-15, atol=0)


def test_certified_constant_matches_the_closed_form_in_numpy(contraction):
    """Lip_F <= ||W^T W_V|| ||W|| / sqrt(d_k) (sqrt((n+1)/2) + 2 l + 2 sqrt(l (n-1) W_0(1/e))),
    l = W_0((n-1)/e) (lipbound.symbolic.unbounded.l2_global_theorem), here with SVD norms."""
    head, n = contraction.head, contraction.n
    level = float(mpmath.lambertw((n - 1) / mpmath.e).real)
    w0 = float(mpmath.lambertw(1 / mpmath.e).real)
    core = np.sqrt((n + 1) / 2) + 2 * level + 2 * np.sqrt(level * (n - 1) * w0)
    value = np.linalg.norm(head.W_Q.T @ head.W_V, 2) * np.linalg.norm(head.W_Q, 2) / np.sqrt(head.d_k) * core
    np.testing.assert_allclose(contraction.certified, value, rtol=1e-9)
    assert contraction.certified >= value * (1 - 1e-12)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), spread=st.sampled_from([0.1, 1.0, 30.0, 1000.0]))
def test_secant_ratios_never_exceed_the_global_constant(contraction, inputs, seed, spread):
    """The constant is global: pairs anywhere in R^{n x d}, near the data or far from it."""
    rng = np.random.default_rng(seed)
    X = inputs + spread * rng.standard_normal(inputs.shape)
    Z = X + rng.choice([1e-3, 1.0, spread]) * rng.standard_normal(inputs.shape)
    ratio = np.linalg.norm(contraction(X) - contraction(Z)) / np.linalg.norm(X - Z)
    assert ratio <= contraction.certified


def test_witness_lies_below_the_certified_constant(contraction, inputs):
    witness = contraction.witness(inputs)
    assert 0 < witness <= contraction.certified


# Banach below 1 -------------------------------------------------------------------------------------
def test_inverse_iteration_recovers_the_preimage(sweep, inputs):
    report = sweep[0]
    trace = report.inverse
    assert report.certified < 1
    assert trace.status == "converged" and trace.rate_violations == 0 and trace.rate_undecided == 0
    assert trace.rates and max(trace.rates) <= report.certified
    np.testing.assert_allclose(trace.last, inputs, rtol=0, atol=1e-11 * np.linalg.norm(inputs))
    errors = np.array(trace.errors)
    checked = errors[:-1] > 1e-9 * np.linalg.norm(inputs)
    assert np.all(errors[1:][checked] <= report.certified * errors[:-1][checked] * (1 + 1e-6))


def test_forward_iteration_reaches_the_unique_fixed_point(sweep, contraction, inputs):
    trace = sweep[0].forward
    assert trace.status == "converged" and trace.rate_violations == 0
    assert max(trace.rates) <= sweep[0].certified
    fixed = trace.last
    np.testing.assert_allclose(contraction(fixed), fixed, rtol=0, atol=1e-10 * np.linalg.norm(fixed))
    # the fixed point is unique: another start ends at the same point
    other = iterate(contraction, np.random.default_rng(3).standard_normal(inputs.shape) * 10.0)
    assert other.status == "converged"
    np.testing.assert_allclose(other.last, fixed, rtol=0, atol=1e-9 * np.linalg.norm(fixed))


def test_inverse_from_another_start(contraction, inputs):
    Y = inputs + contraction(inputs)
    trace = invert(contraction, Y, X0=np.zeros_like(inputs), solution=inputs)
    assert trace.status == "converged" and trace.rate_violations == 0
    np.testing.assert_allclose(trace.last, inputs, rtol=0, atol=1e-10 * np.linalg.norm(inputs))


# Above 1 -------------------------------------------------------------------------------------------------
def test_above_one_the_iterations_stop_contracting(sweep):
    """Certified 16: the witness proves Lip > 1 (no contraction), yet the iteration converges (the
    spectral radius at the preimage is below 1).  Certified 64: both iterations diverge with
    measured rates above 1.  The rates never exceed the certified constant."""
    middle, large = sweep[1], sweep[2]
    assert middle.witness > 1 and middle.inverse.status == "converged"
    assert large.witness > 1
    for trace in (large.inverse, large.forward):
        assert trace.status == "diverged"
        assert trace.mean_rate > 1 and trace.rates[-1] > 1
    for report in sweep:
        assert report.rate_violations == 0
        assert all(r <= report.certified for trace in (report.inverse, report.forward) for r in trace.rates)
    table = sweep_table(sweep)
    assert "diverged" in table and "converged" in table


def test_report_json_and_plot(sweep, tmp_path):
    payload = sweep[0].to_json()
    assert payload["contraction_certified"] is True and payload["rate_violations"] == 0
    assert payload["inverse"]["status"] == "converged" and payload["inverse"]["max_rate"] <= payload["certified"]
    json.dumps(payload)  # serialisable
    path = sweep[2].plot(tmp_path / "depth.png")
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


# Errors and command line -------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, argument", [
    ({"layer": -1}, "layer"), ({"layer": 6}, "layer"), ({"head": -1}, "head"), ({"head": 12}, "head"),
    ({"n": 0}, "n"), ({"certified": -1.0}, "certified"), ({"certified": float("inf")}, "certified"),
])
def test_block_arguments_are_checked(model, kwargs, argument):
    with pytest.raises(AssumptionError) as info:
        tied_l2_block(model, **kwargs)
    assert info.value.argument == argument and "Fix:" in str(info.value)


def test_iteration_arguments_are_checked(contraction, inputs):
    with pytest.raises(AssumptionError) as info:
        invert(contraction, inputs[:5])
    assert info.value.argument == "Y"
    with pytest.raises(AssumptionError) as info:
        iterate(contraction, inputs, steps=1)
    assert info.value.argument == "steps"
    with pytest.raises(AssumptionError) as info:
        depth_experiment(0.5, sentence="", model=load_text_model())
    assert info.value.argument == "sentence"
    with pytest.raises(AssumptionError) as info:
        depth_experiment(0.5, model=load_text_model(), layer=6)
    assert info.value.argument == "layer"


def test_last_layer_and_head_are_valid(model):
    """Counted from 0: layer 5 and head 11 are the last of all-MiniLM-L6-v2."""
    block = tied_l2_block(model, layer=5, head=11, n=8, certified=0.5)
    np.testing.assert_allclose(block.certified, 0.5, rtol=1e-9)
    np.testing.assert_array_equal(block.head.W_Q, model.heads(5)[11].W_Q)


def test_cli(tmp_path, capsys):
    json_path, plot_path = tmp_path / "depth.json", tmp_path / "depth.png"
    assert main(["depth", "--scale", "0.5", "--steps", "40", "--json", str(json_path),
                 "--plot", str(plot_path)]) == 0
    output = capsys.readouterr().out.strip().splitlines()
    assert output[-1] == "violations: 0"
    assert any(line.startswith("inverse: converged") for line in output)
    payload = json.loads(json_path.read_text())
    np.testing.assert_allclose(payload["certified"], 0.5, rtol=1e-9)
    assert plot_path.exists()
    with pytest.raises(SystemExit) as info:
        main(["depth", "--scale", "-2"])
    assert info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("lipbound: error: argument --scale: expected positive numbers") and "Fix:" in error
    with pytest.raises(SystemExit) as info:
        main(["depth", "--layer", "-1"])
    assert info.value.code == 2 and "argument --layer" in capsys.readouterr().err
    assert main(["depth", "--head", "12"]) == 2
    assert capsys.readouterr().err.strip().startswith("lipbound: error: --head: expected a head between 0 and 11")
