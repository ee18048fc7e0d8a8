"""Weight-shared iteration of a contractive attention block: inversion, fixed points, and what fails above 1.

Vuckovic, Baratin and Tachet des Combes (2020, "A Mathematical Theory of Attention",
arXiv:2007.02876) point out two consequences of a Lipschitz constant ``L < 1`` for an attention map
``Att``, used with shared weights at every depth:

* **invertibility**: the residual map ``T(X) = X + Att(X)`` is a bijection, and the preimage of
  ``Y`` is the unique fixed point of ``X -> Y - Att(X)``, reached by the iteration
  ``X_{k+1} = Y - Att(X_k)`` at geometric rate ``L`` (Banach; as in invertible residual networks,
  Behrmann et al. 2019);
* **infinite depth**: ``X_{k+1} = Att(X_k)`` converges to the unique fixed point of ``Att`` at rate
  ``L``.

Both need the constant on a set the iterates never leave.  Dot-product attention is not Lipschitz
on all of ``R^{n x d}`` (Kim et al. 2021, Thm 3.1), so a constant below 1 on a ball would need a
proof that the ball is invariant (or a LayerNorm after each step, which is not a contraction).  We
restrict to tied L2 attention with Kim et al.'s values, which is globally Lipschitz
(:func:`lipbound.symbolic.unbounded.l2_global_theorem`): its certified constant holds wherever the
iterates go.

The block is built from real weights (a head of all-MiniLM-L6-v2): the tied projection is that
head's query matrix ``W = W_Q^h`` (d, d_k); the value map is the head's value-output product
``W_V^h W_O^h`` (d, d), read through ``A = W W^T / sqrt(d_k)`` as the L2 theorem requires, so

    Att(X)_i = sum_j p_ij (x_j A W_V^h W_O^h t + b_V^h W_O^h),
    p_ij = softmax_j( -||(x_i - x_j) W||^2 / sqrt(d_k) ),

with one scalar ``t`` chosen so that the certified Frobenius constant of ``Att`` on ``R^{n x d}``
(variant ``"l2-tied"``, unbounded domain, evaluated in interval arithmetic) is the requested value.

Every step ``k`` gives ``||X_{k+2} - X_{k+1}|| = ||Att(X_{k+1}) - Att(X_k)|| <= L ||X_{k+1} - X_k||``,
so each measured rate (ratio of successive differences) must be at most the certified ``L``,
whatever ``L`` is: a rate above it would refute the bound.  Above 1 the certified constant
promises nothing; a witnessed Jacobian norm above 1 (power iteration at the data) proves the map
is not a contraction, and the iteration may still converge (spectral radius below 1 at the fixed
point) or diverge (measured rates above 1).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import final

import numpy as np

from ..errors import AssumptionError
from ..numeric import attention
from ..numeric.domains import AllTokens
from ..numeric.evaluate import evaluate_bound
from ..numeric.kernels import L2Distance
from ..numeric.model import Head
from ..printing.plaintext import legend_lines
from ..rigorous.intervals import Verdict, certify_le, interval
from ..symbolic.assumptions import Assumptions, Unbounded
from ..symbolic.registry import variant
from .bert import load_text_model

__all__ = ["DEFAULT_SENTENCE", "DEFAULT_SCALES", "TiedL2Block", "IterationTrace", "DepthReport",
           "tied_l2_block", "invert", "iterate", "depth_experiment", "scale_sweep", "sweep_table"]

DEFAULT_SENTENCE = "The cat slept all afternoon."
#: certified constants of the sweep: two contractions, then 8 (a witness near 1), 16 (not a
#: contraction, yet the iteration converges), 64 (divergence) for the default block
DEFAULT_SCALES = (0.5, 2.0, 8.0, 16.0, 64.0)

#: A difference of two float64 forward passes is exact to within this fraction of ||Y||_F (each
#: entry rounds at about (d + n) u ~ 1e-13 relative); rates are checked where it is negligible.
_ROUNDING = 1e-12
_CHECK_FLOOR = 1e-9  # rates are checked while the difference exceeds this fraction of ||Y||_F
_CONVERGED = 1e-12   # stop: the difference is at the rounding level
_DIVERGED = 1e8      # stop: the difference exceeds this multiple of ||Y||_F


def _global_bound():
    return variant("l2-tied").derive(Assumptions(domain=Unbounded(), norm="fro", tied=True), "l2-tied")


# The block ----------------------------------------------------------------------------------------
@final
@dataclass(frozen=True)
class TiedL2Block:
    """A tied L2 attention head with Kim values mapping ``R^{n x d}`` to itself.

    Attributes
    ----------
    head : Head
        ``kernel=L2Distance()``, ``W_Q = W_K = W`` (d, d_k), ``kim_values=True``, ``W_V`` (d, d).
    n : int
        Tokens the constant is certified for.
    certified : float
        Certified upper bound on the Frobenius Lipschitz constant of ``Att`` on ``R^{n x d}``
        (variant ``"l2-tied"``, Kim et al. 2021 setting, interval evaluation).
    factor : float
        The scalar ``t`` applied to the value weights.
    source : str
        Where the weights come from.
    """

    head: Head
    n: int
    certified: float
    factor: float
    source: str

    def __call__(self, X: np.ndarray) -> np.ndarray:
        """``Att(X)``, X of shape (n, d)."""
        return attention.self_forward(self.head, X)[0]

    def witness(self, X: np.ndarray, iterations: int = 60, seed: int = 0) -> float:
        """``||DAtt(X) E||_F`` for the top direction E found by power iteration on ``J^T J``
        (:func:`lipbound.numeric.attention.jacobian_norm`): a lower bound on the Lipschitz constant."""
        sigma, _ = attention.jacobian_norm(lambda Z, E: attention.self_jvp(self.head, Z, E),
                                           lambda Z, G: attention.self_vjp(self.head, Z, G),
                                           np.asarray(X, dtype=float)[None], iterations=iterations, seed=seed)
        return float(sigma[0])


def _certify(head: Head, n: int) -> float:
    return evaluate_bound(_global_bound(), head, AllTokens(), n).value


def _check_layer(bert, layer) -> None:
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < bert.num_layers:
        raise AssumptionError("layer", f"a layer between 0 and {bert.num_layers - 1} (counted from 0)", repr(layer),
                              "choose e.g. `layer` 0")


def tied_l2_block(model=None, *, layer: int = 0, head: int = 0, n: int = 8, certified: float = 0.5) -> TiedL2Block:
    """The tied L2 block of the module docstring, built from head ``head`` of layer ``layer``
    (both counted from 0) and rescaled so that its certified constant for n tokens is ``certified``.

    The bound is linear in ``||W^T W_V||``, so one evaluation at ``t = 1`` gives the factor; the
    rescaled block is certified again (the returned ``certified`` is that second value, equal to
    the request up to rounding).

    Raises
    ------
    AssumptionError
        Layer or head out of range, ``n < 1``, ``certified <= 0``.
    """
    bert = load_text_model(model)
    _check_layer(bert, layer)
    heads = bert.heads(layer)
    if isinstance(head, bool) or not isinstance(head, (int, np.integer)) or not 0 <= head < len(heads):
        raise AssumptionError("head", f"a head between 0 and {len(heads) - 1} (counted from 0)", repr(head),
                              "choose e.g. `head` 0")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise AssumptionError("n", "a positive int (tokens)", repr(n), "pass the sentence length")
    finite = isinstance(certified, (int, float)) and not isinstance(certified, bool) and math.isfinite(certified)
    if not (finite and certified > 0):
        raise AssumptionError("certified", "a positive finite constant", repr(certified),
                              "pass e.g. 0.5 for a contraction, 64 to see divergence")
    real = heads[head]
    W_O = bert.attention_layer(layer).output_block(head)
    values, offset = real.W_V @ W_O, real.b_V @ W_O

    def build(factor: float) -> Head:
        return Head(real.W_Q, real.W_Q, factor * values, b_V=offset, kernel=L2Distance(), kim_values=True,
                              name=f"tied L2 from layer {layer} head {head}")

    factor = float(certified) / _certify(build(1.0), int(n))
    tied = build(factor)
    return TiedL2Block(tied, int(n), _certify(tied, int(n)), factor,
                       f"all-MiniLM-L6-v2 layer {layer} head {head}: W = W_Q, values W_V W_O")


# Iterations ---------------------------------------------------------------------------------------
@final
@dataclass(frozen=True)
class IterationTrace:
    """One weight-shared iteration.

    Attributes
    ----------
    kind : str
        ``"inverse"`` (``X_{k+1} = Y - Att(X_k)``) or ``"forward"`` (``X_{k+1} = Att(X_k)``).
    differences : tuple of float
        ``d_k = ||X_{k+1} - X_k||_F``.
    rates : tuple of float
        ``d_{k+1} / d_k`` while ``d_k`` exceeds the rounding floor.
    errors : tuple of float or None
        ``||X_k - X*||_F`` against a known solution (the true preimage for the inverse).
    status : str
        ``"converged"`` (difference at the rounding level), ``"diverged"`` (difference above
        1e8 ||Y||_F, or not finite) or ``"stopped"`` (step budget spent).
    certified : float
        The certified constant the rates are checked against.
    rate_violations, rate_undecided : int
        Checked rates certainly above ``certified`` (a refuted bound), and rates rounding could
        not place.
    last : ndarray, shape (n, d)
        The final iterate (not in JSON).
    """

    kind: str
    differences: tuple
    rates: tuple
    errors: tuple | None
    status: str
    certified: float
    rate_violations: int
    rate_undecided: int
    last: np.ndarray = field(repr=False, compare=False)

    @property
    def steps(self) -> int:
        return len(self.differences)

    @property
    def max_rate(self) -> float:
        return max(self.rates) if self.rates else float("nan")

    @property
    def mean_rate(self) -> float:
        """Geometric mean of the measured rates (the observed linear convergence factor)."""
        return float(np.exp(np.mean(np.log(self.rates)))) if self.rates else float("nan")

    def to_json(self) -> dict:
        return {"kind": self.kind, "steps": self.steps, "status": self.status, "differences": list(self.differences),
                "rates": list(self.rates), "errors": None if self.errors is None else list(self.errors),
                "max_rate": self.max_rate, "mean_rate": self.mean_rate, "certified": self.certified,
                "rate_violations": self.rate_violations, "rate_undecided": self.rate_undecided}


def _run(kind: str, step, X0: np.ndarray, scale: float, certified: float, steps: int,
         solution: np.ndarray | None) -> IterationTrace:
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 2:
        raise AssumptionError("steps", "an int >= 2", repr(steps), "pass e.g. steps=100")
    X = np.array(X0, dtype=float)
    differences, rates, errors = [], [], [] if solution is not None else None
    violations = undecided = 0
    status = "stopped"
    slack = _ROUNDING * scale
    if errors is not None:
        errors.append(float(np.linalg.norm(X - solution)))
    for _ in range(int(steps)):
        with np.errstate(over="ignore", invalid="ignore"):
            X_next = step(X)
            difference = float(np.linalg.norm(X_next - X))
        X = X_next
        if errors is not None:
            errors.append(float(np.linalg.norm(X - solution)))
        if not math.isfinite(difference):
            status = "diverged"
            break
        differences.append(difference)
        if len(differences) >= 2 and differences[-2] > _CONVERGED * scale:
            previous = differences[-2]
            rates.append(difference / previous)
            if previous > _CHECK_FLOOR * scale:
                rate = interval((max(difference - slack, 0.0), difference + slack)) / \
                    interval((previous - slack, previous + slack))
                answer = certify_le(rate, certified)
                violations += answer is Verdict.FAILS
                undecided += answer is Verdict.UNKNOWN
        if difference <= _CONVERGED * scale:
            status = "converged"
            break
        if difference > _DIVERGED * scale:
            status = "diverged"
            break
    return IterationTrace(kind, tuple(differences), tuple(rates), None if errors is None else tuple(errors),
                          status, certified, violations, undecided, X)


def invert(block: TiedL2Block, Y: np.ndarray, *, steps: int = 100, X0: np.ndarray | None = None,
           solution: np.ndarray | None = None) -> IterationTrace:
    """Solve ``X + Att(X) = Y`` by ``X_{k+1} = Y - Att(X_k)`` from ``X_0 = Y`` (default).

    Parameters
    ----------
    block : TiedL2Block
    Y : ndarray, shape (n, d)
    steps : int
        Step budget.
    X0 : ndarray, optional
    solution : ndarray, optional
        A known preimage, to record ``||X_k - X*||_F``.
    """
    Y = _check_tokens("Y", Y, block)
    scale = max(1.0, float(np.linalg.norm(Y)))
    start = Y if X0 is None else _check_tokens("X0", X0, block)
    return _run("inverse", lambda X: Y - block(X), start, scale, block.certified, steps, solution)


def iterate(block: TiedL2Block, X0: np.ndarray, *, steps: int = 100) -> IterationTrace:
    """Run ``X_{k+1} = Att(X_k)`` (infinite depth with shared weights) from ``X0`` (n, d)."""
    X0 = _check_tokens("X0", X0, block)
    scale = max(1.0, float(np.linalg.norm(X0)))
    return _run("forward", block, X0, scale, block.certified, steps, None)


def _check_tokens(name: str, X, block: TiedL2Block) -> np.ndarray:
    X = np.asarray(X, dtype=float)
    if X.shape != (block.n, block.head.d) or not np.all(np.isfinite(X)):
        raise AssumptionError(name, f"finite tokens of shape ({block.n}, {block.head.d}) (the block's n and d)",
                              f"shape {X.shape}", "pass the hidden states the block was certified for")
    return X


# The experiment -----------------------------------------------------------------------------------
@final
@dataclass(frozen=True)
class DepthReport:
    """The block, the witness, and both iterations on the hidden states of one sentence.

    Attributes
    ----------
    sentence : str
    n, d : int
    requested : float
        The certified constant asked for.
    block : TiedL2Block
    witness : float
        Jacobian norm found at the data, a lower bound on the true constant.
    inverse : IterationTrace
        Inversion of ``T = id + Att`` at ``Y = T(X*)``, ``X*`` the layer input of the sentence.
    forward : IterationTrace
        ``X_{k+1} = Att(X_k)`` from ``X*``.
    """

    sentence: str
    n: int
    d: int
    requested: float
    block: TiedL2Block
    witness: float
    inverse: IterationTrace
    forward: IterationTrace

    @property
    def certified(self) -> float:
        return self.block.certified

    @property
    def rate_violations(self) -> int:
        return self.inverse.rate_violations + self.forward.rate_violations

    def to_json(self) -> dict:
        return {"sentence": self.sentence, "n": self.n, "d": self.d, "source": self.block.source,
                "requested": self.requested, "certified": self.certified, "factor": self.block.factor,
                "witness": self.witness, "contraction_certified": self.certified < 1,
                "inverse": self.inverse.to_json(), "forward": self.forward.to_json(),
                "rate_violations": self.rate_violations}

    def table(self) -> str:
        lines = [f"block: tied L2 attention, {self.block.source}, values x {self.block.factor:.6g}",
                 f"tokens: {self.sentence!r} (n = {self.n}, d = {self.d})",
                 f"certified Lip_F(Att) <= {self.certified:.6g}   (witness at the data: >= {self.witness:.6g})",
                 "Banach applies: every rate must stay below the certified constant" if self.certified < 1 else
                 "certified constant >= 1: Banach gives nothing; rates are still bounded by it",
                 f"{'k':>4s} {'inverse ||dX||':>15s} {'rate':>8s} {'||X_k - X*||':>13s} "
                 f"{'forward ||dX||':>15s} {'rate':>8s}"]
        for k in range(max(self.inverse.steps, self.forward.steps)):
            def cell(trace, width):
                if k >= trace.steps:
                    return " " * width, " " * 8
                rate = f"{trace.rates[k - 1]:8.4f}" if 1 <= k <= len(trace.rates) else " " * 8
                return f"{trace.differences[k]:{width}.4e}", rate
            inverse, inverse_rate = cell(self.inverse, 15)
            forward, forward_rate = cell(self.forward, 15)
            error = f"{self.inverse.errors[k + 1]:13.4e}" if k + 1 < len(self.inverse.errors) else " " * 13
            lines.append(f"{k:4d} {inverse} {inverse_rate} {error} {forward} {forward_rate}")
        lines += legend_lines("columns (Frobenius norms of the hidden states, in their own units):", [
            ("k", "the step"),
            ("inverse ||dX||", "||X_(k+1) - X_k|| of the inversion X_(k+1) = Y - Att(X_k) of Y = X + Att(X)"),
            ("rate", "the ratio of two successive ||dX||: at most the certified constant"),
            ("||X_k - X*||", "the distance of the inversion's X_k to the inverse X* it converges to"),
            ("forward ||dX||", "||X_(k+1) - X_k|| of the iteration X_(k+1) = Att(X_k)")])
        for trace in (self.inverse, self.forward):
            lines.append(f"{trace.kind}: {trace.status} after {trace.steps} steps; rates max {trace.max_rate:.4g}, "
                         f"geometric mean {trace.mean_rate:.4g} (certified {trace.certified:.4g})")
        if self.inverse.rate_undecided + self.forward.rate_undecided:
            lines.append(f"not certified: {self.inverse.rate_undecided + self.forward.rate_undecided}")
        lines.append(f"violations: {self.rate_violations}")
        return "\n".join(lines)

    def plot(self, path) -> str:
        """Successive differences of both iterations against the certified envelope ``d_0 L^k``
        (log scale), saved to ``path``.  Returns the path."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        figure = Figure(figsize=(8.4, 3.4), constrained_layout=True)
        FigureCanvasAgg(figure)
        for index, trace in enumerate((self.inverse, self.forward)):
            axes = figure.add_subplot(1, 2, index + 1)
            k = np.arange(trace.steps)
            axes.semilogy(k, trace.differences, "o-", markersize=3, label="measured ||X_{k+1} - X_k||")
            envelope = trace.differences[0] * np.power(self.certified, k, dtype=float)
            axes.semilogy(k, envelope, "--", label=f"certified envelope d_0 L^k, L = {self.certified:.3g}")
            axes.set_title(("inverse: X = Y - Att(X)" if trace.kind == "inverse" else "forward: X = Att(X)")
                           + f" ({trace.status})", fontsize=9)
            axes.set_xlabel("step k")
            axes.legend(fontsize=7)
        figure.savefig(os.fspath(path), dpi=110)
        return os.fspath(path)


