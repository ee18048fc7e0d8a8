r"""Activations of feed-forward blocks as SymPy expressions, and their certified slope ranges.

An activation :math:`\varphi` is stated once, as an expression in the pre-activation ``t``; its
slope ``phi'`` and curvature ``phi''`` are exact SymPy derivatives.  They are compiled to
interval arithmetic (:func:`lipbound.rigorous.compiler.compile_interval`) to enclose the slope
range ``[inf phi', sup phi']`` over the real line (:func:`lipbound.rigorous.slopes.derivative_range`),
and to numpy by the numeric layer (:mod:`lipbound.numeric.blocks.activations`).  Names are
Hugging Face's ``hidden_act`` names; constants are the exact decimals of the definitions.

**Tail lemma.**  Beyond ``[-L, L]`` every activation here has ``phi'(t) = m(t) + r(t)`` with
``m(t)`` in ``[0, 1]`` and ``|r(t)| <= tail(L)`` for ``|t| >= L >= L_0``, so there
``phi'(t)`` lies in ``[-tail(L), 1 + tail(L)]``:

* GELU, ``t Phi(t)`` (Hendrycks and Gimpel 2016): ``m = Phi``, ``r = t pdf(t)``, and ``|t| pdf(t)``
  decreases on ``|t| >= 1``: ``tail(L) = L e^{-L^2/2} / sqrt(2 pi)``;
* tanh GELU, ``t (1 + tanh u) / 2`` with ``u = k_0 (t + k_1 t^3)``, ``k_0 = sqrt(2/pi)``,
  ``k_1 = 0.044715``: ``m = (1 + tanh u)/2``, ``r = t sech^2(u) u' / 2`` is odd, and for ``t >= 1``
  ``|r| <= 2 t k_0 (1 + 3 k_1 t^2) e^{-2u} =: h(t)`` (``sech^2 u <= 4 e^{-2u}``) with
  ``(log h)' = 1/t + 6 k_1 t / (1 + 3 k_1 t^2) - 2 k_0 (1 + 3 k_1 t^2) <= 1 + sqrt(3 k_1) - 2 k_0 < 0``:
  ``tail(L) = h(L)``;
* SiLU, ``t sigma(t)`` (Elfwing, Uchibe, Doya 2018; "swish"): ``m = sigma``,
  ``r = t sigma (1 - sigma)``, ``|r| <= |t| e^{-|t|}``, decreasing on ``|t| >= 1``: ``tail(L) = L e^{-L}``;
* QuickGELU, ``t sigma(1.702 t)`` (Radford et al. 2021): ``phi(t) = silu(a t) / a`` with
  ``a = 1.702``, so ``phi'(t) = silu'(a t)``: the slope range of SiLU, and ``tail(L) = a L e^{-a L}``
  for ``a L >= 1``;
* ReLU, ``max(t, 0)``: piecewise linear; every secant slope lies in ``[0, 1]`` and both ends are
  attained (no enclosure needed).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Final, final

import sympy as sp

from ..errors import WeightsError
from ..rigorous.compiler import compile_interval
from ..rigorous.intervals import hull, interval
from ..rigorous.slopes import SlopeRange, derivative_range

__all__ = ["t", "Activation", "ACTIVATIONS", "ALIASES", "activation", "slope_range", "interval_maps"]

#: The pre-activation.
t: Final = sp.Symbol("t", real=True)
_L = sp.Symbol("L", positive=True)
_K0 = sp.sqrt(2 / sp.pi)
_K1 = sp.Rational(44715, 10 ** 6)
_QUICK = sp.Rational(1702, 1000)


def _sigmoid(u):
    return 1 / (1 + sp.exp(-u))


@final
@dataclass(frozen=True)
class Activation:
    """An activation ``phi(t)`` with the tail lemma that closes its slope range.

    Attributes
    ----------
    name, title, source : str
        Hugging Face name, a readable title, the paper.
    expression : sympy expression or None
        ``phi(t)``; None for a piecewise linear activation with exact ``slopes``.
    tail : sympy expression in ``L`` or None
        Bounds ``|phi'(t) - m(t)|`` for ``|t| >= L`` (module docstring), ``m`` in ``[0, 1]``.
    tail_from : float
        The smallest ``L`` for which the tail lemma holds.
    slopes : tuple of two ints, optional
        The exact slope range of a piecewise linear activation.
    """

    name: str
    title: str
    source: str
    expression: sp.Expr | None = None
    tail: sp.Expr | None = None
    tail_from: float = 1.0
    slopes: tuple[int, int] | None = None

    def slope(self) -> sp.Expr:
        """``phi'(t)``, exact."""
        return sp.diff(self.expression, t)

    def curvature(self) -> sp.Expr:
        """``phi''(t)``, exact."""
        return sp.diff(self.expression, t, 2)


