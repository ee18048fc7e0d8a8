"""Rigorous arithmetic, the one engine under every certified number of lipbound.

* :mod:`~lipbound.rigorous.intervals` -- intervals with outward rounding in a private
  context, :func:`certify_le` and the three-valued :class:`Verdict`;
* :mod:`~lipbound.rigorous.functions` -- interval versions of the special functions the
  bounds contain (Lambert W, digamma, erf, lipbound's column-sum constants);
* :mod:`~lipbound.rigorous.compiler` -- SymPy expression -> interval function, refusing any
  node it cannot enclose;
* :mod:`~lipbound.rigorous.linalg` -- floating-point matrices with rigorous error bounds,
  certified spectral norms and eigenvalue bounds (numpy);
* :mod:`~lipbound.rigorous.value` -- the certified-value type every bound is reported in.

This package sits below the symbolic and the numeric layers and imports neither.
"""

from .intervals import IV, Verdict, certify_le, hull, interval, lower, precision, upper

__all__ = ["IV", "Verdict", "certify_le", "hull", "interval", "lower", "precision", "upper"]
