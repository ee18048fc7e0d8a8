"""The local Lipschitz constant ``L(eps)`` of a chain around a real input, certified and witnessed.

For a chain ``F = g_m o ... o g_1`` (:mod:`lipbound.local.chains`), an input X and a neighbourhood
``U(X, eps)`` (:class:`~lipbound.local.balls.Neighbourhood`), the certified value is

    L(eps) <= min( ||DF(X)||  +  || sum_k (M_m ... M_{k+1}) V_k (N_{k-1} ... N_1) ||,   ||M_m ... M_1||,   L_global )

(theorems ``local-lipschitz`` and ``local-chain``): ``N_k``, ``M_k``, ``V_k`` are the matrices of
per-token block norms of ``Dg_k`` at the centre, their bounds on the token balls ``U_k`` (``U_1`` encloses
``U(X, eps)``, ``U_{k+1} = g_k(U_k)`` enclosed by the movement bounds), and the bounds on their
variation; ``||DF(X)||`` is the certified norm of the dense Jacobian at X (Frobenius: one Gram
product and one Cholesky, :func:`~lipbound.rigorous.linalg.spectral_norm_upper_large`; (2,1) and
(2,inf): the largest column or row sum of certified block norms); the norm of a matrix of block
norms is its spectral norm (Frobenius), its largest column sum ((2,1)) or row sum ((2,inf)).
``L_global`` is the certified constant of :mod:`lipbound.numeric.certify` (heads and attention layers) on
the ball about the LayerNorm bias that holds every token of ``U(X, eps)`` (not on the LayerNorm image,
which U leaves).  For a single head or attention layer in the Frobenius norm, the
variation term is also bounded through the second derivative, integrated over the radii up to eps
(:mod:`lipbound.local.curvature`, theorem ``local-attention-curvature``), and the smaller bound
counts.  For a block (Frobenius) the variation also splits at the attention's output
(:mod:`lipbound.local.tail`), and a stack composes its blocks' own curves
(:class:`~lipbound.local.stack.StackOfBlocks`).  A single attention layer on a Frobenius or (2,1) ball also has
its Jacobian bounded over the whole of U (:mod:`lipbound.local.jacobian_forms`): one more variation bound, and
``sup_U ||DF(Y)||`` itself as a fourth candidate beside the three above; each point names the route of its
certified value (``CurvePoint.route``).  As eps -> 0 the value tends to ``||DF(X)||``; for large eps it meets the
global constant.

The witness is a point Y of ``U(X, eps)`` itself (not of its enclosure) and the Jacobian norm there, found by
projected ascent (:mod:`lipbound.local.witness_search`) and, on request, re-checked in high precision
(:mod:`lipbound.local.witness_check`); the neighbourhoods are nested, so the best point of a smaller
eps counts for the larger ones.  The same ascent on
``||DF(Y) - DF(X)||`` witnesses the variation term: ``variation_witness <= sup_U ||DF(Y) - DF(X)|| <=
variation``, so each point shows how much of its gap is the variation bound and how much the
triangle inequality ``||DF(Y)|| <= ||DF(X)|| + ||DF(Y) - DF(X)||`` itself.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import final

import numpy as np

from ..errors import AssumptionError, NotCertifiedError
from ..numeric.blas import one_blas_thread
from ..numeric.blocks.norms import norm_constant
from ..numeric.certify import head_constant, layer_constant
from ..numeric.domains import LayerNormOutputs, TokenBall
from ..numeric.model import Model
from ..rigorous.arrays import IntervalArray
from ..rigorous.intervals import Verdict, certify_le, interval, upper, upper_product
from ..rigorous.linalg import Enclosure, spectral_norm_upper, spectral_norm_upper_large
from . import grouped
from .balls import LIPSCHITZ_NORMS, Neighbourhood, TokenBalls
from .bounds import feedforward_global
from .centre import ChainCentre, frobenius_factor, reach
from .chains import (
    Component,
    chain_for,
    product_upper,
    right_product,
    telescoped_variation,
)
from .curvature import CURVATURE_TOKENS, AttentionCurvature
from .curvature_integral import CurvatureIntegral, decade_grid
from .front import FrontSplit
from .pair_starts import pair_starts
from .relational import RELATIONAL_WORTH, RelationalRoute, covers, relational_grid
from .relational_tail import BlockForms
from .stack import StackOfBlocks
from .tail import BlockTail, TokenTail, column_block_norms, token_reach, weighted_tail_reach
from .witness_check import recheckable, witness_enclosure
from .witness_search import ascent, larger, witness_value

__all__ = ["CurvePoint", "LipschitzCurve", "lipschitz_curve", "DENSE_LIMIT", "CHAIN_DENSE_LIMIT", "FLOAT_ALLOWANCE"]

#: Largest ``n d`` for which the Frobenius norm of the dense Jacobian is certified directly (n <= 42 at
#: MiniLM's width: about 10 GB and 2 minutes at the limit); above it, the norms of the Jacobian's blocks
#: between groups of tokens bound it (:mod:`lipbound.local.grouped`).
DENSE_LIMIT = 16384
#: The same for chains of several components, whose dense Jacobians are multiplied (three products of
#: ``(n d)^3`` each per component: n <= 16 at MiniLM's width).
CHAIN_DENSE_LIMIT = 6144
#: Relative widening, both ways, of a float witness before it is compared with a certified value: the
#: witness is a Jacobian norm computed in float64 (sums of at most a few thousand terms, relative
#: error far below 1e-12); the certified Jacobian norm at X is asked to sit 1e-8 above the estimate.
FLOAT_ALLOWANCE = 1e-9
#: the heads-joint supremum (lemma jacobian-heads-joint, about 0.7 CPU s per radius at n = 9 on MiniLM) is formed
#: where the heads' summed supremum is within this factor of the best route: on MiniLM's layer 0 the joint form
#: was 2.8 times below that sum at 1e-1 R and 1.6 times at 1e-2 R, where the curvature route is 8 times below it
JOINT_REACH = 4.0


def _json_safe(value):
    """JSON has no infinity: null where no bound applies (a list entry by entry)."""
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


@final
@dataclass(frozen=True)
class CurvePoint:
    """One eps: the certified bound, the witness, and what the bound is made of."""

    eps: float
    certified: float
    witness: float
    local: float
    variation: float
    variation_witness: float
    global_constant: float
    verdict: str
    #: CPU seconds (``time.process_time``) of this radius's own work: its bounds, variation routes and
    #: witnesses, and the same radius of the curves nested in it (a block's attention, a stack's blocks)
    cpu_seconds: float = 0.0
    #: which bound gave ``certified``: "||DF(X)|| + variation (<the variation's route>)", "product of block
    #: bounds", "global", "jacobian-supremum" (theorem local-attention-jacobian) or "jacobian-heads-joint" (lemma
    #: jacobian-heads-joint)
    route: str = ""
    #: a certified bound on ``sup_U ||F(Y) - F(X)||_F``: ``certified theta_U eps``; for a block's attention curve
    #: also ``||DF(X)|| theta_U eps`` plus Taylor's remainder through the curvature bound (lemma
    #: attention-reach-remainder), whose token balls the block takes after it; for a block also its tail's
    #: (lemma block-reach)
    reach: float = math.inf
    #: for a block's attention curve, Taylor's remainder alone, ``sup_U ||F(Y) - F(X) - DF(X)(Y - X)||_F`` (lemma
    #: attention-reach-remainder; inf where not formed): with the Jacobian's column blocks it bounds each token's
    #: own movement (lemma attention-token-reach)
    remainder: float = math.inf
    #: for a block's attention curve, per output token i a bound on ``sup_U ||(F(Y) - F(X) - DF(X)(Y - X))_i||``
    #: (lemma curvature-per-query: each token's own curvature bounds in the remainder's sum; empty where not formed)
    token_remainders: tuple = ()
    #: with ``recheck``: ``(lower, upper)`` enclosing the witness's value at its exact point, which lies in U exactly
    #: (module :mod:`~lipbound.local.witness_check`); the lower end is a certified lower bound on ``L(eps)``, and
    #: the verdict compares the enclosure with the certified value.  Empty where not re-checked.
    witness_rechecked: tuple = ()

    @property
    def ratio(self) -> float:
        return self.certified / self.witness if self.witness > 0 else math.inf

    def to_json(self) -> dict:
        out = {"eps": self.eps, "certified": self.certified, "witness": self.witness, "ratio": self.ratio,
               "local": self.local, "variation": self.variation, "variation_witness": self.variation_witness,
               "global": self.global_constant,
               "verdict": self.verdict, "cpu_seconds": self.cpu_seconds, "route": self.route, "reach": self.reach,
               "remainder": self.remainder, "token_remainders": list(self.token_remainders),
               "witness_rechecked": list(self.witness_rechecked) or None}
        return {key: _json_safe(value) for key, value in out.items()}


@final
@dataclass(frozen=True)
class LipschitzCurve:
    """``L(eps)`` of a chain around one input (see :func:`lipschitz_curve`)."""

    kind: str
    description: str
    norm: str
    ball: str
    positions: tuple
    n: int
    radius: float
    jacobian_norm: float
    jacobian_witness: float
    points: tuple = field(default=())
    #: how the variation term is bounded: "blockwise", or also through the second derivative by its Gram
    #: matrix ("curvature-gram") or by the split bound ("curvature-split"); the smaller bound counts
    variation_bound: str = "blockwise"
    #: how ``jacobian_norm`` is bounded: from the "dense" Jacobian, from the blocks between groups of tokens
    #: ("grouped", inputs too long for the dense one), from products of per-token block norms ("blockwise"), or
    #: (a stack) from its blocks' dense Jacobians multiplied with a normwise radius ("block-products")
    jacobian_bound: str = "dense"
    #: CPU seconds of the work every radius shares (the centre's enclosures, ``||DF(X)||``, the curvature
    #: bound's matrices at X, the set-up of nested curves): the curve's total is this plus the points'
    setup_cpu_seconds: float = 0.0
    #: whether the first attention layer's facts on U also came from its relational enclosure (relational.py)
    relational: bool = False
    #: a stack's per-block breakdown, one dict per block: "layer", its certified "jacobian_norm" at its float
    #: centre, and per point (in the order of ``points``) its "certified" constant and "variation" on U_l and the
    #: "radius" of U_l (the user's eps for the first block, a Frobenius radius about its centre after it)
    blocks: tuple = ()

    def to_json(self) -> dict:
        blocks = [{key: _json_safe(value) for key, value in block.items()} for block in self.blocks]
        return {"kind": self.kind, "component": self.description, "norm": self.norm, "ball": self.ball,
                "positions": list(self.positions), "n": self.n, "layernorm_radius": self.radius,
                "jacobian_norm": self.jacobian_norm, "jacobian_witness": self.jacobian_witness,
                "jacobian_bound": self.jacobian_bound, "variation_bound": self.variation_bound,
                "setup_cpu_seconds": self.setup_cpu_seconds, "relational": self.relational,
                "points": [p.to_json() for p in self.points], "blocks": blocks}


@final
class _Smallest:
    """The smallest of certified values offered one by one, and the name of the route that gave it (the first on
    ties)."""

    def __init__(self, name: str, value: float):
        self.name, self.value = name, value

    def offer(self, name: str, value: float) -> None:
        if value < self.value:
            self.name, self.value = name, value


def _check_norm(norm: str) -> str:
    if norm not in LIPSCHITZ_NORMS:
        raise AssumptionError("norm", f"one of {', '.join(LIPSCHITZ_NORMS)}", repr(norm), "e.g. `norm` fro")
    return norm


def _matrix_norm(T: np.ndarray, norm: str) -> float:
    """The norm of a non-negative matrix of block norms that bounds the operator norm (module docstring)."""
    T = np.asarray(T, dtype=np.float64)
    if not np.any(T):
        return 0.0
    if norm == "fro":
        return spectral_norm_upper(T)
    sums = IntervalArray(T).sum(axis=0 if norm == "2,1" else 1).hi
    return float(np.max(sums))


def _block_norms(J: Enclosure, n_in: int, n_out: int, d_in: int, d_out: int) -> np.ndarray:
    """Certified ``||B_ij||_2`` from a dense row-convention Jacobian: (n_out, n_in)."""
    enclosure = J
    out = np.zeros((n_out, n_in))
    for j in range(n_in):
        for i in range(n_out):
            block = Enclosure(enclosure.mid[j * d_in:(j + 1) * d_in, i * d_out:(i + 1) * d_out],
                              enclosure.rad[j * d_in:(j + 1) * d_in, i * d_out:(i + 1) * d_out])
            out[i, j] = block.norm_upper()
    return out


class _GlobalConstant:
    """The certified global constant of the chain on a set that holds every point of ``U(X, eps)``, per eps: for
    a head or an attention layer its constant there, for whole layers and stacks the product of their
    components' constants; inf for eps = 0 (U is X alone) and where a factor is not certified.  Only the first
    attention's factor depends on eps; the others are certified once, when first asked for.

    The LayerNorm image does not hold U: its points leave the image's hyperplane ``sum_k (y_k - beta_k) /
    gamma_k = 0`` at once.  Every token of U moves by at most eps in each of its norms, so every token lies
    in the ball about the LayerNorm bias beta (the origin without a LayerNorm) of radius
    ``max_i ||x_i - beta|| + eps``, on which the first attention's constant is taken; a later attention
    takes its constant on the image of the LayerNorm before it (its inputs are that LayerNorm's outputs),
    and the LayerNorms and feed-forward blocks, token by token, theirs on all of R^d.  A pre-norm or sandwich
    layer (a decoder) gets inf here: its global constants are those of ``verify --whole``, whose rotary
    heads and RMSNorm images are not composed into these neighbourhoods."""

    def __init__(self, model: Model, chain: list[Component], layer: int, norm: str, X: np.ndarray):
        self.chain, self.norm, self.n = chain, norm, X.shape[0]
        self.post = model.layer(layer).placement == "post"
        feeding = model.layer(layer).ln_in
        self.center = np.zeros(X.shape[1]) if feeding is None else feeding.center
        self.farthest = float(np.max((IntervalArray(X) - IntervalArray(self.center)).norm_upper())) if self.post \
            else math.nan
        self._fixed = None

    def _factor(self, k: int, domain) -> float:
        """Component k's certified constant (on ``domain`` if it is a head or an attention), inf if not certified."""
        component, norm = self.chain[k], self.norm
        if component.kind == "feedforward":   # per token, so the same in the three norms
            return feedforward_global(component.target)
        if component.kind == "norm":
            found = norm_constant(component.target, norm_key=norm)
        elif component.kind == "head":
            found = head_constant(component.target, norm, domain, self.n)
        else:
            found = layer_constant(component.target, norm, domain, self.n, residual=True)
        return found.value if found.certified else math.inf

    def __call__(self, eps: float) -> float:
        if eps == 0 or not self.post:
            return math.inf
        if self._fixed is None:   # every factor but the first attention's: none depends on eps
            self._fixed = [self._factor(k, None if self.chain[k].kind in ("feedforward", "norm")
                                        else LayerNormOutputs(self.chain[k - 1].target))
                           for k in range(1, len(self.chain))]
        first = self._factor(0, TokenBall((IntervalArray(self.farthest) + IntervalArray(eps)).hi.item(), self.center))
        factors = [first] + self._fixed
        if not all(math.isfinite(f) for f in factors):
            return math.inf
        return upper_product(*factors)


@one_blas_thread   # many products of a few hundred rows: a second BLAS thread costs far more than it saves
def lipschitz_curve(model: Model, X: np.ndarray, *, kind: str = "layer", layer: int = 0, head: int | None = None,
                    last: int | None = None, norm: str = "fro", ball: str = "fro", positions=(), eps=(),
                    ascent_steps: int = 4, seed: int = 0, curvature_tokens: int = CURVATURE_TOKENS,
                    progress=None, recheck: bool = False) -> LipschitzCurve:
    """``L(eps)`` of a head, an attention layer, a block or a stack at the input ``X`` (n, d).

    Parameters
    ----------
    model : Model
        The model description (:mod:`lipbound.numeric.model`).
    X : ndarray, shape (n, d)
        The input of ``layer`` (a sentence's hidden states ``hidden_states(ids)[layer]``, or any array).
    kind : {"head", "layer", "block", "stack"}
    layer, head, last : int
        Layer (and head, and last layer of a stack), counted from 0.
    norm : {"fro", "2,1", "2,inf"}
        Norm of the Lipschitz constant.
    ball : {"fro", "2,1", "2,inf", "tokens"}
        The neighbourhood ``U(X, eps)``; ``"tokens"`` moves the tokens ``positions`` only.
    eps : sequence of float
        Radii of the neighbourhoods (non-negative).
    ascent_steps : int
        Projected ascent steps of the witness per eps.
    curvature_tokens : int
        Largest n for which the curvature bound is formed from its Gram matrix (its cost grows as n^6;
        about 9 s per radius at 20 tokens of MiniLM); longer inputs get the split bound while it fits
        (:meth:`~lipbound.local.curvature.AttentionCurvature.route`).
    progress : callable, optional
        Called with ``(done, total, what)`` after each eps (``what`` "radii") and, for inputs too long for
        the dense Jacobian, after each block of ``DF(X)`` (``"blocks of DF(X)"``).
    recheck : bool
        Re-check each radius's witness in high precision (:mod:`~lipbound.local.witness_check`: its point in U
        decided exactly, its value enclosed; about 2 CPU s per radius for MiniLM's attention layer at n = 9);
        the Frobenius norm, and the maps :func:`~lipbound.local.witness_check.recheckable` names.
    """
    chain = chain_for(model, kind, layer, head, last)
    missing = recheckable(chain, _check_norm(norm)) if recheck else ""
    if missing:
        raise AssumptionError("recheck", "maps the high-precision re-check covers, in the Frobenius norm", missing,
                              "drop `recheck`")
    return _curve(model, X, kind, layer, head, last, norm, ball, positions, eps, ascent_steps, seed, curvature_tokens,
                  progress, chain=chain, recheck=recheck)


def _curve(model, X, kind, layer, head, last, norm, ball, positions, eps, ascent_steps, seed, curvature_tokens,
           progress, attention=None, chain=None, centre=None, want_reach=False, recheck=False) -> LipschitzCurve:
    """:func:`lipschitz_curve`; ``attention`` is the first layer's attention curve on the same neighbourhoods
    when the caller has it (a stack hands its own to its first block); ``chain`` and ``centre`` the chain and
    its :class:`ChainCentre` at X when the caller has them (a block hands its attention's to its attention curve);
    ``want_reach``: the points' ``reach`` also through Taylor's remainder (a block's attention curve: the
    remainder costs the curvature bounds an early-stopped variation integral did not form)."""
    began = time.process_time()
    norm = _check_norm(norm)
    X = np.asarray(X, dtype=np.float64)
    chain = chain_for(model, kind, layer, head, last) if chain is None else chain
    n, d = X.shape
    neighbourhoods = [Neighbourhood(ball, e, tuple(positions)) for e in eps]
    if not neighbourhoods:
        raise AssumptionError("eps", "at least one radius", "none", "e.g. `eps` 1e-3, 1e-2, 1e-1")
    moving = neighbourhoods[0].moving(n)
    dense = n * d <= (DENSE_LIMIT if len(chain) == 1 else CHAIN_DENSE_LIMIT)
    # a block or a stack hands its first component's centre to its attention curve, a stack its blocks'
    blocks = 1 if kind != "stack" else (layer if last is None else last) - layer + 1
    keep = (1, len(chain) // blocks) if len(chain) > 1 else ()
    composed = blocks > 1 and norm == "fro"   # a stack composes its blocks' curves and their Jacobians at X
    centre = ChainCentre(chain, X, dense, keep, whole=not composed) if centre is None else centre
    witness_at_x, direction = witness_value(chain, X, moving, norm, seed)
    N_blocks = [_at_center(*parts) for parts in zip(chain, centre.points, centre.rounding, centre.enclosed)]
    radius = model.layer(layer).ln_in.radius_about_center if model.layer(layer).ln_in is not None else math.nan
    # (a block's attention curve also bounds each output token's remainder: per_query = want_reach)
    curvature = _CurvatureRoute.of(chain, centre, X, neighbourhoods, curvature_tokens, want_reach) \
        if norm == "fro" else None
    # an attention layer first on a Frobenius ball: the layer pushed through U as one affine form (relational.py)
    relational = RelationalRoute.of(chain, X, centre.enclosed[0], neighbourhoods) if norm == "fro" else None
    # a pre-norm sub-layer or head: the variation also splits at the attention's input (local-attention-front)
    front = FrontSplit.of(chain, centre.enclosed, curvature_tokens) if norm == "fro" else None
    # a block or stack starts with an attention layer: on U its outputs lie in a Frobenius ball of radius
    # Lip_U(attention) ||Y - X||_F, which caps every token's movement (the token balls alone add up
    # every token's worst case; only its certified values are used, so it searches no witness inside U)
    first = attention
    if first is None and kind in ("block", "stack") and any(hood.eps > 0 for hood in neighbourhoods):
        inner = None if progress is None else \
            lambda done, total, what: progress(done, total, f"{what} (attention alone)")
        first = _curve(model, X, "layer", layer, None, None, "fro", ball, positions, eps, 0, seed, curvature_tokens,
                       inner, chain=chain[:1], centre=centre.part(chain, 0, 1, n * d <= DENSE_LIMIT), want_reach=True)
    # a block: its variation also splits at the attention's output (theorem local-attention-tail)
    tail = None
    if first is not None and norm == "fro" and kind == "block":
        tail = BlockTail(centre.enclosed) if model.layer(layer).placement == "post" else TokenTail(centre.enclosed)
    # the attention's Jacobian at X (moving tokens' rows), for theorem local-attention-tail-weighted
    attention_jacobian = None
    if tail is not None and dense:
        at_x = centre.prefix_jacobian[1] if 1 in centre.prefix_jacobian else right_product(None, chain[0],
                                                                                            centre.enclosed[0])
        attention_jacobian = at_x if np.all(moving) else at_x[np.repeat(moving, d)]   # (a copy only for some tokens)
    # its column blocks' norms bound each token's linear movement (lemma attention-token-reach)
    token_columns = None if attention_jacobian is None else column_block_norms(attention_jacobian, n)
    # a stack: its blocks' own curves, composed (theorem local-chain on the blocks)
    def block_curve(X_l, layer_l, ball_l, positions_l, eps_l, report, attention_l, **piece):
        return _curve(model, X_l, "block", layer_l, None, None, "fro", ball_l, positions_l, eps_l, 0, 0,
                      curvature_tokens, report, attention_l, **piece)

    stack = StackOfBlocks(block_curve, chain, centre, X, layer, ball, positions, [h.eps for h in neighbourhoods],
                          progress, first, blocks, moving, witness_at_x, n * d <= CHAIN_DENSE_LIMIT) \
        if composed else None
    if stack is not None and math.isfinite(stack.jacobian_norm):
        N_dense, jacobian_bound = stack.jacobian_norm, "block-products"
    else:
        N_dense, jacobian_bound = _jacobian_norm(centre, chain, N_blocks, moving, norm, witness_at_x, n, d, progress)
    if curvature is not None:   # the curve the variation adds to (weighs the Kronecker form's effect)
        curvature.integral.floor = N_dense
    # read once, for its norm: (n d)^2 midpoints and radii, 0.94 GB at n = 20 on MiniLM (a block's is also its
    # centre's last prefix; the attention's prefix stays: the tail reads it at every radius)
    centre.jacobian = None
    centre.prefix_jacobian.pop(len(chain), None)
    global_constant = _GlobalConstant(model, chain, layer, norm, X)
    # smallest eps first: U(X, eps) grows with eps, so what was found in a smaller one is a witness in it too
    order = sorted(range(len(neighbourhoods)), key=lambda i: neighbourhoods[i].eps)
    points, found, change = [None] * len(neighbourhoods), (0.0, X, direction), 0.0
    for done, index in enumerate(order):
        started = time.process_time()
        hood = neighbourhoods[index]
        balls = hood.balls(X)
        M, V, ball_radii, ball_floors = [], [], [], []
        # a post-norm block: its per-token maps carried on the attention's Taylor set (relational_tail.py)
        forms = _block_forms(chain, centre, tail, attention_jacobian, first, index, hood, n)
        try:
            for k, component in enumerate(chain):
                bounds = component.bounds(balls, centre.enclosed[k])
                if k == 0 and relational is not None:
                    bounds = relational.tighten(hood, bounds)
                M.append(bounds.blocks)
                V.append(bounds.variation)
                ball_radii.append(balls.radii)
                ball_floors.append(balls.floors)
                if k + 1 < len(chain):
                    movement = bounds.movement
                    if k == 0 and first is not None:
                        movement = np.minimum(movement, first.points[index].reach)
                        if token_columns is not None:   # each token's own reach (lemma attention-token-reach)
                            own = first.points[index]
                            rests = np.minimum(own.remainder, own.token_remainders) if own.token_remainders \
                                else own.remainder
                            movement = np.minimum(movement, token_reach(token_columns, rests,
                                                                        frobenius_factor(hood, n).hi.item(), hood.eps))
                    if component.kind == "feedforward":   # the GELU values' changes jointly (secant slopes)
                        movement = np.minimum(movement, centre.enclosed[k].movement(balls.radii))
                    radii = (IntervalArray(movement) + IntervalArray(centre.rounding[k + 1])).hi
                    floors = None   # the centred norms' floors on the set (lemma centred-floor), where one is formed
                    if forms is not None:   # (about the same float point, its rounding included)
                        formed = forms.next_radii(radii)
                        floors = forms.floors
                        # where no token's set after the attention is smaller, the later ones are not formed (a
                        # choice of work: at 1e-2 R of MiniLM's block 0 the chained feed-forward balls are smaller)
                        forms = forms if k == 0 or np.any(formed < radii) else None
                        radii = np.minimum(radii, formed)
                    balls = TokenBalls(centre.points[k + 1], radii, floors=floors)
        except NotCertifiedError:   # the balls grew past the float range: the blockwise routes give no bound
            M = None
        columns = np.flatnonzero(moving)
        crude = math.inf if M is None else _matrix_norm(product_upper(*reversed(M))[:, columns], norm)
        if stack is not None:
            crude = min(crude, stack.product[index])
        global_value = global_constant(hood.eps)
        # a variation above this cannot lower the certified value: the integrals stop there
        useful = min(crude, global_value) - N_dense
        named = _Smallest("blockwise", math.inf if M is None else
                          _matrix_norm(telescoped_variation(M, V, N_blocks, columns), norm))
        enclosure = math.inf
        if relational is not None and len(chain) == 1 and hood.eps > 0:   # the Jacobian enclosed over U
            spread, enclosure = relational.jacobian(hood)
            named.offer("jacobian-enclosure", spread)
        tail_reach, omegas = math.inf, None
        if tail is not None and M is not None and hood.eps > 0:
            try:
                omegas = tail.omegas(M, V, N_blocks, ball_radii, centre.rounding, ball_floors)
                named.offer("attention-tail", tail.variation(first.points[index], omegas, attention_jacobian))
                tail_reach = tail.reach(first.points[index].reach, omegas)
            except NotCertifiedError:   # an enclosure overflowed (balls past the LayerNorms' centres): no bound
                pass
        joined = None   # the relational route whose curvature bounds this radius formed (for the reach)
        if curvature is not None:
            # the relational route runs where the variation so far passes RELATIONAL_WORTH ||DF(X)||; where the
            # curvature route's last term alone passes it too, the relational route runs first and the curvature
            # route then stops as soon as it cannot win (the same value, less work: at 1e-2 R on MiniLM's layer 0
            # its last term is 50 against 7.8)
            worth = RELATIONAL_WORTH * N_dense
            first_relational = relational is not None and named.value > worth and curvature.lower(hood) > worth
            if not first_relational:
                named.offer("curvature", curvature.variation(hood, named.value))
            if relational is not None and named.value > worth:
                named.offer("relational-curvature", relational.variation(curvature, hood, min(named.value, useful)))
                joined = relational
            if first_relational:
                named.offer("curvature", curvature.variation(hood, named.value))
        if front is not None and M is not None and hood.eps > 0:
            theta = (frobenius_factor(hood, n) * IntervalArray(hood.eps)).hi.item()
            named.offer("attention-front", front.variation(*bounds.facts["branch"], bounds.facts["radii"], theta))
        if stack is not None:
            named.offer("stack-blocks", stack.variation[index])
        variation = named.value
        local = upper(interval(N_dense) + interval(variation))
        routes = _Smallest(f"||DF(X)|| + variation ({named.name})", local)
        routes.offer("product of block bounds", crude)
        routes.offer("global", global_value)
        routes.offer("jacobian-supremum", enclosure)
        # the heads joined (lemma jacobian-heads-joint): at most a few times below the heads' sum, so tried only
        # where that sum is within JOINT_REACH of the best route (this decides work, never a value)
        if math.isfinite(enclosure) and enclosure <= JOINT_REACH * routes.value:
            routes.offer("jacobian-heads-joint", relational.joint_supremum(hood))
        certified = routes.value
        rest, rests = _taylor_remainder(curvature, joined, hood) if want_reach else (math.inf, ())
        moved = min(reach(certified, hood, n), tail_reach, _taylor_reach(rest, hood, N_dense, n))
        if forms is not None:   # the output set's radius
            moved = min(moved, forms.reach(moved))
        if omegas is not None and token_columns is not None:   # the tokens' weights on their own columns
            moved = min(moved, _weighted_reach(tail, omegas, attention_jacobian, token_columns, first.points[index],
                                               hood, moved))
        # a single attention layer on a large ball: queries split between two keys are the climb's further starts
        starts = pair_starts(chain[0].target, X, hood.eps) \
            if relational is not None and len(chain) == 1 and hood.eps > 0 and ascent_steps > 0 else ()
        found = larger(found, ascent(chain, X, hood, moving, norm, witness_at_x, direction, ascent_steps, seed,
                                       starts=starts))
        witness = found[0]
        change = max(change, ascent(chain, X, hood, moving, norm, 0.0, direction, ascent_steps, seed,
                                     change=True)[0])
        # the witness's own value enclosed in high precision at its exact point, or the float widened both ways
        checked = witness_enclosure(chain, X, found[1], found[2], hood) if recheck else None
        witness_range = interval(checked) if checked is not None else \
            interval(witness) * interval((1 - FLOAT_ALLOWANCE, 1 + FLOAT_ALLOWANCE))
        verdicts = {certify_le(witness_range, interval(certified)),
                    certify_le(interval(change) * interval((1 - FLOAT_ALLOWANCE, 1 + FLOAT_ALLOWANCE)),
                               interval(variation))}
        verdict = "violated" if Verdict.FAILS in verdicts else \
            "holds" if verdicts == {Verdict.HOLDS} else "not certified"
        # this radius of the nested curves ran in the set-up above: it is counted here, not there
        nested = stack.cpu_seconds[index] if stack is not None else \
            first.points[index].cpu_seconds if first is not None else 0.0
        points[index] = CurvePoint(hood.eps, certified, witness, local, variation, change, global_value, verdict,
                                   time.process_time() - started + nested, routes.name, moved, rest, tuple(rests),
                                   () if checked is None else checked)
        if progress is not None:
            progress(done + 1, len(neighbourhoods), "radii")
    description = chain[0].name if len(chain) == 1 else f"{chain[0].name} .. {chain[-1].name}"
    bound = "attention-tail" if tail is not None else "stack-blocks" if stack is not None else \
        "attention-front" if front is not None else "blockwise" if curvature is None else \
        "curvature-split" if curvature.curvature.split else "curvature-gram"
    setup = time.process_time() - began - sum(p.cpu_seconds for p in points)
    return LipschitzCurve(kind, description, norm, ball, tuple(positions), n, radius, N_dense, witness_at_x,
                          tuple(points), bound, jacobian_bound, setup, relational is not None,
                          () if stack is None else tuple(stack.blocks))


def _block_forms(chain, centre: ChainCentre, tail, jacobian: Enclosure | None, first, index: int,
                 hood: Neighbourhood, n: int) -> BlockForms | None:
    """A post-norm block's per-token maps on the attention's Taylor set (:class:`~lipbound.local.relational_tail.
    BlockForms`); None where it does not apply."""
    if not isinstance(tail, BlockTail) or jacobian is None or first is None or hood.eps <= 0:
        return None
    own = first.points[index]
    rests = np.minimum(own.remainder, own.token_remainders) if own.token_remainders else own.remainder
    radius = (frobenius_factor(hood, n) * IntervalArray(hood.eps)).hi.item()
    try:
        return BlockForms(chain, centre, jacobian, radius, rests)
    except NotCertifiedError:
        return None


def _at_center(component: Component, point: np.ndarray, rounding: np.ndarray, enclosed) -> np.ndarray:
    """The matrix of per-token block norms ``||B_ij(X)||`` of a component at the centre (``at_center`` of its
    bounds, which does not depend on the balls' radii; a feed-forward block's straight from its enclosure, whose
    bounds on balls would also bound the variation)."""
    if component.kind == "feedforward":
        return np.diag(enclosed.jacobian_norms())
    return component.bounds(TokenBalls(point, rounding), enclosed).at_center


class _CurvatureRoute:
    """``sup_U ||DF(Y) - DF(X)||_2`` of a single head or attention layer through its second derivative
    (theorem local-attention-curvature, :class:`~lipbound.local.curvature.CurvatureIntegral`): the curvature
    bound on the neighbourhoods ``U(X, t)`` of a grid of radii (:func:`~lipbound.local.curvature.decade_grid`
    of eps alone), integrated from 0 to eps as an upper Riemann sum; radii are evaluated once, lazily, and
    shared between the eps.

    The grid of an eps is its own: the value at eps does not depend on which other radii are asked
    for (a grid taken from all of them gave 4.5055, 4.5052 or 4.5026 at 1e-3 R on the same sentence,
    depending on the list)."""

    def __init__(self, chain, centre: ChainCentre, X: np.ndarray, hood: Neighbourhood, split: bool = False,
                 per_query: bool = False):
        self.X, self.hood = X, hood
        self.integral = CurvatureIntegral(chain[0], centre.enclosed[0], split=split, per_query=per_query)
        self.curvature = self.integral.curvature
        self.frobenius = frobenius_factor(hood, X.shape[0])

    @staticmethod
    def grid(eps: float) -> list[float]:
        """The radii of the Riemann sum up to ``eps``: the powers of 10^(1/6) in the decade below it, then eps."""
        return decade_grid([eps])

    @classmethod
    def of(cls, chain, centre: ChainCentre, X, neighbourhoods, tokens: int = CURVATURE_TOKENS, per_query=False):
        if len(chain) != 1 or chain[0].kind not in ("head", "attention") or not any(h.eps > 0 for h in neighbourhoods):
            return None
        route = AttentionCurvature.route(centre.enclosed[0], tokens)
        return None if route is None else cls(chain, centre, X, neighbourhoods[0], split=route == "split",
                                               per_query=per_query)

    def variation(self, hood: Neighbourhood, other: float, grid=None, known=None) -> float:
        """The integrated bound for ``U(X, hood.eps)``; inf as soon as its partial sum exceeds ``other`` (the
        blockwise bound, which then is the smaller: the rest only adds).  ``grid`` (eps -> radii, default
        :meth:`grid`) gives the radii of the sum, ``known`` (t -> keyword arguments of
        :func:`~lipbound.local.bounds.attention_bounds`: score and weight ranges) facts known to hold on each
        step's neighbourhood ``U(X, t)``."""
        if hood.eps == 0:
            return 0.0
        return self.integral.integral(self._steps(hood, grid, known, remainder=False), self.frobenius, other)

    def lower(self, hood: Neighbourhood, grid=None, known=None) -> float:
        """A lower bound on :meth:`variation` (the same arguments): its last term alone, on the widest ball (formed
        once, as every term: the variation reads it again)."""
        if hood.eps == 0:
            return 0.0
        return self.integral.integral(self._steps(hood, grid, known, remainder=False)[-1:], self.frobenius)

    def remainder(self, hood: Neighbourhood, grid=None, known=None) -> float:
        """``theta_U^2 sum_k (t_k - t_(k-1)) (eps - (t_(k-1) + t_k) / 2) chi(U(X, t_k))`` (lemma
        attention-reach-remainder):
        a bound on ``sup_U ||F(Y) - F(X) - DF(X) (Y - X)||_F``, from the same curvature bounds as
        :meth:`variation` on the same grid (cached: no new bound is formed when the variation ran first); inf where
        they leave the float range."""
        if hood.eps == 0:
            return 0.0
        try:
            # (a remainder is weighed against itself: it bounds a movement, not the curve)
            return self.integral.integral(self._steps(hood, grid, known, remainder=True),
                                          self.frobenius * self.frobenius, floor=0.0)
        except NotCertifiedError:   # the weights or the bounds left the float range (a ball far past the model's)
            return math.inf

    def token_remainders(self, hood: Neighbourhood, grid=None, known=None) -> np.ndarray:
        """Per output token i, ``theta_U^2 sum_k (t_k - t_(k-1)) (eps - (t_(k-1) + t_k) / 2) chi_i(U(X, t_k))`` (lemmas
        attention-reach-remainder and curvature-per-query): a bound on ``sup_U ||(F(Y) - F(X) - DF(X) (Y - X))_i||``
        from query i's own curvature bounds on the grid of :meth:`remainder` (n,); inf where they leave the float
        range.  Needs a route made with ``per_query``."""
        n = self.X.shape[0]
        if hood.eps == 0:
            return np.zeros(n)
        try:
            return self.integral.query_integral(self._steps(hood, grid, known, remainder=True),
                                                self.frobenius * self.frobenius)
        except NotCertifiedError:
            return np.full(n, np.inf)

    def _steps(self, hood: Neighbourhood, grid, known, remainder: bool) -> list:
        """The integral's steps ``(width, radii[, known, key])`` up to ``hood.eps``; with ``remainder`` each width
        ``t_k - t_(k-1)`` multiplied by ``eps - (t_(k-1) + t_k) / 2``: their product is ``int (eps - t) dt`` over the
        step, the weight of ``(eps - t)`` in Taylor's remainder)."""
        steps, previous = [], 0.0
        shared = self.hood.ball in ("fro", "2,1")   # U(X, t) lies in the Frobenius ball of radius t: tokens share it
        for t in (grid or self.grid)(hood.eps):
            width = IntervalArray(t) - IntervalArray(previous)
            if remainder:
                middle = (IntervalArray(previous) + IntervalArray(t)) * IntervalArray(0.5)
                width = width * (IntervalArray(hood.eps) - middle)
            step = (width.hi.item(), Neighbourhood(self.hood.ball, t, self.hood.positions).balls(self.X).radii)
            facts = ({} if known is None else known(t)) | ({"frobenius": t} if shared else {})
            steps.append(step + (facts, ("known" if known else "frobenius", t)) if facts else step)
            previous = t
        return steps


def _taylor_remainder(curvature: _CurvatureRoute | None, relational: RelationalRoute | None,
                      hood: Neighbourhood) -> tuple:
    """The smaller of the curvature route's Taylor remainders (on its own grid, and on the relational grid with the
    relational score and weight ranges where that route is given and covers U); inf without a curvature route, 0 at
    eps = 0 (lemma attention-reach-remainder).  With it, per output token, the same smaller of the tokens' own
    remainders where the route was made ``per_query`` (lemma curvature-per-query), else an empty tuple."""
    if curvature is None or hood.eps == 0:
        return (0.0 if hood.eps == 0 else math.inf), ()
    per_query = curvature.integral.per_query
    rest = curvature.remainder(hood)
    rests = curvature.token_remainders(hood) if per_query else ()
    if relational is not None and covers(relational.component.target, hood):
        try:
            rest = min(rest, curvature.remainder(hood, grid=relational_grid, known=relational.known))
            if per_query:
                rests = np.minimum(rests, curvature.token_remainders(hood, grid=relational_grid,
                                                                     known=relational.known))
        except NotCertifiedError:   # (the relational ranges themselves overflowed)
            pass
    return rest, rests


def _weighted_reach(tail, omegas: np.ndarray, jacobian: Enclosure, columns: np.ndarray, attention: CurvePoint,
                    hood: Neighbourhood, other: float) -> float:
    """A block's reach by lemma block-reach-weighted (:func:`~lipbound.local.tail.weighted_tail_reach`), or inf where
    its linear term alone, estimated from below by ``max_i w_i c_i theta_U eps`` (``||DA(X) D_w||`` is at least each
    token's weighted column block; the certified ``c_i`` are within rounding of those norms), already reaches
    ``other``: the spectral norm of the scaled Jacobian is then not formed (a choice of work, not a verdict)."""
    theta = frobenius_factor(hood, columns.shape[0]).hi.item()
    estimate = float(np.max((np.asarray(tail.taus) + omegas) * columns)) * theta * hood.eps
    if not estimate < other:
        return math.inf
    try:
        return weighted_tail_reach(tail.taus, omegas, jacobian, theta, hood.eps, attention.remainder,
                                   attention.token_remainders)
    except NotCertifiedError:   # (weights or remainders past the float range: no bound from it)
        return math.inf


def _taylor_reach(rest: float, hood: Neighbourhood, jacobian_norm: float, n: int) -> float:
    """``||DF(X)|| theta_U eps`` plus Taylor's remainder ``rest`` (lemma attention-reach-remainder)."""
    if not math.isfinite(rest):
        return math.inf
    linear = upper_product(jacobian_norm, frobenius_factor(hood, n).hi.item(), hood.eps)
    return upper(interval(linear) + interval(rest))


# the Jacobian at X ------------------------------------------------------------------------------
def _jacobian_norm(centre: ChainCentre, chain, N_blocks: list, moving, norm: str, estimate: float, n: int, d: int,
                   progress=None) -> tuple:
    """Certified ``||DF(X)||`` restricted to the moving tokens' inputs, and how it was bounded: "dense",
    "grouped" (:mod:`lipbound.local.grouped`) or "blockwise" (products of the per-token block norms
    ``N_blocks`` at the centre)."""
    if centre.jacobian is None:
        blocks = product_upper(*reversed(N_blocks))
        bound, route = _matrix_norm(blocks[:, moving], norm), "blockwise"
        if grouped.covers(chain):
            size = max(1, grouped.GROUP_WIDTH // d) if norm == "fro" else 1
            report = None if progress is None else lambda done, total: progress(done, total, "blocks of DF(X)")
            by_groups = _matrix_norm(grouped.group_block_norms(chain, centre.enclosed, moving, size, report), norm)
            if by_groups < bound:
                bound, route = by_groups, "grouped"
        return bound, route
    J = centre.jacobian
    d_out = J.shape[1] // n
    if not np.all(moving):  # (a copy: only when some tokens stay)
        rows = np.concatenate([np.arange(j * d, (j + 1) * d) for j in np.flatnonzero(moving)])
        J = Enclosure(J.mid[rows], J.rad[rows])
    if norm == "fro":
        return spectral_norm_upper_large(J, estimate * (1 + 1e-8)), "dense"
    blocks = _block_norms(J, int(moving.sum()), n, d, d_out)
    sums = IntervalArray(blocks).sum(axis=0 if norm == "2,1" else 1).hi
    return float(np.max(sums)), "dense"