def depth_experiment(scale: float = 0.5, *, steps: int = 100, sentence: str = DEFAULT_SENTENCE, model=None,
                     layer: int = 0, head: int = 0) -> DepthReport:
    """Build the tied L2 block with certified constant ``scale`` for the tokens of ``sentence``,
    invert ``X + Att(X)`` at the sentence's input of layer ``layer`` and iterate ``Att`` from it.

    Returns
    -------
    DepthReport
    """
    if not isinstance(sentence, str) or not sentence.strip():
        raise AssumptionError("sentence", "a non-empty sentence", repr(sentence), f"pass e.g. {DEFAULT_SENTENCE!r}")
    bert = load_text_model(model)
    _check_layer(bert, layer)
    X = bert.hidden_states(bert.encode(sentence))[layer]
    block = tied_l2_block(bert, layer=layer, head=head, n=X.shape[0], certified=scale)
    Y = X + block(X)
    return DepthReport(sentence, X.shape[0], X.shape[1], float(scale), block, block.witness(X),
                       invert(block, Y, steps=steps, solution=X), iterate(block, X, steps=steps))


def scale_sweep(scales=DEFAULT_SCALES, **options) -> tuple[DepthReport, ...]:
    """:func:`depth_experiment` for each certified constant in ``scales`` (same sentence and head)."""
    return tuple(depth_experiment(float(s), **options) for s in scales)


def sweep_table(reports) -> str:
    """One line per certified constant: witness, outcome and rates of both iterations."""
    lines = [f"{'certified L':>11s} {'witness':>8s} {'inverse':>10s} {'rate':>7s} {'forward':>10s} {'rate':>7s} "
             f"{'violations':>10s}"]
    for r in reports:
        lines.append(f"{r.certified:11.4g} {r.witness:8.4g} {r.inverse.status:>10s} {r.inverse.mean_rate:7.3f} "
                     f"{r.forward.status:>10s} {r.forward.mean_rate:7.3f} {r.rate_violations:10d}")
    return "\n".join(lines + legend_lines("columns:", [
        ("certified L", "the certified Lipschitz constant the block was scaled to"),
        ("witness", "the Jacobian norm at the data (a lower bound on L)"),
        ("inverse", "how the inversion of X + Att(X) ended; rate: its geometric mean rate"),
        ("forward", "how the iteration X -> Att(X) ended; rate: its geometric mean rate"),
        ("violations", "rates above the certified constant (each refutes it; exit status 3)")]))
