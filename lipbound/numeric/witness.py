"""Witnesses: inputs where attention really stretches (certified lower bounds).

The domain is ``D = {X in R^{n x d} : ||x_i - c||_2 <= R for every token i}``, a
convex set, and ``f`` is smooth, so for the Frobenius norm

    Lip(f; D) = sup_{X in D} ||Df(X)||_2   >=   ||Df(X)[E]||_F / ||E||_F    for any X in D, E != 0,

and for any norm ``Lip(f; D) >= ||f(X) - f(Y)|| / ||X - Y||`` for ``X, Y in D``.  A
:class:`Witness` stores such an ``(X, E)`` ("jacobian") or ``(X, Y)`` ("secant") with the
value it certifies; :func:`lipbound.numeric.recheck.recheck` recomputes that value in
high precision from the stored floats, so anyone can check it.

The search (:func:`search_witness`) exploits the structure of dot-product attention.
With ``A = W_Q W_K^T / sqrt(d_k)`` and ``u = W_K b_Q / sqrt(d_k)`` the score is
``s(x, y) = x^T A y + u . y`` up to terms in ``x`` alone (which softmax ignores), and

    Df_i[E] = sum_j p_ij W_V^T e_j + Cov_{j~p_i}(ds_ij, v(x_j)),
    ds_ij   = (A x_j) . e_i + (A^T x_i + u) . e_j                       (DESIGN.md section 2).

The covariance is largest for a query tied (``p = 1/2, 1/2``) between two keys far
apart with very different values.  Two constructions follow, combined in one:

* alpha-type: keys ``+R a``, ``-R a``, a query with ``s`` tied between them, moved along
  ``A a``: ``||Df|| ~ R^2 ||A a|| ||W_V^T a||``;
* beta-type: the same two keys and ``m = n - 2`` queries at ``R b`` with the tie
  ``(R A^T b + u) . a = 0`` and ``R^2 b^T A b + R u . b << 0`` (queries ignore each
  other), the keys moved in opposite directions along ``R A^T b + u``:
  ``||Df|| ~ sqrt(m / 2) R ||R A^T b + u|| ||W_V^T a||``, the ``sqrt(n)`` growth of
  Castin, Ablin, Peyre (ICML 2024).

Both together predict ``||Df||^2 ~ R^2 ||W_V^T a||^2 (m/2 ||R A^T b + u||^2 + R^2 ||A a||^2)``
(:func:`_predicted_norm` refines it with the attention the queries keep on each other), which
:func:`structured_starts` maximises over unit ``a, b`` by batched Riemannian Adam with the tie
imposed exactly.  The best candidates (with Castin et al.'s input, random inputs and a radius
continuation from R/4) are polished by a batched L-BFGS ascent of the local Jacobian norm
``sigma_max(Df(X))`` in smooth coordinates of the ball: power iteration (JVP/VJP) for the top
right singular vector E, and ``grad_X ||Df(X) E||`` by a second-order (reverse-over-forward)
formula.  A head sees a token only through ``x W_Q``, ``x W_K``, ``x W_V``, so a single head
is searched in the orthonormal basis of that span (at most ``3 d_k`` coordinates per token)
without loss, and its power iteration runs in output space through ``n x n`` Gram sandwiches
(:meth:`_Linearization._gram_step`).  For a multi-head layer every head contributes its
structured inputs, a greedy step ties further heads at the same input (:class:`_TieSurrogate`),
and the polish runs on the layer map.  The best candidate's value is recomputed from scratch
in float64 with :mod:`lipbound.numeric.attention`, at a point projected into the closed ball
with a small inward margin.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, final

import numpy as np

from ..errors import AssumptionError, WeightsError
from .attention import Head, Layer, jacobian_norm, layer_forward, layer_jvp, layer_vjp, self_forward, \
    self_jvp, self_vjp

__all__ = ["Witness", "AttentionKernel", "jacobian_norms", "search_witness", "naive_ascent",
           "castin_adversarial", "structured_starts", "local_jacobian_norm", "in_ball",
           "project_to_ball", "single_threaded_blas", "WITNESS_FORMAT"]

#: Version tag written into every witness file.
WITNESS_FORMAT = "lipbound-witness/1"
KINDS = ("jacobian", "secant")
_NAIVE_LR = 0.003
NORMS = ("fro", "2,1")
#: Inputs per block in :func:`jacobian_norms` (measured fastest: the block's arrays stay in cache).
CHUNK = 128
#: Tokens are pulled this far (relative) inside the sphere, so rounding never puts them outside.
INWARD_MARGIN = 1e-9


# ---------------------------------------------------------------------------------------------
# The record
# ---------------------------------------------------------------------------------------------
@final
@dataclass(frozen=True, eq=False)
class Witness:
    """An input where an attention map stretches by ``value``: a certified lower bound on
    its Lipschitz constant over the ball domain (once :func:`~lipbound.numeric.recheck.recheck`
    has confirmed it).

    Attributes
    ----------
    kind : {"jacobian", "secant"}
        ``"jacobian"``: ``value = ||Df(X)[E]||_F`` with ``||E||_F = 1`` (Frobenius norms);
        ``"secant"``: ``value = ||f(X) - f(Y)|| / ||X - Y||`` in the norm ``norm``.
    X : ndarray, shape (n, d)
        The input (tokens are rows).
    E : ndarray, shape (n, d), or None
        The direction (kind "jacobian").
    Y : ndarray, shape (n, d), or None
        The second input (kind "secant").
    value : float
        The value claimed (computed in float64).
    norm : {"fro", "2,1"}
        Norm on inputs and outputs: Frobenius, or ``||X||_{2,1} = sum_i ||x_i||`` (secant only).
    radius, center : float, ndarray of shape (d,)
        The domain: every token satisfies ``||x_i - center|| <= radius``.
    seed : int
    method : str
        How it was found (e.g. ``"structured+polish"``, ``"naive-ascent"``, ``"castin-adversarial"``).
    model : str
        The model the weights come from ("" if not named).
    layer, head : int or None
        Which layer and head; ``head=None`` means the whole multi-head layer.
    score : str
        The score function (``"dot"``, ``"l2"``, ``"cosine"``).
    residual : bool
        Whether the map is ``X + Att(X)``.
    created : str
        ISO 8601 time stamp (UTC).
    details : dict
        JSON-serialisable extras (the candidate family, iterations, ...).
    """

    kind: str
    X: np.ndarray
    value: float
    radius: float
    center: np.ndarray
    E: np.ndarray | None = None
    Y: np.ndarray | None = None
    norm: str = "fro"
    seed: int = 0
    method: str = ""
    model: str = ""
    layer: int | None = None
    head: int | None = None
    score: str = "dot"
    residual: bool = False
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    details: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise AssumptionError("kind", f"one of {KINDS}", repr(self.kind), "use 'jacobian' or 'secant'")
        if self.norm not in NORMS:
            raise AssumptionError("norm", f"one of {NORMS}", repr(self.norm), "use 'fro' or '2,1'")
        if self.kind == "jacobian" and self.norm != "fro":
            raise AssumptionError("norm", "'fro' for a jacobian witness", repr(self.norm),
                                  "state (2,1)-norm witnesses as secant pairs")
        X = _finite_matrix("X", self.X)
        object.__setattr__(self, "X", X)
        other = "E" if self.kind == "jacobian" else "Y"
        if getattr(self, other) is None:
            raise AssumptionError(other, f"an array of shape {X.shape} for a {self.kind} witness", "None",
                                  f"pass {other}=...")
        second = _finite_matrix(other, getattr(self, other))
        if second.shape != X.shape:
            raise WeightsError(other, f"shape {X.shape} like X", f"shape {second.shape}",
                               "X and its companion must have the same number of tokens and width")
        object.__setattr__(self, other, second)
        center = np.zeros(X.shape[1]) if self.center is None else np.array(self.center, dtype=float)
        if center.shape != (X.shape[1],) or not np.all(np.isfinite(center)):
            raise WeightsError("center", f"a finite vector of shape ({X.shape[1]},)", f"shape {center.shape}",
                               "the centre of the ball has the width of a token")
        center.setflags(write=False)
        object.__setattr__(self, "center", center)
        radius = float(self.radius)
        if not (radius > 0 and math.isfinite(radius)):
            raise AssumptionError("radius", "a finite R > 0", repr(self.radius), "give the ball's radius")
        object.__setattr__(self, "radius", radius)
        value = float(self.value)
        if not math.isfinite(value) or value < 0:
            raise AssumptionError("value", "a finite non-negative number", repr(self.value),
                                  "a witness value is a norm ratio")
        object.__setattr__(self, "value", value)
        json.dumps(self.details)  # fails early on non-serialisable extras

    @property
    def n(self) -> int:
        return self.X.shape[0]

    @property
    def d(self) -> int:
        return self.X.shape[1]

    @property
    def target(self) -> str:
        """A short name of the map: ``"model layer 0 head 3 (dot)"``."""
        where = "" if self.layer is None else f" layer {self.layer}"
        which = " (all heads)" if self.head is None else f" head {self.head}"
        extra = ", residual" if self.residual else ""
        return f"{self.model or 'unnamed model'}{where}{which} ({self.score}{extra})"

    def in_domain(self) -> bool:
        """Float check of ``||x_i - c|| <= R`` (and for ``Y``); the exact check is in
        :func:`lipbound.numeric.recheck.recheck`."""
        ok = bool(np.all(in_ball(self.X, self.center, self.radius)))
        if self.Y is not None:
            ok = ok and bool(np.all(in_ball(self.Y, self.center, self.radius)))
        return ok

    def metadata(self) -> dict:
        return {"format": WITNESS_FORMAT, "kind": self.kind, "value": self.value, "value_hex": self.value.hex(),
                "norm": self.norm, "radius": self.radius, "radius_hex": self.radius.hex(), "seed": self.seed,
                "method": self.method, "model": self.model, "layer": self.layer, "head": self.head,
                "score": self.score, "residual": self.residual, "created": self.created,
                "details": self.details, "n": self.n, "d": self.d}

    def save(self, path: str | Path) -> Path:
        """Write an ``.npz`` file: arrays ``X``, ``E`` or ``Y``, ``center`` (float64) and
        ``metadata`` (a JSON string as a unicode array).  Nothing is pickled.  Returns the path
        (``.npz`` is appended when missing, as numpy does)."""
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
        arrays = {"X": self.X, "center": self.center, "metadata": np.array(json.dumps(self.metadata()))}
        arrays["E" if self.kind == "jacobian" else "Y"] = self.E if self.kind == "jacobian" else self.Y
        with open(path, "wb") as handle:
            np.savez(handle, **arrays)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Witness":
        """Read a file written by :meth:`save` (``np.load(..., allow_pickle=False)``)."""
        path = Path(path)
        if not path.is_file():
            raise WeightsError(str(path), "an existing witness file (.npz)", "no such file",
                               "check the path (Witness.save appends .npz)")
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {key: data[key] for key in data.files}
        except (ValueError, OSError) as error:
            raise WeightsError(str(path), "a witness .npz written by Witness.save without pickled objects",
                               f"an unreadable file ({error})", "re-create the witness with Witness.save") from None
        if "metadata" not in arrays or "X" not in arrays or "center" not in arrays:
            raise WeightsError(str(path), "arrays X, center and metadata", f"arrays {sorted(arrays)}",
                               "this is not a lipbound witness file")
        try:
            meta = json.loads(str(arrays["metadata"][()]))
        except (json.JSONDecodeError, TypeError, IndexError) as error:
            raise WeightsError(str(path), "JSON metadata", f"unparsable metadata ({error})",
                               "re-create the witness with Witness.save") from None
        if meta.get("format") != WITNESS_FORMAT:
            raise WeightsError(str(path), f"format {WITNESS_FORMAT!r}", repr(meta.get("format")),
                               "re-create the witness with this version of lipbound")
        kind = meta["kind"]
        second = "E" if kind == "jacobian" else "Y"
        if second not in arrays:
            raise WeightsError(str(path), f"an array {second} for a {kind} witness", f"arrays {sorted(arrays)}",
                               "the file is incomplete; re-create it")
        return cls(kind=kind, X=arrays["X"], E=arrays.get("E"), Y=arrays.get("Y"),
                   value=float.fromhex(meta["value_hex"]), norm=meta["norm"],
                   radius=float.fromhex(meta["radius_hex"]), center=arrays["center"], seed=int(meta["seed"]),
                   method=meta["method"], model=meta["model"], layer=meta["layer"], head=meta["head"],
                   score=meta["score"], residual=bool(meta["residual"]), created=meta["created"],
                   details=meta.get("details", {}))


def _finite_matrix(name: str, value) -> np.ndarray:
    array = np.array(value, dtype=float)
    if array.ndim != 2 or array.shape[0] < 1:
        raise WeightsError(name, "a matrix of shape (n, d), tokens as rows", f"shape {array.shape}",
                           "pass one input, not a batch")
    if not np.all(np.isfinite(array)):
        raise WeightsError(name, "finite entries", "NaN or Inf", "a witness is a concrete finite input")
    array.setflags(write=False)
    return array


# ---------------------------------------------------------------------------------------------
# The ball
# ---------------------------------------------------------------------------------------------
def in_ball(X: np.ndarray, center: np.ndarray, radius: float) -> np.ndarray:
    """Float test ``||x_i - c|| <= R`` for every token; returns a boolean per input of the batch."""
    X = np.asarray(X, dtype=float)
    norms = np.linalg.norm(X - center, axis=-1)
    return np.all(norms <= radius, axis=-1)


def project_to_ball(X: np.ndarray, radius: float, center: np.ndarray | float = 0.0,
                    margin: float = INWARD_MARGIN) -> np.ndarray:
    """Euclidean projection of every token onto the ball of radius ``R (1 - margin)`` about ``c``.

    ``X`` has shape (..., n, d).  The inward margin keeps rounding from pushing a token out.
    """
    shifted = np.asarray(X, dtype=float) - center
    norms = np.linalg.norm(shifted, axis=-1, keepdims=True)
    limit = radius * (1.0 - margin)
    scale = np.where(norms > limit, limit / np.where(norms > 0, norms, 1.0), 1.0)
    return shifted * scale + center


# ---------------------------------------------------------------------------------------------
# A batched kernel: forward, JVP, VJP and the second-order term, for dot-product heads/layers
# ---------------------------------------------------------------------------------------------
@final
class AttentionKernel:
    """Dot-product attention (one head, or a multi-head layer) prepared for batched search.

    The tokens are taken in *working coordinates* ``x' = (x - c) U`` (``U`` an orthonormal basis
    of the span of the head's ``W_Q, W_K, W_V`` columns when ``reduce``; the identity
    otherwise), so that the domain becomes the ball of radius R about 0 and a single head
    costs ``3 d_k`` instead of ``d`` coordinates per token.  Moving a token orthogonally to
    that span changes nothing but its norm, so the search loses nothing.

    All projections go through one fused GEMM over the whole batch:
    ``[Q | K | V] = X' W + b`` with ``W = U^T [W_Q^1..W_Q^H | W_K^1..W_K^H | W_V^1..W_V^H]``,
    ``b = [b_Q | b_K | b_V] + c W``.

    Parameters
    ----------
    target : Head or Layer
        Dot-product score (causal masks allowed); every head of a layer must have the same shapes.
    center : ndarray of shape (d,), optional
        Centre of the ball (default 0).
    reduce : bool
        Work in the span of the head's projections (ignored for residual layers, whose identity
        sees every direction).
    """

    def __init__(self, target: Head | Layer, center: np.ndarray | None = None, reduce: bool = True):
        heads, W_O, residual = _heads_of(target)
        if any(h.score != "dot" for h in heads):
            raise AssumptionError("target", "dot-product heads for the batched kernel",
                                  f"scores {sorted({h.score for h in heads})}",
                                  "use the generic path (search_witness handles other scores)")
        first = heads[0]
        if any((h.d, h.d_k, h.d_v, h.causal) != (first.d, first.d_k, first.d_v, first.causal) for h in heads):
            raise WeightsError("target.heads", "heads of equal shapes and masking", "mixed heads",
                               "split the layer into separate heads")
        self.target = target
        self.H, self.d, self.d_k, self.d_v = len(heads), first.d, first.d_k, first.d_v
        self.causal = first.causal
        self.residual = residual
        self.W_O = W_O
        self.center = np.zeros(self.d) if center is None else np.asarray(center, dtype=float)
        if self.center.shape != (self.d,):
            raise WeightsError("center", f"shape ({self.d},)", f"shape {self.center.shape}",
                               "the centre has the width of a token")
        W = np.concatenate([h.W_Q for h in heads] + [h.W_K for h in heads] + [h.W_V for h in heads], axis=1)
        bias = np.concatenate([h.b_Q for h in heads] + [h.b_K for h in heads] + [h.b_V for h in heads])
        self.basis = None
        if reduce and not residual:
            left, singular, _ = np.linalg.svd(W, full_matrices=False)
            rank = int(np.sum(singular > singular[0] * 1e-12)) if singular.size and singular[0] > 0 else 0
            if 0 < rank < self.d:
                self.basis = left[:, :rank]
        self.W = W if self.basis is None else self.basis.T @ W
        self.bias = bias + self.center @ W
        self.WT = np.ascontiguousarray(self.W.T)
        self.scale = 1.0 / math.sqrt(self.d_k)
        self.width = self.W.shape[1]
        # a single head: power iteration on Df Df^T in output space, through Gram blocks of W
        self.gram = None
        if self.H == 1 and W_O is None and not residual:
            dk = self.d_k
            W_Q, W_K, W_V = self.W[:, :dk], self.W[:, dk:2 * dk], self.W[:, 2 * dk:]
            self.gram = {"QQ": W_Q.T @ W_Q, "KQ": W_K.T @ W_Q, "KK": W_K.T @ W_K, "QV": W_Q.T @ W_V,
                         "KV": W_K.T @ W_V, "VV": W_V.T @ W_V}

    # coordinates ---------------------------------------------------------------------------
    @property
    def d_in(self) -> int:
        """Working coordinates per token."""
        return self.d if self.basis is None else self.basis.shape[1]

    def to_work(self, X: np.ndarray) -> np.ndarray:
        shifted = np.asarray(X, dtype=float) - self.center
        return shifted if self.basis is None else shifted @ self.basis

    def from_work(self, Xw: np.ndarray) -> np.ndarray:
        return (Xw if self.basis is None else Xw @ self.basis.T) + self.center

    def direction_from_work(self, Ew: np.ndarray) -> np.ndarray:
        return Ew if self.basis is None else Ew @ self.basis.T

    def head_weights(self, h: int) -> tuple[np.ndarray, ...]:
        """``(W_Q, W_K, W_V, b_Q, b_K, b_V)`` of head ``h`` in working coordinates."""
        H, dk, dv = self.H, self.d_k, self.d_v
        cols = [slice(h * dk, (h + 1) * dk), slice(H * dk + h * dk, H * dk + (h + 1) * dk),
                slice(2 * H * dk + h * dv, 2 * H * dk + (h + 1) * dv)]
        return tuple(self.W[:, c] for c in cols) + tuple(self.bias[c] for c in cols)

    # evaluation ------------------------------------------------------------------------------
    def linearize(self, Xw: np.ndarray) -> "_Linearization":
        """The map and its derivatives at a batch ``Xw`` of shape (b, n, d_in)."""
        return _Linearization(self, np.asarray(Xw, dtype=float))

    def forward(self, Xw: np.ndarray) -> np.ndarray:
        return self.linearize(Xw).F


@final
class _Linearization:
    """Projections and attention weights at a batch of inputs, reused by JVPs, VJPs and the
    second-order term.  Shapes: ``Q, K`` (b, H, n, d_k), ``V`` (b, H, n, d_v), ``P`` (b, H, n, n)."""

    def __init__(self, kernel: AttentionKernel, Xw: np.ndarray):
        self.k = kernel
        self.X = Xw
        self.b, self.n = Xw.shape[0], Xw.shape[1]
        proj = (Xw.reshape(-1, kernel.d_in) @ kernel.W + kernel.bias).reshape(self.b, self.n, kernel.width)
        # contiguous copies: every JVP/VJP multiplies by them again
        self.Q, self.K, self.V = (np.ascontiguousarray(M) for M in self._split(proj))
        S = kernel.scale * (self.Q @ np.swapaxes(self.K, -1, -2))
        if kernel.causal:
            S = np.where(np.tril(np.ones((self.n, self.n), dtype=bool)), S, -np.inf)
        S = S - np.max(S, axis=-1, keepdims=True)
        P = np.exp(S)
        self.P = P / np.sum(P, axis=-1, keepdims=True)
        self.PT = np.ascontiguousarray(np.swapaxes(self.P, -1, -2))
        # scaled and transposed copies reused by every JVP/VJP (c = 1/sqrt(d_k))
        self.Pc = kernel.scale * self.P
        self.Qc = kernel.scale * self.Q
        self.KTc = np.ascontiguousarray(kernel.scale * np.swapaxes(self.K, -1, -2))
        self.VT = np.ascontiguousarray(np.swapaxes(self.V, -1, -2))
        self._F = None

    # layout helpers ----------------------------------------------------------------------------
    def _split(self, Z: np.ndarray):
        k, b, n = self.k, Z.shape[0], Z.shape[1]
        H, dk, dv = k.H, k.d_k, k.d_v
        Q = Z[..., :H * dk].reshape(b, n, H, dk).transpose(0, 2, 1, 3)
        K = Z[..., H * dk:2 * H * dk].reshape(b, n, H, dk).transpose(0, 2, 1, 3)
        V = Z[..., 2 * H * dk:].reshape(b, n, H, dv).transpose(0, 2, 1, 3)
        return Q, K, V

    def _merge(self, gQ, gK, gV) -> np.ndarray:
        b, n = gQ.shape[0], gQ.shape[2]
        return np.concatenate([g.transpose(0, 2, 1, 3).reshape(b, n, -1) for g in (gQ, gK, gV)], axis=-1)

    def _heads_out(self, Fh: np.ndarray) -> np.ndarray:
        """(b, H, n, d_v) -> the map's output (b, n, d_out), without bias."""
        b, H, n, dv = Fh.shape
        merged = Fh.transpose(0, 2, 1, 3).reshape(b, n, H * dv)
        return merged if self.k.W_O is None else merged @ self.k.W_O

    def _heads_in(self, G: np.ndarray) -> np.ndarray:
        """Cotangent of the output (b, n, d_out) -> per head (b, H, n, d_v)."""
        if self.k.W_O is not None:
            G = G @ self.k.W_O.T
        b, n = G.shape[0], G.shape[1]
        return G.reshape(b, n, self.k.H, self.k.d_v).transpose(0, 2, 1, 3)

    def _work_to_proj(self, E: np.ndarray) -> np.ndarray:
        return (E.reshape(-1, self.k.d_in) @ self.k.W).reshape(E.shape[0], E.shape[1], self.k.width)

    def _proj_to_work(self, Z: np.ndarray) -> np.ndarray:
        return (Z.reshape(-1, self.k.width) @ self.k.WT).reshape(Z.shape[0], Z.shape[1], self.k.d_in)

    # the map -------------------------------------------------------------------------------
    @property
    def F(self) -> np.ndarray:
        """``f(X)`` (b, n, d_out), output bias omitted (it cancels in every difference)."""
        if self._F is None:
            out = self._heads_out(self.P @ self.V)
            self._F = out + self.X if self.k.residual else out
        return self._F

    def jvp_proj(self, Z: np.ndarray) -> np.ndarray:
        """``Df[E]`` from the projected tangent ``Z = E W`` (b, n, width)."""
        dQ, dK, dV = self._split(Z)
        dS = dQ @ self.KTc
        dS += self.Qc @ np.swapaxes(dK, -1, -2)
        dS -= np.sum(self.P * dS, axis=-1, keepdims=True)
        dS *= self.P                                           # dP = P o (dS - rowsum(P o dS))
        out = dS @ self.V
        out += self.P @ dV
        return self._heads_out(out)

    def vjp_proj(self, G: np.ndarray) -> np.ndarray:
        """``Df^T[G]`` in projection space (b, n, width); ``Df^T[G] = (that) W^T``."""
        Gh = self._heads_in(G)
        gS = Gh @ self.VT
        gS -= np.sum(self.P * gS, axis=-1, keepdims=True)
        gS *= self.Pc                                          # c P o (gP - rowsum(P o gP))
        return self._merge(gS @ self.K, np.swapaxes(gS, -1, -2) @ self.Q, self.PT @ Gh)

    def jvp(self, E: np.ndarray) -> np.ndarray:
        """``Df(X)[E]``, E of shape (b, n, d_in)."""
        out = self.jvp_proj(self._work_to_proj(E))
        return out + E if self.k.residual else out

    def vjp(self, G: np.ndarray) -> np.ndarray:
        """``Df(X)^T[G]``, G of shape (b, n, d_out)."""
        out = self._proj_to_work(self.vjp_proj(G))
        return out + G if self.k.residual else out

    def curvature(self, E: np.ndarray, G: np.ndarray) -> np.ndarray:
        """``grad_X <G, Df(X)[E]>`` with E, G held fixed, shape (b, n, d_in).

        Reverse mode through the JVP (``S = c Q K^T``, ``P = softmax(S)``)::

            dS  = c (dQ K^T + Q dK^T),  m = rowsum(P o dS),  dP = P o (dS - m),  dF = dP V + P dV
            gdP = G V^T,  a = rowsum(P o gdP),  gdS = P o (gdP - a)
            gP  = G dV^T + gdP o (dS - m) - a o dS,  gS = P o (gP - rowsum(P o gP))
            gQ  = c (gdS dK + gS K),  gK = c (gdS^T dQ + gS^T Q),  gV = dP^T G
            grad = [gQ | gK | gV] W^T

        With ``G = Df[E] / ||Df[E]||`` and E the top right singular vector this is the gradient
        of the local Jacobian norm ``sigma_max(Df(X))`` (envelope theorem).
        """
        dQ, dK, dV = self._split(self._work_to_proj(E))
        Gh = self._heads_in(G)
        c, P = self.k.scale, self.P
        KT, dKT = np.swapaxes(self.K, -1, -2), np.swapaxes(dK, -1, -2)
        dS = c * (dQ @ KT + self.Q @ dKT)
        m = np.sum(P * dS, axis=-1, keepdims=True)
        dP = P * (dS - m)
        gdP = Gh @ np.swapaxes(self.V, -1, -2)
        a = np.sum(P * gdP, axis=-1, keepdims=True)
        gdS = P * (gdP - a)
        gP = Gh @ np.swapaxes(dV, -1, -2) + gdP * (dS - m) - a * dS
        gS = P * (gP - np.sum(P * gP, axis=-1, keepdims=True))
        gQ = c * (gdS @ dK + gS @ self.K)
        gK = c * (np.swapaxes(gdS, -1, -2) @ dQ + np.swapaxes(gS, -1, -2) @ self.Q)
        gV = np.swapaxes(dP, -1, -2) @ Gh
        return self._proj_to_work(self._merge(gQ, gK, gV))

    # power iteration ---------------------------------------------------------------------------
    def top_singular(self, start: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """See :func:`_top_singular`."""
        return _top_singular(self, start, steps)

    def _gram_step(self, G: np.ndarray) -> np.ndarray:
        """``Df Df^T G`` for a single head, G of shape (b, n, d_v), in O(n^2 (n + d_v)) per input.

        ``Df^T G = [c gS K | c gS^T Q | P^T G] W^T`` with ``gS = P o (G V^T - rowsum(P o G V^T))``;
        applying ``Df`` needs only ``Z = (Df^T G) W``, i.e. the Gram blocks ``Gamma_XY = W_X^T W_Y``.
        Sandwiched with the projections they give, once per X, ``M_1 = K Gamma_QQ K^T``,
        ``M_2 = Q Gamma_KQ K^T``, ``M_3 = Q Gamma_KK Q^T``, ``N_2 = Q Gamma_KV``, ``N_3 = K Gamma_QV``, and
        with ``L = [gS | gS^T | P^T G]`` (n x (2n + d_v)):

            dS = c (L [c M_1; c M_2; N_3^T] + [c M_2 | c M_3 | N_2] L'),   L' = [gS^T; gS; G^T P]
            dV = L [c N_3; c N_2; Gamma_VV]
            Df Df^T G = P o (dS - rowsum(P o dS)) V + P dV.
        """
        if not hasattr(self, "_sandwich"):
            g, c = self.k.gram, self.k.scale
            Q, K = self.Q[:, 0], self.K[:, 0]
            KT, QT = np.swapaxes(K, -1, -2), np.swapaxes(Q, -1, -2)
            M1, M2, M3 = K @ g["QQ"] @ KT, Q @ g["KQ"] @ KT, Q @ g["KK"] @ QT
            N2, N3 = Q @ g["KV"], K @ g["QV"]
            right = np.concatenate([np.concatenate([c * M1, c * N3], axis=2),
                                    np.concatenate([c * M2, c * N2], axis=2)], axis=1)
            left = np.concatenate([c * M2, c * M3, N2], axis=2)
            self._sandwich = (np.ascontiguousarray(right), np.ascontiguousarray(left),
                              np.ascontiguousarray(np.swapaxes(N3, -1, -2)), self.P[:, 0], self.PT[:, 0],
                              self.V[:, 0], self.VT[:, 0])
        right, left, N3T, P, PT, V, VT = self._sandwich
        c = self.k.scale
        b, n, dv = G.shape
        gS = G @ VT
        gS -= np.sum(P * gS, axis=-1, keepdims=True)
        gS *= P
        gST = np.swapaxes(gS, -1, -2)
        Gv = PT @ G
        both = np.concatenate([gS, gST], axis=2) @ right                 # [dS part | dV part]
        dS = both[..., :n]
        dS += Gv @ N3T
        dS += left @ np.concatenate([gST, gS, np.swapaxes(Gv, -1, -2)], axis=1)
        dS *= c
        dS -= np.sum(P * dS, axis=-1, keepdims=True)
        dS *= P
        dV = both[..., n:]
        dV += (Gv.reshape(b * n, dv) @ self.k.gram["VV"]).reshape(b, n, dv)
        out = dS @ V
        out += P @ dV
        return out


@contextlib.contextmanager
def single_threaded_blas():
    """Run numpy's bundled OpenBLAS on one thread inside the block (restored afterwards).

    The search multiplies many small matrices; handing each to a second thread costs more than
    it saves (measured 40x slower for (64, 96) @ (96, 96) on a busy 2-core machine).  Does
    nothing when the BLAS library exposes no thread control.
    """
    control = _blas_thread_control()
    if control is None:
        yield
        return
    getter, setter = control
    before = getter()
    setter(1)
    try:
        yield
    finally:
        setter(before)


def _one_blas_thread(function: Callable) -> Callable:
    @functools.wraps(function)
    def wrapped(*args, **kwargs):
        with single_threaded_blas():
            return function(*args, **kwargs)
    return wrapped


_BLAS_CONTROL: list = []


def _blas_thread_control():
    if not _BLAS_CONTROL:
        found = None
        try:
            import ctypes
            with open("/proc/self/maps") as handle:
                libraries = sorted({line.split()[-1] for line in handle if "openblas" in line.lower()})
            for library in libraries:
                lib = ctypes.CDLL(library)
                for suffix in ("scipy_openblas_{}_num_threads64_", "openblas_{}_num_threads64_",
                               "openblas_{}_num_threads"):
                    getter = getattr(lib, suffix.format("get"), None)
                    setter = getattr(lib, suffix.format("set"), None)
                    if getter is not None and setter is not None:
                        getter.restype = ctypes.c_int
                        found = (getter, lambda count, _set=setter: _set(ctypes.c_int(count)))
                        break
                if found:
                    break
        except (OSError, ValueError):
            found = None
        _BLAS_CONTROL.append(found)
    return _BLAS_CONTROL[0]


def _unit(E: np.ndarray) -> np.ndarray:
    size = np.sqrt(np.sum(E * E, axis=tuple(range(1, E.ndim)), keepdims=True))
    return E / np.where(size > 0, size, 1.0)


def _heads_of(target: Head | Layer):
    if isinstance(target, Head):
        return (target,), None, False
    if isinstance(target, Layer):
        return tuple(target.heads), target.W_O, bool(target.residual)
    raise WeightsError("target", "a Head or a Layer (lipbound.numeric.attention)", type(target).__name__,
                       "build one with Head(W_Q, W_K, W_V, ...) or ModelWeights.layers[i].as_layer()")


@final
class _GenericKernel:
    """Any :class:`Head` or :class:`Layer` (l2, cosine scores) through
    :mod:`lipbound.numeric.attention`; the second-order term by a central difference of VJPs:
    ``grad_X <G, Df(X)[E]> = d/dt Df(X + tE)^T[G] at t = 0`` (symmetry of the Hessian of
    ``<G, f>``)."""

    gram = None

    def __init__(self, target: Head | Layer, center: np.ndarray | None = None):
        heads, _, residual = _heads_of(target)
        self.target = target
        self.d = heads[0].d
        self.center = np.zeros(self.d) if center is None else np.asarray(center, dtype=float)
        self.basis = None
        self.residual = residual
        if isinstance(target, Head):
            self._forward = lambda X: self_forward(target, X)
            self._jvp = lambda X, E: self_jvp(target, X, E)[1]
            self._vjp = lambda X, G: self_vjp(target, X, G)
        else:
            self._forward = lambda X: layer_forward(target, X)
            self._jvp = lambda X, E: layer_jvp(target, X, E)[1]
            self._vjp = lambda X, G: layer_vjp(target, X, G)

    @property
    def d_in(self) -> int:
        return self.d

    def to_work(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(X, dtype=float) - self.center

    def from_work(self, Xw: np.ndarray) -> np.ndarray:
        return Xw + self.center

    def direction_from_work(self, Ew: np.ndarray) -> np.ndarray:
        return Ew

    def linearize(self, Xw: np.ndarray) -> "_GenericLinearization":
        return _GenericLinearization(self, np.asarray(Xw, dtype=float))

    def forward(self, Xw: np.ndarray) -> np.ndarray:
        return self._forward(Xw + self.center)


@final
class _GenericLinearization:
    def __init__(self, kernel: _GenericKernel, Xw: np.ndarray):
        self.k, self.X = kernel, Xw
        self._full = Xw + kernel.center

    @property
    def F(self) -> np.ndarray:
        return self.k._forward(self._full)

    def jvp(self, E):
        return self.k._jvp(self._full, E)

    def vjp(self, G):
        return self.k._vjp(self._full, G)

    def curvature(self, E, G):
        scale = np.sqrt(np.sum(self._full ** 2, axis=(1, 2), keepdims=True)) + 1.0
        h = 1e-5 * scale
        plus, minus = self.k._vjp(self._full + h * E, G), self.k._vjp(self._full - h * E, G)
        return (plus - minus) / (2 * h)

    def top_singular(self, start: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return _top_singular(self, start, steps)


def _top_singular(lin, start: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``steps`` rounds of power iteration from ``start`` (b, n, d_in) at a linearisation.

    Returns ``(sigma, E, JE)``: unit directions E, ``JE = Df[E]`` and ``sigma = ||JE||_F``, so
    each sigma is a lower bound on the local Jacobian norm whatever the convergence.  A single
    head iterates ``Df Df^T`` in output space (:meth:`_Linearization._gram_step`), other maps
    ``Df^T Df`` in token space.
    """
    E = _unit(start)
    if getattr(lin.k, "gram", None) is not None and steps > 0:
        G = lin.jvp(E)
        for _ in range(steps):
            G = lin._gram_step(G)
            G *= (1.0 / np.maximum(np.sqrt(np.einsum("bij,bij->b", G, G)), 1e-300))[:, None, None]
        E = _unit(lin.vjp(G))
    else:
        for _ in range(steps):
            E = _unit(lin.vjp(lin.jvp(E)))
    JE = lin.jvp(E)
    return np.sqrt(np.einsum("bij,bij->b", JE, JE)), E, JE


def _kernel(target: Head | Layer, center: np.ndarray | None, reduce: bool = True):
    heads, _, _ = _heads_of(target)
    first = heads[0]
    uniform = all((h.d, h.d_k, h.d_v, h.causal) == (first.d, first.d_k, first.d_v, first.causal) for h in heads)
    if all(h.score == "dot" for h in heads) and uniform:
        return AttentionKernel(target, center, reduce=reduce)
    return _GenericKernel(target, center)


@_one_blas_thread
def jacobian_norms(kernel: AttentionKernel, Xw: np.ndarray, steps: int = 20, seed: int = 0,
                   directions: bool = True):
    """Batched local Jacobian norms by power iteration with a fixed number of steps.

    Parameters
    ----------
    kernel : AttentionKernel
    Xw : ndarray, shape (b, n, d_in)
        Inputs in the kernel's working coordinates (``kernel.to_work(X)``).
    steps : int
        Power-iteration steps, each one application of ``Df Df^T`` (a JVP after a VJP).
    directions : bool
        Also return the unit input directions (one more VJP in token space).

    Returns
    -------
    sigma : ndarray (b,)
        ``||Df(X_b)[E_b]||_F`` for unit directions ``E_b = Df^T G_b / ||Df^T G_b||`` (lower bounds
        on the local norm), computed as ``||Df Df^T G|| / <G, Df Df^T G>^(1/2)``.
    E : ndarray (b, n, d_in), or None
    """
    Xw = np.asarray(Xw, dtype=float)
    rng = np.random.default_rng(seed)
    if kernel.gram is None:
        sigma, E, _ = kernel.linearize(Xw).top_singular(rng.standard_normal(Xw.shape), steps)
        return sigma, (E if directions else None)
    starts = rng.standard_normal((Xw.shape[0], Xw.shape[1], kernel.d_v))
    sigma, E = np.empty(len(Xw)), (np.empty(Xw.shape) if directions else None)
    for first in range(0, len(Xw), CHUNK):     # chunks keep the working set in cache
        part = slice(first, first + CHUNK)
        lin = kernel.linearize(Xw[part])
        G = starts[part]
        for _ in range(steps):
            G = lin._gram_step(G)
            G *= (1.0 / np.maximum(np.sqrt(np.einsum("bij,bij->b", G, G)), 1e-300))[:, None, None]
        JJG = lin._gram_step(G)
        sigma[part] = np.sqrt(np.einsum("bij,bij->b", JJG, JJG)
                              / np.maximum(np.einsum("bij,bij->b", G, JJG), 1e-300))
        if directions:
            E[part] = _unit(lin.vjp(G))
    return sigma, E


# ---------------------------------------------------------------------------------------------
# Final values, recomputed from scratch with lipbound.numeric.attention
# ---------------------------------------------------------------------------------------------
def _reference_maps(target: Head | Layer):
    if isinstance(target, Head):
        return (lambda X: self_forward(target, X), lambda X, E: self_jvp(target, X, E),
                lambda X, G: self_vjp(target, X, G))
    return (lambda X: layer_forward(target, X), lambda X, E: layer_jvp(target, X, E),
            lambda X, G: layer_vjp(target, X, G))


def local_jacobian_norm(target: Head | Layer, X: np.ndarray, iterations: int = 200,
                        start: np.ndarray | None = None, seed: int = 0) -> tuple[float, np.ndarray]:
    """``(||Df(X)[E]||_F, E)`` with ``||E||_F = 1`` after power iteration, computed with
    :func:`lipbound.numeric.attention.jacobian_norm` (float64, independent of the search kernel)."""
    _, jvp, vjp = _reference_maps(target)
    X = np.asarray(X, dtype=float)[None]
    sigma, E = jacobian_norm(jvp, vjp, X, iterations=iterations, seed=seed,
                             start=None if start is None else np.asarray(start, dtype=float)[None])
    E = E[0] / np.linalg.norm(E[0])
    _, dF = jvp(X, E[None])
    return float(np.linalg.norm(dF[0])), E


def _jacobian_value(target: Head | Layer, X: np.ndarray, E: np.ndarray) -> float:
    """``||Df(X)[E]||_F`` by :mod:`lipbound.numeric.attention` (float64)."""
    _, jvp, _ = _reference_maps(target)
    return float(np.linalg.norm(jvp(X[None], E[None])[1]))


def _secant_value(target: Head | Layer, X: np.ndarray, Y: np.ndarray, norm: str) -> float:
    forward, _, _ = _reference_maps(target)
    diff_out = forward(X[None])[0] - forward(Y[None])[0]
    diff_in = X - Y
    if norm == "fro":
        return float(np.linalg.norm(diff_out) / np.linalg.norm(diff_in))
    return float(np.sum(np.linalg.norm(diff_out, axis=1)) / np.sum(np.linalg.norm(diff_in, axis=1)))


def _inside(X: np.ndarray, center: np.ndarray, radius: float) -> np.ndarray:
    """Project into the ball with the inward margin; shrink again in the (never seen) case that
    rounding left a token outside."""
    X = project_to_ball(X, radius, center)
    margin = INWARD_MARGIN
    while not np.all(np.linalg.norm(X - center, axis=-1) <= radius * (1 - margin / 2)):
        margin *= 4
        X = project_to_ball(X, radius, center, margin=margin)
    return X


# ---------------------------------------------------------------------------------------------
# Structured starting points (dot-product scores)
# ---------------------------------------------------------------------------------------------
@_one_blas_thread
def structured_starts(W_Q: np.ndarray, W_K: np.ndarray, W_V: np.ndarray, b_Q: np.ndarray, radius: float,
                      n: int, count: int = 64, steps: int = 300, margin: float = 10.0,
                      seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Alpha/beta-type inputs for one dot-product head, ball about the origin.

    With ``A = W_Q W_K^T / sqrt(d_k)``, ``u = W_K b_Q / sqrt(d_k)`` and ``m = n - 2`` queries,
    maximises over unit ``a, b`` the predicted Jacobian norm

        phi(a, b)^2 = R^2 ||W_V^T a||^2 ( m/2 ||R A^T b + u||^2 + R^2 ||A a||^2 )

    under the tie ``(R A^T b + u) . a = 0`` (linear in a: imposed exactly by projection after
    every step) and a penalty keeping the query-query score ``R^2 b^T A b + R u . b`` below
    ``-margin``.  Starts: b among the top left singular vectors of A (and random), a the top
    eigenvector of ``W_V W_V^T`` on the tie hyperplane; then Riemannian Adam on both spheres.
    The input is ``x_1 = R a``, ``x_2 = -R a``, ``x_3 = .. = x_n = R b``.

    Parameters
    ----------
    W_Q, W_K, W_V : ndarray, shapes (d, d_k), (d, d_k), (d, d_v)
    b_Q : ndarray, shape (d_k,)
        Query bias with the ball's centre folded in (``b_Q + c W_Q``); the key bias only shifts
        a whole row of scores.
    radius : float
    n : int
        Tokens, at least 3 (two keys and a query).

    Returns
    -------
    X : ndarray, shape (count, n, d)
        Candidate inputs, best first.
    phi : ndarray, shape (count,)
        Predicted Jacobian norms (:func:`_predicted_norm`, which counts the attention the
        queries keep on each other).
    """
    if n < 3:
        raise AssumptionError("n", "at least 3 tokens (two keys and a query)", repr(n),
                              "use random or Castin starts for n = 2")
    d, d_k = W_Q.shape
    R = float(radius)
    A = W_Q @ W_K.T / math.sqrt(d_k)
    u = W_K @ b_Q / math.sqrt(d_k)
    VV, AtA, As = W_V @ W_V.T, A.T @ A, A + A.T
    m = n - 2
    rng = np.random.default_rng(seed)
    left = np.linalg.svd(A)[0][:, :min(8, d)]
    k = left.shape[1]
    coef = rng.standard_normal((count, k)) * np.geomspace(1.0, 0.2, k)
    coef[:min(k, count)] = np.eye(k)[:min(k, count)]
    b = _unit(coef @ left.T)
    b[count // 2:] = _unit(rng.standard_normal((count - count // 2, d)))

    def tie(a, b):
        w = R * b @ A + u
        return _unit(a - (np.sum(w * a, axis=1) / np.maximum(np.sum(w * w, axis=1), 1e-300))[:, None] * w)

    w = _unit(R * b @ A + u)
    on_plane = np.eye(d)[None] - w[:, :, None] * w[:, None, :]
    a = tie(np.linalg.eigh(on_plane @ VV @ on_plane)[1][:, :, -1], b)
    moments = [np.zeros_like(a), np.zeros_like(b)]
    squares = [np.zeros_like(a), np.zeros_like(b)]
    for step in range(1, steps + 1):
        lr = 0.02 * (1 - step / (steps + 1)) + 0.001
        wa = a @ VV
        w = R * b @ A + u
        inner = 0.5 * m * np.sum(w * w, axis=1) + R * R * np.sum((a @ A.T) ** 2, axis=1) + 1e-300
        excess = np.maximum(R * R * np.sum(b * (b @ A.T), axis=1) + R * b @ u + margin, 0.0) / (R * R)
        grad_a = 2 * wa / np.sum(a * wa, axis=1)[:, None] + 2 * R * R * (a @ AtA) / inner[:, None]
        grad_b = m * R * (w @ A.T) / inner[:, None] - 20 * excess[:, None] * (b @ As + u / R)
        for index, (x, g) in enumerate(((a, grad_a), (b, grad_b))):
            g = g - np.sum(g * x, axis=1, keepdims=True) * x        # tangent to the sphere
            moments[index] = 0.9 * moments[index] + 0.1 * g
            squares[index] = 0.999 * squares[index] + 0.001 * g * g
            x[:] = _unit(x + lr * (moments[index] / (1 - 0.9 ** step))
                         / (np.sqrt(squares[index] / (1 - 0.999 ** step)) + 1e-12))
        a[:] = tie(a, b)
    # the queries may do better inside the ball (a weaker pull towards each other): scan their radius
    phi = _predicted_norm(a, b, A, u, W_V, R, m)
    for shrink in np.linspace(0.95, 0.3, 14):
        a_shrunk = tie(a, shrink * b)
        trial = _predicted_norm(a_shrunk, shrink * b, A, u, W_V, R, m)
        better = trial > phi
        a[better], b[better], phi[better] = a_shrunk[better], shrink * b[better], trial[better]
    order = np.argsort(-phi)
    a, b, phi = a[order], b[order], phi[order]
    X = np.empty((count, n, d))
    X[:, 0], X[:, 1] = R * a, -R * a
    X[:, 2:] = R * b[:, None, :]
    return X, phi


def _predicted_norm(a: np.ndarray, b: np.ndarray, A: np.ndarray, u: np.ndarray, W_V: np.ndarray,
                    R: float, m: int) -> np.ndarray:
    """Predicted ``||Df||`` at ``x_1 = R a, x_2 = -R a, x_3..x_{m+2} = R b`` (rows of a, b: a batch).

    The queries attend to (key 1, key 2, the m queries) with the softmax of
    ``(R t, -R t, R^2 b^T A b + R u . b + log m)``, ``t = (R A^T b + u) . a``.  Moving the keys
    by ``+-g / sqrt 2`` along ``w = R A^T b + u`` gives each query ``||w|| ||c||`` with
    ``c = (p_1 (v_1 - vbar) - p_2 (v_2 - vbar)) / sqrt 2`` (beta part); moving a query along
    ``A a`` gives ``2 R ||A a|| ||p_1 p_2 (v_1 - v_2) + ...||``, taken as ``4 p_1 p_2 R^2 ||A a||
    ||W_V^T a||`` (alpha part); the two add in quadrature, the beta part ``sqrt(m)`` times.
    """
    w = R * b @ A + u
    t = R * np.sum(w * a, axis=1)
    scores = np.stack([t, -t, R * R * np.sum(b * (b @ A.T), axis=1) + R * b @ u + math.log(max(m, 1))], axis=1)
    p = np.exp(scores - scores.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    va, vb = R * a @ W_V, R * b @ W_V                 # the value bias cancels in every difference
    mean = p[:, :1] * va - p[:, 1:2] * va + p[:, 2:] * vb
    c = (p[:, :1] * (va - mean) - p[:, 1:2] * (-va - mean)) / math.sqrt(2)
    beta = math.sqrt(m) * np.linalg.norm(c, axis=1) * np.linalg.norm(w, axis=1)
    alpha = 4 * p[:, 0] * p[:, 1] * R * R * np.linalg.norm(a @ A.T, axis=1) * np.linalg.norm(a @ W_V, axis=1)
    return np.sqrt(beta ** 2 + alpha ** 2)


@final
class _TieSurrogate:
    """Predicted Jacobian norm of a multi-head layer at a structured input ``x_1 = R a``,
    ``x_2 = -R a``, ``x_3 = .. = x_n = R b`` (working coordinates), counting the queries' rows
    under key moves ``e_1 = -e_2 = g / sqrt 2``.

    For head h, with ``w_h = R A_h^T b + u_h``, the queries' attention ``p`` on (key 1, key 2,
    the m queries) is the softmax of ``(R w_h . a, -R w_h . a, R^2 b^T A_h b + R u_h . b + log m)``,
    and ``Cov_{j~p}(ds_j, v_j) = (w_h . g) c_h``, ``c_h = (p_1 (v_1 - vbar) - p_2 (v_2 - vbar)) / sqrt 2``.
    The layer's output per query is ``sum_h (w_h . g) W_O^h^T c_h``, so the prediction is
    ``sqrt(m) sigma_max(sum_h W_O^h^T c_h w_h^T)``.  Ties for a set S of heads,
    ``w_h . a = 0`` for h in S, are linear in a: :meth:`tie` imposes them by projection.
    """

    def __init__(self, kernel: "AttentionKernel", radius: float, n: int):
        self.R, self.m = radius, n - 2
        self.heads = []
        for h in range(kernel.H):
            W_Q, W_K, W_V, b_Q, _, b_V = kernel.head_weights(h)
            A = W_Q @ W_K.T / math.sqrt(kernel.d_k)
            W_O = kernel.W_O[h * kernel.d_v:(h + 1) * kernel.d_v] if kernel.W_O is not None else np.eye(kernel.d_v)
            self.heads.append((A, W_K @ b_Q / math.sqrt(kernel.d_k), W_V, b_V, W_O))

    def directions(self, b: np.ndarray) -> list[np.ndarray]:
        return [self.R * b @ A + u for A, u, *_ in self.heads]

    def value(self, a: np.ndarray, b: np.ndarray, directions: list[np.ndarray] | None = None) -> float:
        R, m = self.R, self.m
        directions = self.directions(b) if directions is None else directions
        outputs = []
        for (A, u, W_V, b_V, W_O), w in zip(self.heads, directions):
            t = R * (w @ a)
            scores = np.array([t, -t, R * R * (b @ A @ b) + R * (u @ b) + math.log(m)])
            p = np.exp(scores - scores.max())
            p /= p.sum()
            values = np.stack([R * a @ W_V + b_V, -R * a @ W_V + b_V, R * b @ W_V + b_V])
            mean = p @ values
            outputs.append((p[0] * (values[0] - mean) - p[1] * (values[1] - mean)) / math.sqrt(2) @ W_O)
        # sigma_max(O^T W) for the rank-H matrix sum_h o_h w_h^T, through two thin QRs
        r_out = np.linalg.qr(np.array(outputs).T, mode="r")
        r_dir = np.linalg.qr(np.array(directions).T, mode="r")
        return math.sqrt(m) * float(np.linalg.norm(r_out @ r_dir.T, 2))

    @staticmethod
    def tie(a: np.ndarray, directions: list[np.ndarray]) -> np.ndarray:
        basis, _ = np.linalg.qr(np.array(directions).T)
        return _unit(a - basis @ (basis.T @ a))

    def combine(self, X: np.ndarray) -> np.ndarray:
        """Greedily add heads whose tie raises the prediction (one structured input, (n, d))."""
        a, b = _unit(X[0]), _unit(X[2])
        directions = self.directions(b)
        current, chosen = self.value(a, b, directions), []
        while len(chosen) < len(self.heads) - 1:
            trials = []
            for h in range(len(self.heads)):
                if h not in chosen:
                    tied = self.tie(a, [directions[k] for k in chosen + [h]])
                    trials.append((self.value(tied, b, directions), h))
            best, head = max(trials)
            if best <= current * 1.001:
                break
            current, chosen = best, chosen + [head]
        if not chosen:
            return X
        a = self.tie(a, [directions[k] for k in chosen])
        out = X.copy()
        out[0], out[1] = np.linalg.norm(X[0]) * a, -np.linalg.norm(X[1]) * a
        return out


def _castin_input(W_Q: np.ndarray, W_K: np.ndarray, radius: float, n: int, literal: bool = True) -> np.ndarray:
    """Castin, Ablin, Peyre (2024), code vcastin/how-smooth-is-attention (adversarial_data/toolbox.py).

    They take ``numpy.linalg.eig`` of ``K^T Q / sqrt(k)`` built from torch weights, which is our
    ``A^T = W_K W_Q^T / sqrt(d_k)`` (no symmetrisation), keep the real eigenvalues, and if
    ``lambda_max > -8 lambda_min`` use the top eigenvector u: ``x_1 = R u, x_2..x_n = R u / 2``;
    else the bottom one: ``x_1 = -R u, x_2..x_n = R u``.

    ``literal=True`` does exactly that (a d x d ``eig``).  ``literal=False`` uses that the nonzero
    eigenpairs of ``A^T`` are ``(lambda, W_K y)`` for the eigenpairs ``(lambda, y)`` of the
    d_k x d_k matrix ``W_Q^T W_K / sqrt(d_k)`` and that 0 is an eigenvalue when d > d_k: the same
    eigenvalue choice, with an eigenvector sign that may differ (``eig`` fixes none).
    """
    d, d_k = W_Q.shape
    if literal:
        values, vectors = np.linalg.eig(W_K @ W_Q.T / math.sqrt(d_k))
    else:
        values, small = np.linalg.eig(W_Q.T @ W_K / math.sqrt(d_k))
        vectors = W_K @ small
        if d > d_k:
            values = np.append(values, 0.0)
            vectors = np.concatenate([vectors, np.linalg.svd(W_K.T)[2][-1][:, None]], axis=1)
    real = np.isreal(values)
    if not np.any(real):
        raise AssumptionError("A", "at least one real eigenvalue (Castin et al.'s construction)",
                              "only complex eigenvalues", "use search_witness instead")
    values, vectors = values[real].real, vectors[:, real].real
    use_top = values.max() > -8 * values.min()
    u = vectors[:, int(np.argmax(values) if use_top else np.argmin(values))]
    u = u / np.linalg.norm(u)
    X = np.empty((n, d))
    if use_top:
        X[0], X[1:] = radius * u, radius * u / 2
    else:
        X[0], X[1:] = -radius * u, radius * u
    return X


# ---------------------------------------------------------------------------------------------
# Ascent of the local Jacobian norm
# ---------------------------------------------------------------------------------------------
@final
@dataclass
class _Candidates:
    """A batch of inputs (working coordinates) with their directions and Jacobian-norm estimates."""

    X: np.ndarray
    E: np.ndarray
    sigma: np.ndarray
    family: list[str]


def _evaluate(kernel, Xw: np.ndarray, E: np.ndarray, steps: int):
    """``(sigma, E, grad)``: warm-started power iteration and ``grad_X sigma`` (envelope theorem)."""
    lin = kernel.linearize(Xw)
    sigma, E, JE = lin.top_singular(E, steps)
    return sigma, E, lin.curvature(E, JE / np.maximum(sigma, 1e-300)[:, None, None])


def _start(kernel, Xw: np.ndarray, family: list[str], rng, power_steps: int = 30) -> _Candidates:
    sigma, E, _ = _evaluate(kernel, Xw, rng.standard_normal(Xw.shape), power_steps)
    return _Candidates(Xw, E, sigma, list(family))


def _take(c: _Candidates, index) -> _Candidates:
    index = np.asarray(index, dtype=int)
    return _Candidates(c.X[index], c.E[index], c.sigma[index], [c.family[i] for i in index])


def _join(*parts: _Candidates) -> _Candidates:
    parts = [p for p in parts if len(p.X)]
    return _Candidates(*(np.concatenate([getattr(p, key) for p in parts]) for key in ("X", "E", "sigma")),
                       [f for p in parts for f in p.family])


@final
class _BallChart:
    """Smooth coordinates on the ball: token ``x_i = R s(rho_i) z_i / ||z_i||``, ``s`` the logistic
    function, so that every point of the variables is feasible; tokens on the sphere stay there
    (``s'`` vanishes), tokens inside may grow.  Variables are flattened to (b, n (d + 1))."""

    CAP = 20.0   # logit of 1 - 2e-9: tokens start at most that close to the sphere

    def __init__(self, radius: float, n: int, d: int):
        self.R, self.n, self.d = radius, n, d

    def encode(self, X: np.ndarray) -> np.ndarray:
        norms = np.linalg.norm(X, axis=-1)
        ratio = np.clip(norms / self.R, 1e-6, 1.0)
        rho = np.minimum(np.log(ratio) - np.log1p(-np.minimum(ratio, 1 - 1e-12)), self.CAP)
        Z = np.where(norms[..., None] > 0, X / np.where(norms > 0, norms, 1.0)[..., None], 1.0 / math.sqrt(self.d))
        return np.concatenate([Z.reshape(len(X), self.n * self.d), rho], axis=1)

    def decode(self, v: np.ndarray):
        b = len(v)
        Z = v[:, :self.n * self.d].reshape(b, self.n, self.d)
        rho = v[:, self.n * self.d:]
        size = np.maximum(np.linalg.norm(Z, axis=-1, keepdims=True), 1e-300)
        scale = self.R * (0.5 + 0.5 * np.tanh(0.5 * rho))[..., None]   # logistic, without overflow
        return scale * Z / size, (Z, size, scale, rho)

    def pullback(self, grad: np.ndarray, cache) -> np.ndarray:
        Z, size, scale, rho = cache
        unit = Z / size
        radial = np.sum(grad * unit, axis=-1, keepdims=True)
        gZ = scale * (grad - radial * unit) / size
        s = 0.5 + 0.5 * np.tanh(0.5 * rho)
        grho = radial[..., 0] * self.R * s * (1 - s)
        return np.concatenate([gZ.reshape(len(grad), self.n * self.d), grho], axis=1)


def _polish(kernel, cands: _Candidates, radius: float, deadline: float, max_iterations: int = 10 ** 9,
            power_steps: int = 6, memory: int = 8) -> _Candidates:
    """Batched L-BFGS ascent of ``sigma_max(Df(X))`` in the coordinates of :class:`_BallChart`,
    with a backtracking (Armijo) line search per candidate.  Monotone: each candidate returns its
    best point, never worse than its start."""
    b, n, d = cands.X.shape
    if b == 0:
        return cands
    chart = _BallChart(radius, n, d)
    v = chart.encode(cands.X)
    X, cache = chart.decode(v)
    sigma, E, grad = _evaluate(kernel, X, cands.E, power_steps)
    g = -chart.pullback(grad, cache)                               # we minimise -sigma
    best = _Candidates(cands.X.copy(), cands.E.copy(), cands.sigma.copy(), list(cands.family))
    improved = sigma > best.sigma
    best.X[improved], best.E[improved], best.sigma[improved] = X[improved], E[improved], sigma[improved]
    S = np.zeros((memory, b, v.shape[1]))                          # steps s_k, newest at (count - 1) % memory
    Yg = np.zeros_like(S)                                           # gradient changes y_k
    curv = np.zeros((memory, b))                                    # 1 / (s_k . y_k), 0 for unused pairs
    # initial inverse-Hessian scale: the first step moves the largest coordinate by 0.01
    gamma = 0.01 / np.maximum(np.max(np.abs(g), axis=1), 1e-300)
    count = 0
    active = np.ones(b, dtype=bool)
    for _ in range(max_iterations):
        if time.perf_counter() >= deadline or not np.any(active):
            break
        # two-loop recursion (Nocedal & Wright, Algorithm 7.4), batched over candidates
        q = g.copy()
        alphas = []
        for age in range(min(count, memory)):
            slot = (count - 1 - age) % memory
            alpha = curv[slot] * np.sum(S[slot] * q, axis=1)
            q -= alpha[:, None] * Yg[slot]
            alphas.append((slot, alpha))
        q *= gamma[:, None]
        for slot, alpha in reversed(alphas):
            beta = curv[slot] * np.sum(Yg[slot] * q, axis=1)
            q += (alpha - beta)[:, None] * S[slot]
        p = -q
        slope = np.sum(p * g, axis=1)
        bad = slope >= 0                                            # not a descent direction: use -g
        p[bad] = -g[bad] * (0.01 / np.maximum(np.max(np.abs(g[bad]), axis=1), 1e-300))[:, None]
        # trust region: no coordinate moves by more than 1 (z starts with unit rows; flat regions
        # with vanishing curvature would otherwise ask for enormous steps)
        p *= np.minimum(1.0, 1.0 / np.maximum(np.max(np.abs(p), axis=1), 1e-300))[:, None]
        slope = np.sum(p * g, axis=1)
        # backtracking line search on the active candidates
        t = np.ones(b)
        accepted = np.zeros(b, dtype=bool)
        new_v, new_sigma, new_E, new_g = v.copy(), sigma.copy(), E.copy(), g.copy()
        trying = active.copy()
        for _ in range(12):
            idx = np.flatnonzero(trying)
            if idx.size == 0 or time.perf_counter() >= deadline:
                break
            trial = v[idx] + t[idx, None] * p[idx]
            Xt, cache_t = chart.decode(trial)
            sig_t, E_t, grad_t = _evaluate(kernel, Xt, E[idx], power_steps)
            ok = -sig_t <= -sigma[idx] + 1e-4 * t[idx] * slope[idx]
            done = idx[ok]
            new_v[done], new_sigma[done], new_E[done] = trial[ok], sig_t[ok], E_t[ok]
            new_g[done] = -chart.pullback(grad_t[ok], tuple(c[ok] for c in cache_t))
            better = sig_t > best.sigma[idx]
            keep = idx[better]
            best.X[keep], best.E[keep], best.sigma[keep] = Xt[better], E_t[better], sig_t[better]
            accepted[done] = True
            trying[done] = False
            t[idx[~ok]] *= 0.3
        active &= accepted       # a candidate whose line search failed has converged
        s_new, y_new = new_v - v, new_g - g
        sy = np.sum(s_new * y_new, axis=1)
        slot = count % memory
        good = accepted & (sy > 1e-12 * np.linalg.norm(s_new, axis=1) * np.linalg.norm(y_new, axis=1))
        S[slot] = np.where(good[:, None], s_new, 0.0)
        Yg[slot] = np.where(good[:, None], y_new, 0.0)
        curv[slot] = np.where(good, 1.0 / np.where(good, sy, 1.0), 0.0)
        gamma = np.where(good, sy / np.maximum(np.sum(y_new * y_new, axis=1), 1e-300), gamma)
        count += 1
        v, sigma, E, g = new_v, new_sigma, new_E, new_g
    return best


def _random_tokens(rng, count: int, n: int, d: int, radius: float) -> np.ndarray:
    return radius * _unit(rng.standard_normal((count, n, d)).reshape(count * n, d)).reshape(count, n, d)


def _continuation(kernel, rng, count: int, n: int, radius: float, deadline: float) -> _Candidates:
    """Random inputs on the sphere polished at radius R/4 (softmax not yet saturated), then
    scaled to R/2 and R and polished again."""
    Xw = _random_tokens(rng, count, n, kernel.d_in, radius)
    stages = (0.25, 0.5, 1.0)
    start_time = time.perf_counter()
    cands = None
    for index, fraction in enumerate(stages):
        share = (deadline - start_time) / len(stages)
        stage_deadline = min(deadline, start_time + share * (index + 1))
        if cands is None:
            cands = _start(kernel, Xw * fraction, ["continuation"] * count, rng)
        else:
            cands = _start(kernel, cands.X * (fraction / stages[index - 1]), cands.family, rng)
        cands = _polish(kernel, cands, radius * fraction, stage_deadline)
    return cands


# ---------------------------------------------------------------------------------------------
# Public searches
# ---------------------------------------------------------------------------------------------
def _check_search_args(target, radius, n, budget_seconds, norm, center):
    heads, _, _ = _heads_of(target)
    if not (isinstance(n, (int, np.integer)) and n >= 1):
        raise AssumptionError("n", "an integer number of tokens >= 1", repr(n), "pass n=8, say")
    radius = float(radius)
    if not (radius > 0 and math.isfinite(radius)):
        raise AssumptionError("radius", "a finite R > 0", repr(radius), "give the ball's radius, e.g. the LayerNorm radius")
    if not (budget_seconds > 0):
        raise AssumptionError("budget_seconds", "a positive time budget", repr(budget_seconds), "pass e.g. 10")
    if norm not in NORMS:
        raise AssumptionError("norm", f"one of {NORMS}", repr(norm), "use 'fro' or '2,1'")
    d = heads[0].d
    center = np.zeros(d) if center is None else np.asarray(center, dtype=float)
    if center.shape != (d,) or not np.all(np.isfinite(center)):
        raise WeightsError("center", f"a finite vector of shape ({d},)", f"shape {center.shape}",
                           "the centre has the width of a token")
    return radius, center, heads


def _initial_pool(target, kernel, center, radius, n, rng, deadline) -> list[tuple[np.ndarray, str]]:
    """Starting inputs in the kernel's working coordinates: for every dot-product head, the best
    structured inputs (searched in that head's own reduced basis) and Castin et al.'s input;
    then random inputs.  Heads are visited until ``deadline``."""
    heads, _, _ = _heads_of(target)
    inside = radius * (1 - 1e-6)
    pool = [(_random_tokens(rng, 8, n, kernel.d_in, inside), "random")]
    if not isinstance(kernel, AttentionKernel):
        return pool
    keep = max(2, 24 // len(heads)) if len(heads) > 1 else 16
    surrogate = None
    # heads in decreasing order of a crude size, R^2 ||A_h|| ||W_V^h|| ||W_O^h||: the budget may end early
    W_O = getattr(target, "W_O", None)
    sizes = [np.linalg.norm(h.A, 2) * np.linalg.norm(h.W_V, 2)
             * (1.0 if W_O is None else np.linalg.norm(W_O[i * h.d_v:(i + 1) * h.d_v], 2)) for i, h in enumerate(heads)]
    for index in np.argsort(sizes)[::-1]:
        head = heads[index]
        if time.perf_counter() >= deadline and len(pool) > 1:
            break
        own = AttentionKernel(head, center)
        if n >= 3:
            W_Q, W_K, W_V, b_Q, _, _ = own.head_weights(0)
            light = len(heads) > 1
            starts, _ = structured_starts(W_Q, W_K, W_V, b_Q, inside, n, count=16 if light else 32,
                                          steps=120 if light else 200, seed=int(rng.integers(2 ** 31)))
            pool.append((kernel.to_work(own.from_work(starts[:keep])), "structured"))
            if kernel.H > 1:
                surrogate = surrogate or _TieSurrogate(kernel, inside, n)
                pool.append((surrogate.combine(pool[-1][0][0])[None], "tied-heads"))
        try:
            castin = _castin_input(head.W_Q, head.W_K, inside, n, literal=False)
            signs = np.stack([castin, -castin]) if len(heads) == 1 else castin[None]   # eig fixes no sign
            pool.append((kernel.to_work(signs + center), "castin"))
        except AssumptionError:
            pass
    return pool


def _describe(target, model, layer, head):
    heads, _, residual = _heads_of(target)
    return {"model": model, "layer": layer, "head": head if isinstance(target, Head) else None,
            "score": heads[0].score, "residual": residual}


@_one_blas_thread
def search_witness(target: Head | Layer, *, radius: float, center: np.ndarray | None = None, n: int,
                   budget_seconds: float, seed: int = 0, norm: str = "fro", model: str = "",
                   layer: int | None = None, head: int | None = None, polish_count: int = 12) -> Witness:
    """Find an input where ``target`` stretches as much as possible on the ball domain.

    Parameters
    ----------
    target : Head or Layer
    radius : float
        Every token satisfies ``||x_i - center|| <= radius``.
    center : ndarray of shape (d,), optional
    n : int
        Number of tokens.
    budget_seconds : float
        Wall-clock budget (the final recomputation adds a fraction of a second).
    seed : int
    norm : {"fro", "2,1"}
        ``"fro"``: a jacobian witness; ``"2,1"``: a secant witness ``(X, Y)`` that moves one
        token, for ``||.||_{2,1}`` on inputs and outputs.
    model, layer, head : str, int, int
        What the weights are, recorded in the witness.
    polish_count : int
        How many candidates are polished together.

    Returns
    -------
    Witness
        ``value`` recomputed with :mod:`lipbound.numeric.attention` at a point inside the ball.

    Notes
    -----
    Candidates: structured alpha/beta inputs of every head (:func:`structured_starts`,
    dot-product scores only), Castin et al.'s adversarial input, random inputs with radius
    continuation; the best are polished by projected ascent of the local Jacobian norm.
    """
    radius, center, heads = _check_search_args(target, radius, n, budget_seconds, norm, center)
    began = time.perf_counter()
    deadline = began + budget_seconds * (0.9 if norm == "fro" else 0.75)
    rng = np.random.default_rng(seed)
    kernel = _kernel(target, center)
    pool = _initial_pool(target, kernel, center, radius, n, rng, began + 0.25 * (deadline - began))
    Xw = np.concatenate([p[0] for p in pool])
    families = [p[1] for p in pool for _ in range(len(p[0]))]
    cands = _start(kernel, project_to_ball(Xw, radius), families, rng, power_steps=15 if len(heads) == 1 else 6)
    pooled = time.perf_counter()
    # keep the best of every family, then the best overall
    order = list(np.argsort(-cands.sigma))
    chosen = [next(i for i in order if cands.family[i] == family) for family in dict.fromkeys(families)]
    chosen += [i for i in order if i not in chosen][:max(polish_count - len(chosen), 0)]
    cands = _take(cands, chosen)
    # continuation from random inputs gets a sixth of the remaining time
    now = time.perf_counter()
    cands = _join(cands, _continuation(kernel, rng, 4, n, radius, now + (deadline - now) / 6))
    cands = _polish(kernel, cands, radius, deadline)
    polished = time.perf_counter()
    best = int(np.argmax(cands.sigma))
    X = _inside(kernel.from_work(cands.X[best]), center, radius)
    # the final value, from scratch: a few more power steps at the projected point, then
    # ||Df(X)[E]|| with ||E|| = 1 by lipbound.numeric.attention
    _, E, _ = kernel.linearize(kernel.to_work(X)[None]).top_singular(cands.E[best][None], 20)
    E = kernel.direction_from_work(E[0])
    E = E / np.linalg.norm(E)
    value = _jacobian_value(target, X, E)
    details = {"family": cands.family[best], "search_sigma": float(cands.sigma[best]),
               "candidates": len(cands.sigma), "pool_seconds": round(pooled - began, 3),
               "polish_seconds": round(polished - pooled, 3), "seconds": round(time.perf_counter() - began, 3)}
    about = _describe(target, model, layer, head)
    if norm == "fro":
        return Witness(kind="jacobian", X=X, E=E, value=value, norm="fro", radius=radius, center=center,
                       seed=seed, method="structured+polish", details=details, **about)
    Y, ratio, token = _secant_21(target, X, E, center, radius)
    details.update({"moved_token": token, "jacobian_value": value, "seconds": round(time.perf_counter() - began, 3)})
    return Witness(kind="secant", X=X, Y=Y, value=ratio, norm="2,1", radius=radius, center=center, seed=seed,
                   method="structured+polish+secant", details=details, **about)


def _secant_21(target, X: np.ndarray, E: np.ndarray, center: np.ndarray, radius: float):
    """Turn a point into a (2,1)-norm secant witness ``(X, Y)`` that moves one token.

    For each token j, the unit e maximising ``sum_i ||J_ij e||`` (a convex function of e) is
    approached by the monotone iteration ``e <- sum_i J_ij^T (J_ij e) / ||J_ij e||`` (all j in
    one batch); then a scan over step lengths ``t`` and both signs picks ``Y = X + t e_j``
    (projected into the ball) with the largest ratio ``||f(X) - f(Y)||_{2,1} / ||X - Y||_{2,1}``.
    Returns ``(Y, ratio, j)``."""
    forward, jvp, vjp = _reference_maps(target)
    n, d = X.shape
    diagonal = (np.arange(n), np.arange(n))
    around = np.broadcast_to(X, (n, n, d))
    e = _unit(E + (np.linalg.norm(E, axis=1, keepdims=True) == 0) / math.sqrt(d))
    for _ in range(30):
        tangent = np.zeros((n, n, d))
        tangent[diagonal] = e
        out = jvp(around, tangent)[1]
        rows = np.linalg.norm(out, axis=2, keepdims=True)
        back = vjp(around, out / np.where(rows > 0, rows, 1.0))[diagonal]
        e = np.where(np.linalg.norm(back, axis=1, keepdims=True) > 0, _unit(back), e)
    f_X = forward(X[None])[0]
    lengths = radius * np.geomspace(1e-6, 0.3, 40)
    moves = np.concatenate([lengths, -lengths])
    best = (-1.0, None, -1)
    for j in range(n):
        Y = np.repeat(X[None], len(moves), axis=0)
        Y[:, j] = X[j] + moves[:, None] * e[j]
        Y = _inside(Y, center, radius)
        moved_in = np.linalg.norm(X - Y, axis=2).sum(axis=1)
        moved_out = np.linalg.norm(f_X - forward(Y), axis=2).sum(axis=1)
        ratios = np.where(moved_in > 0, moved_out / np.where(moved_in > 0, moved_in, 1.0), -1.0)
        k = int(np.argmax(ratios))
        if ratios[k] > best[0]:
            best = (float(ratios[k]), Y[k], j)
    _, Y, j = best
    return Y, _secant_value(target, X, Y, "2,1"), j


@_one_blas_thread
def naive_ascent(target: Head | Layer, *, radius: float, center: np.ndarray | None = None, n: int,
                 budget_seconds: float, seed: int = 0, norm: str = "fro", batch: int = 32,
                 model: str = "", layer: int | None = None, head: int | None = None) -> Witness:
    """The baseline: gradient ascent (Adam) of the secant ratio ``||f(X) - f(Y)|| / ||X - Y||``
    from random starts, projected onto the ball, for ``budget_seconds``.

    Starts: tokens uniform on the sphere ``||x - c|| = R`` (in all d coordinates) and
    ``Y = X + 0.05 R g / sqrt(d)`` with g standard normal; ``batch`` restarts run together and new
    ones replace them every 300 steps.  Adam's step decays linearly from ``0.003 R`` (the best of
    0.0003 R .. 0.03 R on all-MiniLM-L6-v2 layer 0 head 0, n = 8), so the baseline is a tuned
    one.  Returns the best pair as a secant witness (value recomputed with
    :mod:`lipbound.numeric.attention`).
    """
    radius, center, heads = _check_search_args(target, radius, n, budget_seconds, norm, center)
    began = time.perf_counter()
    deadline = began + budget_seconds
    rng = np.random.default_rng(seed)
    kernel = _kernel(target, center, reduce=False)
    d = kernel.d_in
    best = (-1.0, None, None)
    rounds = 0
    while rounds == 0 or time.perf_counter() < deadline:
        rounds += 1
        X = _random_tokens(rng, batch, n, d, radius)
        Y = project_to_ball(X + 0.05 * radius * rng.standard_normal(X.shape) / math.sqrt(d), radius, 0.0)
        state = [np.zeros_like(X), np.zeros_like(X), np.zeros_like(Y), np.zeros_like(Y)]
        lr0 = _NAIVE_LR * radius
        for step in range(1, 301):
            if time.perf_counter() >= deadline and best[1] is not None:
                break
            ratio, gX, gY = _secant_grad(kernel, X, Y, norm)
            top = int(np.argmax(ratio))
            if ratio[top] > best[0]:
                best = (float(ratio[top]), X[top].copy(), Y[top].copy())
            lr = lr0 * (1 - step / 301) + 1e-4 * radius
            X, state[0], state[1] = _adam(X, gX, state[0], state[1], step, lr)
            Y, state[2], state[3] = _adam(Y, gY, state[2], state[3], step, lr)
            X, Y = project_to_ball(X, radius, 0.0), project_to_ball(Y, radius, 0.0)
    X = _inside(kernel.from_work(best[1]), center, radius)
    Y = _inside(kernel.from_work(best[2]), center, radius)
    value = _secant_value(target, X, Y, norm)
    details = {"rounds": rounds, "batch": batch, "search_ratio": best[0],
               "seconds": round(time.perf_counter() - began, 3)}
    return Witness(kind="secant", X=X, Y=Y, value=value, norm=norm, radius=radius, center=center, seed=seed,
                   method="naive-ascent", details=details, **_describe(target, model, layer, head))


def _adam(x, g, m, v, step, lr):
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    update = (m / (1 - 0.9 ** step)) / (np.sqrt(v / (1 - 0.999 ** step)) + 1e-12)
    return x + lr * update, m, v


def _secant_grad(kernel, X, Y, norm):
    """Ratio ``r = N(f(X) - f(Y)) / N(X - Y)`` and its gradients in X and Y (batched)."""
    lx, ly = kernel.linearize(X), kernel.linearize(Y)
    diff_out, diff_in = lx.F - ly.F, X - Y
    if norm == "fro":
        top = np.sqrt(np.sum(diff_out ** 2, axis=(1, 2)))
        bottom = np.sqrt(np.sum(diff_in ** 2, axis=(1, 2)))
        g_top = diff_out / np.maximum(top, 1e-300)[:, None, None]
        g_bottom = diff_in / np.maximum(bottom, 1e-300)[:, None, None]
    else:
        rows_out = np.linalg.norm(diff_out, axis=2, keepdims=True)
        rows_in = np.linalg.norm(diff_in, axis=2, keepdims=True)
        top, bottom = rows_out.sum(axis=(1, 2)), rows_in.sum(axis=(1, 2))
        g_top = diff_out / np.maximum(rows_out, 1e-300)
        g_bottom = diff_in / np.maximum(rows_in, 1e-300)
    bottom = np.maximum(bottom, 1e-300)
    ratio = top / bottom
    gX = (lx.vjp(g_top) - ratio[:, None, None] * g_bottom) / bottom[:, None, None]
    gY = (-ly.vjp(g_top) + ratio[:, None, None] * g_bottom) / bottom[:, None, None]
    return ratio, gX, gY


@_one_blas_thread
def castin_adversarial(head: Head, radius: float, n: int, center: np.ndarray | None = None,
                       model: str = "", layer: int | None = None, head_index: int | None = None,
                       iterations: int = 300) -> Witness:
    """Castin, Ablin, Peyre (ICML 2024) adversarial input and its local Jacobian norm.

    From the real eigenpairs of their ``A = K^T Q / sqrt(d_k)`` (our ``A^T``; eigenvalues as
    ``numpy.linalg.eig`` returns them, no symmetrisation, as in their released code): if
    ``lambda_max > -8 lambda_min`` the top eigenvector u gives ``x_1 = R u``,
    ``x_2 = .. = x_n = R u / 2``; else the bottom one gives ``x_1 = -R u``, ``x_2 = .. = x_n = R u``
    (tokens about ``center``).  The value is ``||Df(X)[E]||`` of this head after power iteration
    (their code evaluates the whole self-attention block, all heads, at the input built from one head).
    """
    if not isinstance(head, Head):
        raise WeightsError("head", "a single Head (the construction uses one matrix A)", type(head).__name__,
                           "pass layer.heads[h]")
    radius, center, _ = _check_search_args(head, radius, n, 1.0, "fro", center)
    X = _inside(_castin_input(head.W_Q, head.W_K, radius, n) + center, center, radius)
    value, E = local_jacobian_norm(head, X, iterations=iterations)
    return Witness(kind="jacobian", X=X, E=E, value=value, norm="fro", radius=radius, center=center, seed=0,
                   method="castin-adversarial", **_describe(head, model, layer, head_index))
