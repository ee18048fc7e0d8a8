r"""Rotary position embeddings (RoPE; Su et al. 2021): the dot product of rotated queries and keys.

A query at position ``p_i`` and a key at ``p_j`` score

    s_ij = c (R(p_i) q_i) . (R(p_j) k_j) = c q_i^T R(p_j - p_i) k_j,

``R(p)`` rotating each pair of coordinates ``(u_a, u_b)`` by the angle ``p theta_t``,
``theta_t = base^(-2t/D)``, ``t = 0 .. D/2 - 1``, ``D = dims`` (coordinates beyond D are not
rotated).  The pairs are ``(t, t + D/2)`` with ``pairing="half"`` (Hugging Face's
``rotate_half``, GPT-NeoX) or ``(2t, 2t + 1)`` with ``pairing="interleaved"`` (GPT-J, the rows
of llama.cpp's GGUF files):

    u'_a = u_a cos - u_b sin,    u'_b = u_b cos + u_a sin.

A rotation is linear and orthogonal: its JVP is itself and its VJP the rotation by ``-p theta``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar, final

import numpy as np

from ...errors import WeightsError
from ..checks import positive_float
from .base import AttentionKernel, KernelFacts, register
from .scores import BilinearScores, _standard, check_scale, scale_of

__all__ = ["Rotary", "Rotation", "PAIRINGS"]

PAIRINGS = ("half", "interleaved")


@lru_cache(maxsize=256)
def _tables(base: float, D: int, width: int, pairing: str, positions: tuple, dtype: str):
    """``(partner, cos, sin)`` with ``R(p) u = u * cos + u[partner] * sin`` row by row: ``partner`` swaps each rotated
    pair, ``cos`` and ``sin`` (L, width) hold the angles ``p base^(-2t/D)`` on both coordinates of pair t (``sin``
    negated on the first), 1 and 0 beyond the D rotated coordinates.  Read-only, and formed once: a pure function of
    its arguments (a witness search builds thousands of rotations at the same positions)."""
    half = D // 2
    frequencies = float(base) ** (-np.arange(half, dtype=np.float64) * 2.0 / D)
    angles = np.asarray(positions, dtype=np.float64)[:, None] * frequencies[None, :]
    first, second = (np.arange(half), np.arange(half, D)) if pairing == "half" else \
        (np.arange(0, D, 2), np.arange(1, D, 2))
    partner = np.arange(width)
    partner[first], partner[second] = second, first
    cos, sin = np.ones((len(positions), width)), np.zeros((len(positions), width))
    cos[:, first], cos[:, second] = np.cos(angles), np.cos(angles)
    sin[:, first], sin[:, second] = -np.sin(angles), np.sin(angles)
    cos, sin = cos.astype(dtype), sin.astype(dtype)
    for table in (partner, cos, sin):
        table.flags.writeable = False
    return partner, cos, sin


@final
class Rotation:
    """``R(p_l) u_l`` for the rows u_l (..., L, w) of U at positions ``p`` (L,), as a linearised
    transform (``F``, ``jvp``, ``vjp``)."""

    __slots__ = ("partner", "cos", "sin", "F")

    def __init__(self, rotary: Rotary, U: np.ndarray, positions: np.ndarray):
        self.partner, self.cos, self.sin = _tables(float(rotary.base), rotary.rotated(U.shape[-1]), U.shape[-1],
                                                   rotary.pairing, tuple(np.asarray(positions).tolist()), U.dtype.str)
        self.F = self.rotate(U, 1)

    def rotate(self, U: np.ndarray, sign: int) -> np.ndarray:
        """The rotation by ``sign * p theta`` (``sign = -1``: the transpose): ``u'_a = u_a cos - u_b sin``, ``u'_b =
        u_b cos + u_a sin`` on each pair (a, b)."""
        swapped = U.take(self.partner, axis=-1)
        swapped *= self.sin if sign > 0 else -self.sin
        swapped += U * self.cos
        return swapped

    def jvp(self, dU):
        return self.rotate(dU, 1)

    def vjp(self, gU):
        return self.rotate(gU, -1)


@register
@final
@dataclass(frozen=True, eq=False)
class Rotary(AttentionKernel):
    """RoPE (module docstring).

    Parameters
    ----------
    base : float
        ``theta`` of the frequencies (10000 for Llama 2, 500000 for Llama 3, 100000 for SmolLM2).
    dims : int, optional
        Rotated coordinates per head, even, at most d_k (None: all of d_k).
    pairing : {"half", "interleaved"}
    scale : float, optional
        ``c`` (None: ``1/sqrt(d_k)``).
    """

    base: float = 10000.0
    dims: int | None = None
    pairing: str = "half"
    scale: float | None = None
    name: ClassVar[str] = "rope"
    positional: ClassVar[bool] = True

    def __post_init__(self):
        object.__setattr__(self, "base", positive_float("base", self.base, "use the checkpoint's rope_theta"))
        if self.pairing not in PAIRINGS:
            raise WeightsError("pairing", f"one of {PAIRINGS}", repr(self.pairing),
                               "'half' for Hugging Face checkpoints, 'interleaved' for GGUF rows and GPT-J")
        if self.dims is not None:
            if isinstance(self.dims, bool) or not float(self.dims).is_integer() or int(self.dims) < 2 \
                    or int(self.dims) % 2:
                raise WeightsError("dims", "an even number of rotated coordinates >= 2", repr(self.dims),
                                   "use the head size times partial_rotary_factor")
            object.__setattr__(self, "dims", int(self.dims))
        object.__setattr__(self, "scale", check_scale(self.scale))

    def rotated(self, d_k: int) -> int:
        """How many coordinates of a head of key width d_k rotate."""
        return d_k if self.dims is None else self.dims

    def check(self, d: int, d_k: int, where: str) -> None:
        if self.rotated(d_k) > d_k or self.rotated(d_k) % 2:
            raise WeightsError(f"{where}.kernel.dims", f"an even number <= d_k = {d_k}", repr(self.rotated(d_k)),
                               "rotate at most the head's coordinates, in pairs")

    def facts(self, d_k: int) -> KernelFacts:
        return KernelFacts("rope", standard_scale=_standard(self.scale, d_k), describe=self.describe())

    def rotation(self, U: np.ndarray, positions: np.ndarray) -> Rotation:
        return Rotation(self, U, positions)

    def relative_rotation(self, d_k: int, offset: int) -> np.ndarray:
        """``R(offset)`` (d_k, d_k): a query and a key ``offset = p_j - p_i`` positions apart score
        ``c q R(offset) k^T`` (rows), so the head acts at that offset as a dot-product head with
        ``A = c W_Q R W_K^T``."""
        return Rotation(self, np.eye(d_k), np.full(d_k, offset)).F.T

    def linearize(self, Q, K, pos_q, pos_k, d):
        return BilinearScores(scale_of(self.scale, Q.shape[-1]), Rotation(self, Q, pos_q), Rotation(self, K, pos_k))
