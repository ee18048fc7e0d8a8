"""Certified linear algebra for the SDP layer, and the result type of every relaxation.

A solver's objective is only a candidate.  What counts is a re-check done here:
matrices are carried as :class:`Enclosure` objects (a float midpoint and an
entrywise radius that bounds every rounding error made so far), and eigenvalue
bounds come from a Cholesky factorisation whose residual is bounded rigorously:

    for any real L and shift s:  lambda_min(S) >= s - ||S - s I - L L^T||_2,

because ``L L^T`` is positive semidefinite.  Rounding errors of floating-point
products follow the classical bound ``|fl(X Y) - X Y| <= gamma_k |X| |Y|``,
``gamma_k = k u / (1 - k u)``, ``u = 2^-53`` (Higham, *Accuracy and Stability of
Numerical Algorithms*, 2nd ed., Thm 3.5 and eq. (3.13)); it holds for every order of
summation, blocked or fused.  Scalars are combined with :mod:`mpmath.iv` (outward
rounding), so a comparison that rounding could flip is never decided in floating point.
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass, field
from typing import final

import numpy as np

from ...errors import NotCertifiedError, SolverError, WeightsError

__all__ = ["Enclosure", "CertifiedBound", "lambda_min_lower", "lambda_max_upper",
           "spectral_norm_upper", "is_psd_certified", "iv", "upper", "lower", "UNIT_ROUNDOFF",
           "one_blas_thread"]

UNIT_ROUNDOFF = 2.0 ** -53
_U = UNIT_ROUNDOFF
_ETA = 2.0 ** -1074  # spacing of subnormals: absolute error of an underflowing operation


def _gamma(k: int) -> float:
    """``gamma_k = k u / (1 - k u)``, rounded up (the factor 1 + 4u covers the two roundings)."""
    return k * _U / (1.0 - k * _U) * (1.0 + 4 * _U)


def _safe(k: int) -> float:
    """Inflation factor for a non-negative quantity computed with at most k + 8 roundings."""
    return 1.0 + 2.0 * _gamma(k + 8)


def _fro_upper(X: np.ndarray) -> float:
    """Upper bound on the Frobenius norm of a non-negative float array, rounding included."""
    X = np.asarray(X, dtype=float)
    if X.size == 0:
        return 0.0
    total = float(np.sum(X * X))
    return math.nextafter(math.sqrt(total * _safe(X.size)), math.inf) + _ETA


@final
@dataclass(frozen=True)
class Enclosure:
    """A real matrix known to lie within ``mid +- rad`` entrywise.

    Parameters
    ----------
    mid : ndarray
        Floating-point midpoint, any shape (scalars are 0-d arrays).
    rad : ndarray
        Non-negative radius of the same shape: ``|true - mid| <= rad`` entrywise.

    Arithmetic (``@``, ``+``, ``-``, scaling, transpose) returns enclosures of the exact
    result of the same operation on the enclosed matrices.
    """

    mid: np.ndarray
    rad: np.ndarray

    def __post_init__(self):
        mid = np.asarray(self.mid, dtype=float)
        rad = np.broadcast_to(np.asarray(self.rad, dtype=float), mid.shape).copy()
        if not (np.all(np.isfinite(mid)) and np.all(np.isfinite(rad))):
            raise WeightsError("matrix", "finite entries", "NaN or Inf (or an overflow)",
                               "check the weights; lipbound works with finite float64 values")
        if np.any(rad < 0):
            raise WeightsError("rad", "a non-negative radius", "a negative entry", "build with Enclosure.exact")
        object.__setattr__(self, "mid", mid)
        object.__setattr__(self, "rad", rad)

    # construction -------------------------------------------------------------------
    @classmethod
    def exact(cls, value) -> "Enclosure":
        """A float matrix taken as exact (radius 0)."""
        value = np.asarray(value, dtype=float)
        return cls(value, np.zeros_like(value))

    @classmethod
    def real(cls, interval) -> "Enclosure":
        """A scalar enclosure from an :mod:`mpmath.iv` interval (e.g. ``iv.mpf(1)/iv.sqrt(32)``)."""
        lo, hi = lower(interval), upper(interval)
        mid = 0.5 * lo + 0.5 * hi
        rad = max(upper(iv.mpf(hi) - iv.mpf(mid)), upper(iv.mpf(mid) - iv.mpf(lo)))
        return cls(np.float64(mid), np.float64(rad))

    # arithmetic ---------------------------------------------------------------------
    @property
    def shape(self):
        return self.mid.shape

    @property
    def T(self) -> "Enclosure":
        return Enclosure(self.mid.T, self.rad.T)

    def __matmul__(self, other: "Enclosure") -> "Enclosure":
        other = _as_enclosure(other)
        k = self.mid.shape[-1]
        mid = self.mid @ other.mid
        rounding = np.abs(self.mid) @ np.abs(other.mid)
        spread = np.abs(self.mid) @ other.rad + self.rad @ np.abs(other.mid) + self.rad @ other.rad
        rad = (_gamma(k) * rounding + spread) * _safe(k) + (k + 4) * _ETA
        return Enclosure(mid, rad)

    def __add__(self, other) -> "Enclosure":
        other = _as_enclosure(other)
        mid = self.mid + other.mid
        return Enclosure(mid, (self.rad + other.rad + _U * np.abs(mid)) * _safe(2) + _ETA)

    def __sub__(self, other) -> "Enclosure":
        other = _as_enclosure(other)
        mid = self.mid - other.mid
        return Enclosure(mid, (self.rad + other.rad + _U * np.abs(mid)) * _safe(2) + _ETA)

    def __neg__(self) -> "Enclosure":
        return Enclosure(-self.mid, self.rad)

    def scale(self, factor) -> "Enclosure":
        """Multiply by a float (taken as exact) or by a scalar :class:`Enclosure`."""
        if isinstance(factor, Enclosure):
            s, r = float(factor.mid), float(factor.rad)
        else:
            s, r = float(factor), 0.0
        mid = s * self.mid
        rad = (abs(s) * self.rad + r * (np.abs(self.mid) + self.rad) + _U * np.abs(mid)) * _safe(3) + _ETA
        return Enclosure(mid, rad)

    def sym(self) -> "Enclosure":
        """Enclosure of the same matrix, known to be symmetric, with a symmetric midpoint."""
        mid = 0.5 * (self.mid + self.mid.T)
        rad = (0.5 * (self.rad + self.rad.T) + _U * np.abs(mid)) * _safe(2) + _ETA
        return Enclosure(mid, rad)

    def quad(self, v: np.ndarray) -> "Enclosure":
        """``v^T S v`` for a float vector v (exact), as a scalar enclosure."""
        v = Enclosure.exact(np.asarray(v, dtype=float).reshape(-1, 1))
        return v.T @ (self @ v)

    def interval(self):
        """The scalar as an :mod:`mpmath.iv` interval."""
        if self.mid.size != 1:
            raise WeightsError("enclosure", "a scalar", f"shape {self.mid.shape}", "index it first")
        m, r = iv.mpf(float(self.mid.reshape(()))), iv.mpf(float(self.rad.reshape(())))
        return m + iv.mpf([-1, 1]) * r


def _as_enclosure(value) -> Enclosure:
    return value if isinstance(value, Enclosure) else Enclosure.exact(value)


# Eigenvalue bounds -----------------------------------------------------------------------
def lambda_min_lower(S: Enclosure | np.ndarray, attempts: int = 8) -> float:
    """A certified lower bound on ``lambda_min`` of the symmetric matrix enclosed by ``S``.

    Method: pick ``s`` a little below the computed ``lambda_min`` of the midpoint, factor
    ``B = fl(mid - s I) = L L^T + Delta`` by Cholesky, bound ``||Delta||_2 <= ||Delta||_F``
    rigorously (``|fl(L L^T) - L L^T| <= gamma_m |L||L|^T``), and add the radius:
    ``lambda_min(S) >= s - ||Delta||_F - ||diag rounding||_F - ||rad||_F``.
    Returns ``-inf`` if no factorisation succeeds (nothing is claimed).
    """
    S = _as_enclosure(S).sym()
    M = S.mid
    m = M.shape[0]
    if M.ndim != 2 or M.shape[1] != m:
        raise WeightsError("S", "a square matrix", f"shape {M.shape}", "pass a symmetric matrix")
    if m == 0:
        return math.inf
    radius = _fro_upper(S.rad)
    scale = float(np.linalg.norm(M))
    if scale == 0.0:
        return math.nextafter(-radius, -math.inf)
    estimate = float(np.linalg.eigvalsh(M)[0])
    for attempt in range(attempts):
        shift = estimate - 16.0 * (m + 2) * _U * scale * (8.0 ** attempt)
        B = M.copy()
        B[np.diag_indices(m)] = np.diag(M) - shift
        try:
            L = np.linalg.cholesky(B)
        except np.linalg.LinAlgError:
            continue
        product = L @ L.T
        residual = np.abs(B - product) * (1 + 2 * _U) + _gamma(m) * (np.abs(L) @ np.abs(L).T) * _safe(m)
        residual[np.diag_indices(m)] += _U * np.abs(np.diag(B)) * (1 + 2 * _U)  # fl(M_ii - s)
        delta = _fro_upper(residual) + radius
        return math.nextafter(math.nextafter(shift - delta, -math.inf), -math.inf)
    return -math.inf


def lambda_max_upper(S: Enclosure | np.ndarray) -> float:
    """A certified upper bound on ``lambda_max`` of the symmetric matrix enclosed by ``S``."""
    return -lambda_min_lower(-_as_enclosure(S))


def spectral_norm_upper(X: Enclosure | np.ndarray) -> float:
    """A certified upper bound on ``||X||_2`` (largest singular value), via the smaller Gram matrix."""
    X = _as_enclosure(X)
    if X.mid.ndim != 2:
        raise WeightsError("X", "a matrix", f"shape {X.mid.shape}", "pass a 2-d array")
    gram = X.T @ X if X.shape[0] >= X.shape[1] else X @ X.T
    top = max(lambda_max_upper(gram), 0.0)
    return math.nextafter(math.sqrt(top), math.inf)


def is_psd_certified(S: Enclosure | np.ndarray, margin: float = 0.0) -> bool:
    """True only if ``lambda_min(S) >= margin`` is proved (False means: not proved)."""
    return lambda_min_lower(S) >= margin


def one_blas_thread(function):
    """Run ``function`` with numpy's OpenBLAS on one thread (restored afterwards).

    The certificates and searches here work on matrices of a few hundred rows, where a
    second BLAS thread costs more than it saves (5-10x slower measured on a 2-core machine).
    Uses :func:`lipbound.numeric.witness.single_threaded_blas`; a no-op without it.
    """
    @functools.wraps(function)
    def wrapped(*args, **kwargs):
        try:
            from ..witness import single_threaded_blas
            guard = single_threaded_blas()
        except ImportError:
            guard = contextlib.nullcontext()
        with guard:
            return function(*args, **kwargs)
    return wrapped


# Scalars ---------------------------------------------------------------------------------
def _iv():
    from mpmath import iv as interval
    interval.prec = 53
    return interval


iv = _iv()


def upper(x) -> float:
    """The smallest float >= the upper end of an :mod:`mpmath.iv` interval (or a float)."""
    import mpmath
    if isinstance(x, (int, float, np.floating)):
        return float(x)
    end = mpmath.mpf(x.b)
    value = float(end)
    return math.nextafter(value, math.inf) if mpmath.mpf(value) < end else value


def lower(x) -> float:
    """The largest float <= the lower end of an :mod:`mpmath.iv` interval (or a float)."""
    import mpmath
    if isinstance(x, (int, float, np.floating)):
        return float(x)
    end = mpmath.mpf(x.a)
    value = float(end)
    return math.nextafter(value, -math.inf) if mpmath.mpf(value) > end else value


# The result type ---------------------------------------------------------------------------
@final
@dataclass(frozen=True)
class CertifiedBound:
    """A numeric upper bound and the evidence for it.

    Attributes
    ----------
    name : str
        What is bounded, e.g. ``"gamma_{A,V}"`` or ``"Lip(self-attention)"``.
    value : float
        The certified upper bound; ``nan`` whenever ``certified`` is False (never a silent number).
    certified : bool
        True only if the re-check after the solve passed.
    certificate : dict
        The re-check numbers: dual variables, certified eigenvalue bounds, sub-certificates.
    solver : str
        ``"clarabel"``, ``"scs"``, ``"eig"`` (one-dimensional convex search, no conic solver), ...
    solve_time : float
        Wall-clock seconds, solve and re-check together.
    status : str
        The solver's status, or ``"certified"`` / the reason of failure.
    provenance : str
        The mathematics the value rests on (the docstring that proves it).
    reason : str
        Why it is not certified (empty when certified).
    lower : float
        A certified lower bound on the same quantity, when one is known (else ``nan``).
    """

    name: str
    value: float
    certified: bool
    certificate: dict = field(repr=False)
    solver: str
    solve_time: float
    status: str
    provenance: str
    reason: str = ""
    lower: float = math.nan

    def __post_init__(self):
        if not self.certified:
            object.__setattr__(self, "value", math.nan)
            if not self.reason:
                object.__setattr__(self, "reason", "not certified")
        elif not math.isfinite(self.value):
            raise NotCertifiedError(self.name, "a finite certified value", repr(self.value),
                                    "report a failed re-check with certified=False")

    @property
    def gap(self) -> float:
        """``value / lower``: how far the certified bound may be from the truth (1 = exact)."""
        return self.value / self.lower if self.lower and self.lower > 0 else math.inf

    def require(self) -> float:
        """The value, or :class:`SolverError` if it is not certified."""
        if not self.certified:
            raise SolverError(self.name, "a certified bound", f"not certified ({self.reason})",
                              "try solver='eig' or 'clarabel', or check the weights")
        return self.value

    def to_json(self) -> dict:
        return {"name": self.name, "value": self.value, "certified": self.certified,
                "lower": self.lower, "solver": self.solver, "solve_time": self.solve_time,
                "status": self.status, "reason": self.reason, "provenance": self.provenance,
                "certificate": _jsonable(self.certificate)}


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, CertifiedBound):
        return value.to_json()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
