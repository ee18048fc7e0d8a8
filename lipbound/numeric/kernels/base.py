r"""What every attention kernel is: its facts, its score map with JVP and VJP, its weights.

An attention kernel turns the projected queries ``q_i`` (rows of Q) and keys ``k_j`` (rows of K)
of a head, with their positions ``p_i`` and ``p_j``, into scores ``s_ij``; the mask
(:mod:`.masks`) adds position terms and hides keys; the kernel's weights (:mod:`.weights`: a
softmax, or a sigmoid of each score) turn the masked scores into attention weights.  Each kernel
is a small frozen dataclass holding only its own parameters and registered in :data:`KERNELS`
under the name the plain format stores; it owns

* :meth:`AttentionKernel.facts` -- the :class:`KernelFacts` that select its theorem
  (:mod:`lipbound.numeric.dispatch` maps them to a variant, or refuses);
* :meth:`AttentionKernel.linearize` -- the scores at a batch with their JVP and VJP
  (a :class:`ScoreMap`), batched over any leading axes ``(b, groups, heads per group, m, n)``;
* :meth:`AttentionKernel.weights` -- how scores become weights;
* :meth:`AttentionKernel.check` -- its parameters against the head's sizes;
* :meth:`AttentionKernel.to_arrays` and :func:`kernel_from_arrays` -- its parameters as plain
  arrays (the plain format, jobs sent to other processes);
* :attr:`AttentionKernel.sdp_encoding` -- the SDP relaxation that models it, or None.

Its witness starts and its high-precision re-check are registries keyed by the kernel class
(:data:`lipbound.numeric.witness.kernel_starts.KERNEL_STARTS`, :data:`lipbound.numeric.recheck.SCORE_CHECKS`),
tested for completeness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import ClassVar, final

import numpy as np

from ...errors import WeightsError
from .weights import SOFTMAX, Weights

__all__ = ["AttentionKernel", "KernelFacts", "ScoreMap", "KERNELS", "register", "reduce_to", "default_scale",
           "kernel_from_arrays"]

#: registry name -> kernel class; the plain format stores the name.
KERNELS: dict[str, type[AttentionKernel]] = {}


def register(cls):
    """Class decorator: add a kernel class to :data:`KERNELS` under its :attr:`~AttentionKernel.name`."""
    if cls.name in KERNELS:
        raise ValueError(f"two kernels named {cls.name!r}")
    KERNELS[cls.name] = cls
    return cls


def default_scale(d_k: int) -> float:
    """``1 / sqrt(d_k)`` (Vaswani et al. 2017), the scale the theorems state."""
    return 1.0 / math.sqrt(d_k)


def reduce_to(gradient: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum ``gradient`` over the axes an operand of ``shape`` was broadcast along (the VJP of a
    broadcast): keys and values shared by the heads of a group."""
    extra = gradient.ndim - len(shape)
    axes = tuple(range(extra)) + tuple(extra + i for i, size in enumerate(shape)
                                       if size == 1 and gradient.shape[extra + i] != 1)
    return gradient.sum(axis=axes, keepdims=True).reshape(shape) if axes else gradient


@final
@dataclass(frozen=True)
class KernelFacts:
    """What of a kernel selects a theorem.

    Attributes
    ----------
    score : str
        The :class:`~lipbound.symbolic.facts.HeadFacts` score key (``"dot"``, ``"l2"``, ``"cosine"``,
        ``"rope"``, ``"qk-norm"``, ``"feature-map"``, ``"custom"``).
    weights : {"softmax", "sigmoid"}
    standard_scale : bool
        The score's scale is the ``1/sqrt(d_k)`` the theorems state.
    describe : str
        The kernel in words, with its parameters, for refusals and reports.
    """

    score: str
    weights: str = "softmax"
    standard_scale: bool = True
    describe: str = ""


