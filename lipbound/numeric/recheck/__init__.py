"""Re-check a witness independently, in high precision, with a rigorous enclosure.

The stored float64 inputs (``X``, ``E`` or ``Y``, the centre, the radius) and the float
weights are taken as exact binary numbers.  Everything linear is then computed *exactly*
in integer arithmetic (a float is ``m 2^e`` with an integer m, so ``X W + b`` is an exact
dyadic matrix, :mod:`.exact`); the nonlinear part (every kernel's score, :mod:`.scores`; the
masks' soft-caps and position biases, ``exp``, the softmax division or the sigmoid weights,
:mod:`.maps`; tokens at positions 0, 1, ...) runs in ``mpmath.iv`` interval arithmetic at
:data:`RECHECK_DPS` digits with outward rounding; products of an interval matrix with an
exact one use midpoint-radius (ball) arithmetic: an exact centre times the exact matrix,
plus a radius bounded in float64 with its rounding error inflated (Higham 2002, eq. 3.13).
The result is an interval that contains the true value

* ``||Df(X)[E]||_F / ||E||_F``  (kind "jacobian", Frobenius norms), or
* ``N(f(X) - f(Y)) / N(X - Y)`` (kind "secant"; ``N`` Frobenius or ``||.||_{2,1}``),

of the very map the witness names, together with an exact test that every token lies in its
domain: the closed ball ``||x_i - c|| <= R``, or the LayerNorm image ``beta + gamma * z`` with ``z``
orthogonal to 1 and ``||z|| <= sqrt(d)``, decided on the stored coordinates z (the token used is
the exact ``beta + gamma * z``, and a direction must be ``gamma * w`` with ``sum w = 0``: tangent to
the image).  Cross-attention witnesses carry m queries ``Q`` (and a direction ``EQ`` when the
constant is taken in them), each in its own domain.  Nothing of :mod:`lipbound.numeric.attention`
or of the search is reused: the forward pass and the JVP are written again here.

A witness is *valid* when it lies in the domain and its stated value does not exceed the
enclosure's upper end by more than :data:`ROUNDING_TOLERANCE` (relative): the float64 search
may round, but not by more.  Its certified lower bound on the Lipschitz constant is then the
enclosure's lower end.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import final

import mpmath
import numpy as np

from ...errors import AssumptionError, WeightsError
from ...rigorous.intervals import lower, precision, upper
from ..model import DEFAULT_WEIGHTS, Head, Layer, Model, load_weights
from ..witness import Witness
from .exact import Ball, Dyadic, concat, exact_sqrt
from .maps import MapCheck
from .scores import SCORE_CHECKS

__all__ = ["directional_norm", "Recheck", "recheck", "recheck_file", "RECHECK_DPS", "ROUNDING_TOLERANCE",
           "SCORE_CHECKS"]

#: Decimal digits of the interval arithmetic.
RECHECK_DPS = 50
#: How far (relative) a stated value may exceed the certified enclosure and still count as rounding.
ROUNDING_TOLERANCE = 1e-9


@final
@dataclass(frozen=True)
class Recheck:
    """The outcome of :func:`recheck`.

    Attributes
    ----------
    stated : float
        The value the witness claims.
    value : mpmath.mpf
        The high-precision value (midpoint of the enclosure).
    lower, upper : float
        The enclosure, rounded outward: the true value lies in ``[lower, upper]``.
    in_domain : bool
        Every token (of X, and of Y for a secant) satisfies ``||x_i - c|| <= R``, decided exactly.
    max_distance : float
        ``max_i ||x_i - c||`` rounded up (over X, Y and Q); on a LayerNorm image ``max_i ||z_i||``.
    valid : bool
        In the domain, and ``stated <= upper (1 + ROUNDING_TOLERANCE)``.
    relative_difference : float
        ``|stated - value| / value``.
    seconds : float
        Time the re-check took.
    target : str
        What was re-checked (model, layer, head, score).
    message : str
        One line for people.
    """

    stated: float
    value: mpmath.mpf
    lower: float
    upper: float
    in_domain: bool
    max_distance: float
    valid: bool
    relative_difference: float
    seconds: float
    target: str
    message: str
    weights: str = ""
    sha256: str = ""

    @property
    def certified_lower_bound(self) -> float | None:
        """A rigorous lower bound on the Lipschitz constant over the domain (None if the point
        is outside the domain)."""
        return self.lower if self.in_domain else None

    def as_dict(self) -> dict:
        return {"stated": self.stated, "value": mpmath.nstr(self.value, 20), "lower": self.lower,
                "upper": self.upper, "in_domain": self.in_domain, "max_distance": self.max_distance,
                "valid": self.valid, "relative_difference": self.relative_difference,
                "certified_lower_bound": self.certified_lower_bound, "seconds": self.seconds,
                "target": self.target, "message": self.message, "weights": self.weights, "sha256": self.sha256}


# ---------------------------------------------------------------------------------------------
# The domain, exactly
# ---------------------------------------------------------------------------------------------
def _domain(points: list[np.ndarray], center: np.ndarray, radius: float) -> tuple[bool, float]:
    """Exact test ``||x_i - c||^2 <= R^2`` for every token; and ``max ||x_i - c||`` rounded up."""
    c = Dyadic.of(center[None, :])
    inside, largest = True, 0.0
    for X in points:
        shifted = Dyadic.of(X) - Dyadic(np.broadcast_to(c.m, X.shape).copy(), c.e)
        squares = shifted.row_sums_of_squares()
        rows, bound = squares.beside_square(radius)
        inside &= all(row <= bound for row in rows)
        largest = max([largest] + [upper(exact_sqrt(man, squares.e)) for man in squares.m])
    return bool(inside), largest


def _image_tokens(z: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> tuple[Dyadic, bool, float]:
    """The exact tokens ``beta + gamma * z`` of a LayerNorm image, whether every row of z is orthogonal
    to 1 with ``||z||^2 <= d`` (decided exactly), and ``max ||z||`` rounded up."""
    Z = Dyadic.of(z)
    n, d = Z.shape
    tokens = Dyadic.of(np.broadcast_to(gamma, z.shape)) * Z + Dyadic.of(np.broadcast_to(beta, z.shape))
    inside = all(sum(int(v) for v in row) == 0 for row in Z.m)
    squares = Z.row_sums_of_squares()
    limit = d << max(-squares.e, 0) if squares.e <= 0 else None
    largest = 0.0
    for man in squares.m:
        inside &= (int(man) <= limit) if limit is not None else (int(man) << squares.e) <= d
        largest = max(largest, upper(exact_sqrt(man, squares.e)))
    return tokens, bool(inside), largest


def _rms_image_tokens(z: np.ndarray, gamma: np.ndarray) -> tuple[Dyadic, bool, float]:
    """The exact tokens ``gamma * z`` of an RMSNorm image, whether every row has ``||z||^2 <= d`` (decided
    exactly), and ``max ||z||`` rounded up."""
    Z = Dyadic.of(z)
    d = Z.shape[1]
    squares = Z.row_sums_of_squares()
    inside, largest = True, 0.0
    for man in squares.m:
        inside &= (int(man) <= d << -squares.e) if squares.e <= 0 else (int(man) << squares.e) <= d
        largest = max(largest, upper(exact_sqrt(man, squares.e)))
    return Dyadic.of(np.broadcast_to(gamma, z.shape)) * Z, bool(inside), largest


def _image_directions(w: np.ndarray, gamma: np.ndarray) -> tuple[Dyadic, bool]:
    """The exact directions ``gamma * w`` and whether every row of w sums to exactly 0 (tangent)."""
    W = Dyadic.of(w)
    return Dyadic.of(np.broadcast_to(gamma, w.shape)) * W, all(sum(int(v) for v in row) == 0 for row in W.m)


def _points(witness: Witness, key: str, direction: bool = False):
    """The exact array ``key`` of the witness in its domain: ``(dyadic, in_domain, largest)``.  On a
    LayerNorm image the exact point comes from the stored coordinates (refused without them)."""
    query = key in ("Q", "EQ")
    gamma = witness.query_gamma if query else witness.gamma
    array = getattr(witness, key)
    if gamma is None:
        if direction:
            return Dyadic.of(array), True, 0.0
        center = witness.query_center if query else witness.center
        inside, largest = _domain([array], center, witness.query_radius if query else witness.radius)
        return Dyadic.of(array), inside, largest
    if witness.image == "rmsnorm" and direction:
        return Dyadic.of(array), True, 0.0              # the image has interior: every direction is tangent
    coordinates = witness.coordinates.get(key)
    if coordinates is None:
        if direction and not np.any(array):
            return Dyadic.of(array), True, 0.0          # the zero direction moves nothing
        return Dyadic.of(array), False, math.inf
    if witness.image == "rmsnorm":
        return _rms_image_tokens(coordinates, gamma)
    if direction:
        exact, tangent = _image_directions(coordinates, gamma)
        return exact, tangent, 0.0
    return _image_tokens(coordinates, gamma, witness.query_center if query else witness.center)


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------
def _interval_digits(dps: int):
    """Interval arithmetic at ``dps`` decimal digits inside the block."""
    return precision(int(dps * 3.3219280948873626) + 8)


def _check_target(witness: Witness, target) -> None:
    if not isinstance(target, (Head, Layer)):
        raise WeightsError("head_or_layer", "a Head or a Layer", type(target).__name__,
                           "pass model.layer(L).heads[h] or model.layer(L).as_layer(residual=...)")
    heads = (target,) if isinstance(target, Head) else tuple(target.heads)
    if heads[0].d != witness.d:
        raise WeightsError("head_or_layer", f"a map of width d = {witness.d} (the witness's tokens)",
                           f"width {heads[0].d}", "pass the weights the witness was found for")
    if witness.head is not None and not isinstance(target, Head):
        raise AssumptionError("head_or_layer", f"a single Head (the witness is for head {witness.head})", "a Layer",
                              f"pass layer.heads[{witness.head}]")
    if witness.head is None and witness.layer is not None and not isinstance(target, Layer):
        raise AssumptionError("head_or_layer", "a Layer (the witness is for a whole layer)", "a Head",
                              "pass layer.as_layer(residual=...)")
    if isinstance(target, Layer) and bool(target.residual) != witness.residual:
        raise AssumptionError("head_or_layer", f"residual={witness.residual} as in the witness",
                              f"residual={bool(target.residual)}", f"pass as_layer(residual={witness.residual})")
    if witness.role != "self" and any(h.causal for h in heads):
        raise AssumptionError("head_or_layer", f"a head without a causal mask (the witness is {witness.role})",
                              "a causal head", "cross-attention heads are not masked")
    if any(h.kernel.name != witness.score for h in heads):
        raise AssumptionError("head_or_layer", f"kernel {witness.score!r} as in the witness",
                              f"kernels {sorted({h.kernel.name for h in heads})}",
                              "pass the map the witness was found for")


def recheck(witness: Witness, head_or_layer: Head | Layer, dps: int = RECHECK_DPS) -> Recheck:
    """Recompute a witness's value in high precision, with a rigorous enclosure.

    Parameters
    ----------
    witness : Witness
    head_or_layer : attention.Head or attention.Layer
        The map the witness is for (a Layer carries ``W_O`` and the residual flag).
    dps : int
        Decimal digits of the interval arithmetic.

    Returns
    -------
    Recheck
        ``valid`` is False when a token lies outside the ball or the stated value exceeds the
        enclosure by more than :data:`ROUNDING_TOLERANCE`.
    """
    if not isinstance(witness, Witness):
        raise WeightsError("witness", "a Witness", type(witness).__name__, "load one with Witness.load(path)")
    _check_target(witness, head_or_layer)
    began = time.perf_counter()
    with _interval_digits(dps), mpmath.workdps(dps):
        check = MapCheck(head_or_layer)
        X, inside, largest = _points(witness, "X")
        domains = [(inside, largest, "X")]
        if witness.kind == "jacobian":
            E, tangent, _ = _points(witness, "E", direction=True)
            directions = [(tangent, "E")]
            squares = E.row_sums_of_squares()
            total = Dyadic(np.array([squares.total()], dtype=object), squares.e)
            queries = EQ = None
            if witness.role != "self":
                queries, inside_q, largest_q = _points(witness, "Q")
                domains.append((inside_q, largest_q, "Q"))
                if witness.EQ is not None:
                    EQ, tangent_q, _ = _points(witness, "EQ", direction=True)
                    directions.append((tangent_q, "EQ"))
                    more = EQ.row_sums_of_squares()
                    total = concat([total, Dyadic(np.array([more.total()], dtype=object), more.e)], axis=0)
            out = check.jvp(X, E, queries, EQ)
            denominator = exact_sqrt(total.total(), total.e)
            numerator = out.frobenius()
        else:
            Y, inside_y, largest_y = _points(witness, "Y")
            domains.append((inside_y, largest_y, "Y"))
            directions = []
            out = check.forward_difference(X, Y)
            diff = Ball.exact(X - Y)
            numerator = out.frobenius() if witness.norm == "fro" else out.mixed21()
            denominator = diff.frobenius() if witness.norm == "fro" else diff.mixed21()
        if not lower(denominator) > 0:
            raise AssumptionError("witness", "a nonzero direction (E != 0, or X != Y)", "zero",
                                  "a witness needs a direction or two distinct inputs")
        enclosure = numerator / denominator
        low, high = lower(enclosure), upper(enclosure)
        value = mpmath.mp.make_mpf(enclosure.mid._mpi_[0])
    in_domain = all(ok for ok, _, _ in domains) and all(ok for ok, _ in directions)
    largest = max(size for _, size, _ in domains)
    stated = witness.value
    relative = float(abs(stated - value) / value) if value > 0 else (0.0 if stated == 0 else math.inf)
    valid = in_domain and stated <= high * (1 + ROUNDING_TOLERANCE)
    where = f"the {'RMSNorm' if witness.image == 'rmsnorm' else 'LayerNorm'} image" if witness.gamma is not None \
        else f"the ball of radius {witness.radius:g}"
    if valid:
        message = (f"valid: Lip >= {low:.12g} on {where} (stated {stated:.12g}, relative difference {relative:.1e})")
    elif not in_domain:
        outside = [name for ok, _, name in domains if not ok] + [f"{name} (not tangent)" for ok, name in directions
                                                                   if not ok]
        message = (f"invalid: {', '.join(outside)} outside the domain (max ||x_i - c|| = {largest!r} > R = "
                   f"{witness.radius!r})" if witness.gamma is None and witness.role == "self" and "X" in outside
                   else f"invalid: {', '.join(outside)} outside the domain (decided exactly)")
    else:
        message = f"invalid: the value is at most {high:.12g}, below the stated {stated:.12g}"
    return Recheck(stated=stated, value=value, lower=low, upper=high, in_domain=in_domain, max_distance=largest,
                   valid=valid, relative_difference=relative, seconds=time.perf_counter() - began,
                   target=witness.target, message=message)


def directional_norm(target: Head | Layer, X: np.ndarray, E: np.ndarray, norm: str = "fro",
                     dps: int = RECHECK_DPS) -> tuple[float, float]:
    """A rigorous enclosure ``(lower, upper)`` of ``||Df(X)[E]|| / ||E||`` in the Frobenius norm
    (``norm="fro"``) or the l_inf norm of vec (``norm="inf"``): the lower end bounds the map's
    Lipschitz constant in that norm from below on any domain holding X."""
    if norm not in ("fro", "inf"):
        raise AssumptionError("norm", "'fro' or 'inf'", repr(norm), "choose the norm of the directional derivative")
    with _interval_digits(dps), mpmath.workdps(dps):
        out = MapCheck(target).jvp(Dyadic.of(X), Dyadic.of(E))
        direction = Ball.exact(Dyadic.of(E))
        ratio = out.frobenius() / direction.frobenius() if norm == "fro" else out.max_abs() / direction.max_abs()
    return lower(ratio), upper(ratio)


def _weights_for(witness: Witness, weights):
    """The model a witness is re-checked against: ``weights`` (a path or a Model) if given, else the
    file the witness names; refused when its sha256 differs from the one the witness records."""
    if isinstance(weights, Model):
        model = weights
    else:
        path = weights if weights is not None else witness.weights
        if not path:
            if witness.model and witness.model != "sentence-transformers/all-MiniLM-L6-v2":
                raise WeightsError("weights", f"the checkpoint of {witness.model!r} (the witness records no file)",
                                   "nothing", "give as `weights` the file the witness was found on")
            path = DEFAULT_WEIGHTS
        if not Path(path).exists():
            raise WeightsError("weights", "the checkpoint the witness was found on",
                               f"{path} (recorded in the witness, no longer there)",
                               "give those weights as `weights`")
        model = load_weights(path, layers=None if witness.layer is None else [witness.layer])
    if witness.sha256 and model.sha256 and witness.sha256 != model.sha256:
        raise WeightsError("weights", f"weights with sha256 {witness.sha256[:16]}... (recorded in the witness, "
                           f"read from {witness.weights or 'an unnamed file'})",
                           f"{model.path or 'weights'} with sha256 {model.sha256[:16]}...",
                           "give as `weights` the exact file the witness was found on")
    return model


def recheck_file(path: str | Path, weights=None, dps: int = RECHECK_DPS) -> Recheck:
    """Load a witness file and re-check it against the weights it was found on.

    Parameters
    ----------
    path : str or Path
        A file written by :meth:`Witness.save`.
    weights : None, str, Path or Model
        ``None``: the file the witness records (its sha256 is checked); a path or a loaded
        model otherwise (refused when its sha256 differs from the witness's).

    Returns
    -------
    Recheck
        With ``weights`` and ``sha256`` naming the weights used.
    """
    witness = Witness.load(path)
    if witness.layer is None:
        raise WeightsError(str(path), "a witness that names its layer", "layer = None",
                           "re-check it in Python: recheck(witness, head_or_layer)")
    model = _weights_for(witness, weights)
    layer = model.layer(witness.layer, witness.block)
    attention = layer.attention
    if witness.role != "self":
        if layer.cross is None:
            raise WeightsError("witness role", "a layer with cross-attention", f"{witness.block} layer {witness.layer}",
                               "the witness does not belong to these weights")
        attention = layer.cross
    if witness.head is not None:
        if not 0 <= witness.head < len(attention.heads):
            raise WeightsError("witness head", f"a head index in [0, {len(attention.heads)})", str(witness.head),
                               "the witness does not belong to these weights")
        target = attention.heads[witness.head]
    elif witness.role == "self":
        target = layer.as_layer(residual=witness.residual)
    else:
        target = attention
    _check_domains(witness, model, layer)
    result = recheck(witness, target, dps=dps)
    return replace(result, weights=model.path, sha256=model.sha256)


def _check_domains(witness: Witness, model: Model, layer) -> None:
    """A witness on a LayerNorm image must name the LayerNorm that really feeds the attention: the
    layer's input norm (self-attention), its cross-attention norm (queries) and the encoder's
    final norm (context of cross-attention)."""
    if witness.role == "self":
        expected = [("gamma", layer.ln_in, "the LayerNorm feeding the layer")]
    else:
        expected = [("query_gamma", layer.cross_norm, "the LayerNorm feeding the cross-attention's queries"),
                    ("gamma", model.final_norm, "the encoder's final LayerNorm (the context)")]
    for key, norm, what in expected:
        gamma = getattr(witness, key)
        if gamma is None:
            continue
        center = witness.center if key == "gamma" else witness.query_center
        if norm is None or not (np.array_equal(gamma, norm.gamma) and np.array_equal(center, norm.center)) \
                or (witness.image == "rmsnorm") != (norm.kind == "rmsnorm"):
            raise WeightsError("witness domain", f"the image of {what}", "another LayerNorm's gain and bias",
                               "re-check the witness against the weights it was found on")