#: name -> Activation (Hugging Face ``hidden_act`` names)
ACTIVATIONS: Final[dict[str, Activation]] = {
    "gelu": Activation("gelu", "GELU", "Hendrycks and Gimpel 2016", t * (1 + sp.erf(t / sp.sqrt(2))) / 2,
                       _L * sp.exp(-_L ** 2 / 2) / sp.sqrt(2 * sp.pi)),
    "gelu_new": Activation("gelu_new", "GELU, tanh approximation", "Hendrycks and Gimpel 2016",
                           t * (1 + sp.tanh(_K0 * (t + _K1 * t ** 3))) / 2,
                           2 * _L * _K0 * (1 + 3 * _K1 * _L ** 2) * sp.exp(-2 * _K0 * (_L + _K1 * _L ** 3))),
    "silu": Activation("silu", "SiLU (swish)", "Elfwing, Uchibe, Doya 2018", t * _sigmoid(t), _L * sp.exp(-_L)),
    "quick_gelu": Activation("quick_gelu", "QuickGELU", "Radford et al. 2021", t * _sigmoid(_QUICK * t),
                             _QUICK * _L * sp.exp(-_QUICK * _L), tail_from=float(1 / _QUICK)),
    "relu": Activation("relu", "ReLU", "Nair and Hinton 2010", slopes=(0, 1)),
}
#: other spellings -> the name in :data:`ACTIVATIONS`
ALIASES: Final[dict[str, str]] = {"gelu_pytorch_tanh": "gelu_new", "swish": "silu"}


def activation(name: str) -> Activation:
    """The activation called ``name`` (or one of its :data:`ALIASES`)."""
    try:
        return ACTIVATIONS[ALIASES.get(name, name)]
    except KeyError:
        raise WeightsError("hidden_act", f"one of {sorted(ACTIVATIONS) + sorted(ALIASES)}", repr(name),
                           "use a feed-forward block with a supported activation") from None


@functools.cache
def interval_maps(name: str) -> tuple:
    """``(phi, phi')`` as functions of one interval, each enclosing the exact image (compiled
    once); ReLU's are exact: ``max(t, 0)``, and slope 0, 1 or ``[0, 1]`` where the sign is unknown."""
    spec = activation(name)
    if spec.slopes is not None:
        value_map = compile_interval(sp.Max(t, 0), [t])
        step_map = compile_interval(sp.Piecewise((0, t < 0), (1, True)), [t])
        return value_map, lambda z: hull(0, 1) if _straddles(z) else step_map(z)
    slope, curvature = compile_interval(spec.slope(), [t]), compile_interval(spec.curvature(), [t])

    def slope_map(z):  # mean-value form about the midpoint: one special-function call per box
        z = interval(z)
        middle = float(z.mid) if z.a != z.b else z.a
        return slope(middle) + curvature(z) * (z - middle)

    return compile_interval(spec.expression, [t]), slope_map


def _straddles(z) -> bool:
    z = interval(z)
    return z.a <= 0 <= z.b


@functools.cache
def slope_range(name: str, limit: float = 12.0) -> SlopeRange:
    """Certified ``[inf phi', sup phi']`` over the real line (computed once per name).

    Branch and bound on ``[-limit, limit]`` with the compiled ``phi'`` and ``phi''``, and the
    tail lemma beyond (module docstring); ReLU's range ``[0, 1]`` is exact.
    """
    spec = activation(name)
    if spec.slopes is not None:
        return SlopeRange(spec.name, interval(spec.slopes[0]), interval(spec.slopes[1]), -1.0, 1.0,
                          "piecewise linear: secant slopes 0 and 1, both attained")
    if limit < spec.tail_from:
        raise WeightsError("limit", f"at least {spec.tail_from} (where the tail lemma starts)", repr(limit),
                           "use the default limit")
    first, second = (compile_interval(e, [t]) for e in (spec.slope(), spec.curvature()))
    tail = compile_interval(spec.tail, [_L])(limit)
    return derivative_range(first, second, limit, hull(-tail, 1 + tail), name=spec.name)