class ScoreMap:
    """Scores at a batch with their derivatives in the projected queries and keys.

    ``S`` (..., m, n); :meth:`jvp` ``(dQ, dK) -> dS`` (either may be None: it does not move);
    :meth:`vjp` ``gS -> (gQ, gK)`` with ``gK`` summed to the keys' own shape (keys shared by the
    heads of a group are broadcast along an axis of size 1).
    """

    S: np.ndarray

    def jvp(self, dQ: np.ndarray | None, dK: np.ndarray | None) -> np.ndarray:
        raise NotImplementedError

    def vjp(self, gS: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError


class AttentionKernel:
    """The base of every attention kernel (module docstring).  Subclasses are ``@final`` frozen
    dataclasses declared with ``eq=False``: equality and hashing compare the class and the
    parameters (arrays by value) here."""

    #: registry name (the plain format's ``kernel`` key)
    name: ClassVar[str]
    #: the kernel reads the positions of queries and keys
    positional: ClassVar[bool] = False
    #: the SDP relaxation that encodes this kernel's heads (a key of
    #: :data:`lipbound.numeric.sdp.registry.SDP_ENCODINGS`), or None: it has none
    sdp_encoding: ClassVar[str | None] = None
    #: values may go through ``A = W_Q W_Q^T / sqrt(d_k)`` (Kim et al. 2021's L2 attention)
    values_through_A: ClassVar[bool] = False

    # identity -----------------------------------------------------------------------------------
    def _key(self) -> tuple:
        out = [type(self)]
        for f in fields(self):
            value = getattr(self, f.name)
            out.append((value.shape, value.tobytes()) if isinstance(value, np.ndarray) else value)
        return tuple(out)

    def __eq__(self, other) -> bool:
        return isinstance(other, AttentionKernel) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    # what subclasses declare ---------------------------------------------------------------------
    def check(self, d: int, d_k: int, where: str) -> None:
        """Refuse parameters that do not fit a head of width d and key width d_k (WeightsError)."""

    def facts(self, d_k: int) -> KernelFacts:
        raise NotImplementedError

    def linearize(self, Q: np.ndarray, K: np.ndarray, pos_q: np.ndarray, pos_k: np.ndarray, d: int) -> ScoreMap:
        """The scores of queries Q (..., m, d_k) at positions ``pos_q`` (m,) against keys K
        (..., n, d_k) at ``pos_k`` (n,), with their derivatives; ``d`` is the token width."""
        raise NotImplementedError

    def symbol_values(self) -> dict[str, float]:
        """Values of the theorem's own symbols (``tau``, ``epsilon`` of the scaled cosine), by name."""
        return {}

    def weights(self) -> Weights:
        """How masked scores become attention weights (a softmax unless the kernel says)."""
        return SOFTMAX

    def bilinear_scale(self, d_k: int) -> float | None:
        """``c`` when the score is exactly ``c q . k`` at every position (the Gram-sandwich power
        iteration and the analytic curvature use it), else None."""
        return None

    def relative_rotation(self, d_k: int, offset: int) -> np.ndarray | None:
        """``R(offset)`` (d_k, d_k) when a query and a key ``offset = p_j - p_i`` positions apart score
        ``c q R(offset) k^T`` (the head acts at that offset as the dot-product head ``c W_Q R W_K^T``), else
        None: the witness starts that tie keys through these matrices (:mod:`lipbound.numeric.witness.layer_starts`)
        need them."""
        return None

    def to_arrays(self) -> dict[str, np.ndarray]:
        """``{"kernel": name, parameter: array, ...}``: plain data (0-d arrays for numbers and strings;
        None parameters left out; a nested kernel under ``"<parameter>.<key>"``)."""
        out = {"kernel": np.asarray(self.name)}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, AttentionKernel):
                out.update({f"{f.name}.{key}": array for key, array in value.to_arrays().items()})
            elif value is not None:
                out[f.name] = np.asarray(value)
        return out

    @classmethod
    def from_arrays(cls, arrays: dict) -> AttentionKernel:
        """The kernel of :meth:`to_arrays` without its ``kernel`` key (plain arrays back to parameters)."""
        values = {}
        for f in fields(cls):
            nested = {key[len(f.name) + 1:]: value for key, value in arrays.items() if key.startswith(f.name + ".")}
            if nested:
                values[f.name] = kernel_from_arrays(nested, f"{cls.name}.{f.name}")
            elif f.name in arrays:
                array = np.asarray(arrays[f.name])
                values[f.name] = array.item() if array.ndim == 0 else array
        try:
            return cls(**values)
        except TypeError as error:
            raise WeightsError(f"kernel {cls.name!r}", f"the parameters of {cls.__name__}", str(error),
                               "write the kernel with save_plain (docs/formats.md)") from None

    def describe(self) -> str:
        params = ", ".join(f"{f.name}={_short(getattr(self, f.name))}" for f in fields(self)
                           if getattr(self, f.name) is not None)
        return f"{type(self).__name__}({params})"


def _short(value) -> str:
    if isinstance(value, np.ndarray):
        return f"array{value.shape}"
    if isinstance(value, AttentionKernel):
        return value.describe()
    return repr(value)


def kernel_from_arrays(arrays: dict, where: str = "kernel") -> AttentionKernel:
    """A kernel from its plain arrays: ``kernel`` (the registry name) and its parameters."""
    if "kernel" not in arrays:
        raise WeightsError(where, "a 'kernel' key naming a registered kernel", f"keys {sorted(arrays)}",
                           "write the kernel with save_plain (docs/formats.md)")
    name = str(np.asarray(arrays["kernel"]).item())
    if name not in KERNELS:
        raise WeightsError(where, f"one of the registered kernels {sorted(KERNELS)}", repr(name),
                           "use a kernel lipbound knows (lipbound.numeric.kernels.KERNELS)")
    return KERNELS[name].from_arrays({key: value for key, value in arrays.items() if key != "kernel"})
