"""The witness record: an input where an attention map stretches, saved so anyone can re-check it.

A :class:`Witness` stores ``(X, E)`` ("jacobian": ``||Df(X)[E]||_F / ||E||_F``) or ``(X, Y)``
("secant": ``||f(X) - f(Y)|| / ||X - Y||``) with the value it claims, the domain it lies in, and
the weights it was found on (their path and sha256), in an ``.npz`` file of plain arrays and a
JSON metadata string; :mod:`lipbound.numeric.recheck` recomputes the value in high precision.

Cross-attention witnesses (``role`` "cross-queries", "cross-context", "cross-joint") also store
the queries ``Q`` and, when the constant is taken in them, a direction ``EQ`` on them.  A domain
is a ball (``radius``, ``center``) or a LayerNorm image (``gamma`` besides: tokens
``center + gamma * z``, ``z`` orthogonal to 1, ``||z|| <= sqrt(d)``); for the image the exact
coordinates ``z`` of every token (and ``w`` of every direction, ``E = gamma * w``, ``sum w = 0``) are
stored in ``coordinates``, because a float token almost never lies exactly on the hyperplane.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import final

import numpy as np

from ...errors import AssumptionError, WeightsError
from ...io import atomic_write
from ..domains import project_to_ball as _project

__all__ = ["Witness", "WITNESS_FORMAT", "KINDS", "ROLES", "NORMS", "INWARD_MARGIN", "in_ball", "project_to_ball"]

#: Version tag written into every witness file.
WITNESS_FORMAT = "lipbound-witness/3"
KINDS = ("jacobian", "secant")
#: The argument of the constant (see :mod:`lipbound.numeric.witness.problem`).
ROLES = ("self", "cross-queries", "cross-context", "cross-joint")
_ARRAYS = ("X", "E", "Y", "Q", "EQ")
NORMS = ("fro", "2,1")
#: The norms whose images a witness's domain may be (with ``gamma``).
IMAGES = ("layernorm", "rmsnorm")
#: Tokens are pulled this far (relative) inside the sphere, so rounding never puts them outside.
INWARD_MARGIN = 1e-9


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
    weights, sha256 : str
        The file or directory the weights were read from, and its sha256 (empty for weights built
        in memory): :mod:`lipbound.numeric.recheck` reloads exactly these weights, or refuses.
    domain : str
        The domain the map was searched on (the witness lies in its enclosing ball).
    layer, head : int or None
        Which layer and head; ``head=None`` means the whole multi-head layer.
    score : str
        The attention kernel's registry name (``"dot"``, ``"l2"``, ``"cosine"``, ``"rope"``, ...).
    residual : bool
        Whether the map is ``X + Att(X)``.
    created : str
        ISO 8601 time stamp (UTC).
    details : dict
        JSON-serialisable extras (the candidate family, iterations, ...).
    role : {"self", "cross-queries", "cross-context", "cross-joint"}
        The argument of the constant.
    Q, EQ : ndarray of shape (m, d), or None
        Cross-attention: the queries, and the direction on them (roles "cross-queries" and
        "cross-joint"; for "cross-queries" E is zero).
    gamma : ndarray of shape (d,), or None
        The domain of X is a norm's image (None: the ball): ``center + gamma * z`` with ``z`` orthogonal to 1 and
        ``||z|| <= sqrt(d)`` (``image="layernorm"``), or ``gamma * z`` with ``||z|| <= sqrt(d)`` (``image="rmsnorm"``,
        centre 0; directions are free).
    query_radius, query_center, query_gamma :
        The domain of the queries (cross-attention), as for X.
    coordinates : dict of str to ndarray
        Exact coordinates on a LayerNorm image: ``"X"``, ``"Y"``, ``"Q"`` hold z, ``"E"``, ``"EQ"`` hold w.
    block : str
        The stack of the model (``"encoder"`` or ``"decoder"``).
    image : {"layernorm", "rmsnorm"}
        Which norm's image ``gamma`` (and ``query_gamma``) describe.
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
    weights: str = ""
    sha256: str = ""
    domain: str = ""
    layer: int | None = None
    head: int | None = None
    score: str = "dot"
    residual: bool = False
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    details: dict = field(default_factory=dict)
    role: str = "self"
    Q: np.ndarray | None = None
    EQ: np.ndarray | None = None
    gamma: np.ndarray | None = None
    query_radius: float | None = None
    query_center: np.ndarray | None = None
    query_gamma: np.ndarray | None = None
    coordinates: dict = field(default_factory=dict)
    block: str = "encoder"
    image: str = "layernorm"

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
        self._check_cross(X)
        for key in ("gamma", "query_gamma"):
            if getattr(self, key) is not None:
                gamma = np.array(getattr(self, key), dtype=float)
                if gamma.shape != (X.shape[1],) or not np.all(np.isfinite(gamma)):
                    raise WeightsError(key, f"a finite vector of shape ({X.shape[1]},)", f"shape {gamma.shape}",
                                       "pass the LayerNorm gain of the domain")
                gamma.setflags(write=False)
                object.__setattr__(self, key, gamma)
        coordinates = {}
        for key, value in dict(self.coordinates).items():
            reference = getattr(self, key, None) if key in _ARRAYS else None
            array = _finite_matrix(f"coordinates[{key!r}]", value)
            if reference is None or array.shape != reference.shape:
                raise WeightsError(f"coordinates[{key!r}]", f"coordinates of the stored array {key}",
                                   f"shape {array.shape}", "store z (tokens) and w (directions) of the same shape")
            coordinates[key] = array
        object.__setattr__(self, "coordinates", coordinates)
        if self.image not in IMAGES:
            raise AssumptionError("image", f"one of {IMAGES}", repr(self.image),
                                  "name the norm whose image gamma describes")
        json.dumps(self.details)  # fails early on non-serialisable extras

    def _check_cross(self, X: np.ndarray) -> None:
        if self.role not in ROLES:
            raise AssumptionError("role", f"one of {ROLES}", repr(self.role), "choose the argument of the constant")
        if self.role == "self":
            if self.Q is not None or self.EQ is not None:
                raise AssumptionError("Q", "no queries for self-attention", "an array", "use a cross role")
            return
        if self.kind != "jacobian":
            raise AssumptionError("kind", "'jacobian' for cross-attention", repr(self.kind), "store (X, E, Q, EQ)")
        if self.Q is None:
            raise AssumptionError("Q", "the queries of cross-attention (m, d)", "None", "pass Q=...")
        Q = _finite_matrix("Q", self.Q)
        if Q.shape[1] != X.shape[1]:
            raise WeightsError("Q", f"queries of width {X.shape[1]}", f"shape {Q.shape}", "queries are tokens too")
        object.__setattr__(self, "Q", Q)
        if self.role in ("cross-queries", "cross-joint"):
            if self.EQ is None:
                raise AssumptionError("EQ", "a direction on the queries", "None", "pass EQ=...")
            EQ = _finite_matrix("EQ", self.EQ)
            if EQ.shape != Q.shape:
                raise WeightsError("EQ", f"shape {Q.shape} like Q", f"shape {EQ.shape}", "one row per query")
            object.__setattr__(self, "EQ", EQ)
        elif self.EQ is not None:
            raise AssumptionError("EQ", "None (the constant is taken in the context)", "an array", "drop EQ")
        radius = self.radius if self.query_radius is None else float(self.query_radius)
        center = self.center if self.query_center is None else np.array(self.query_center, dtype=float)
        if not (radius > 0 and math.isfinite(radius)) or center.shape != (X.shape[1],):
            raise AssumptionError("query_radius", "a finite radius > 0 and a centre of the token width",
                                  f"{radius!r}, shape {center.shape}", "give the queries' ball")
        center.setflags(write=False)
        object.__setattr__(self, "query_radius", float(radius))
        object.__setattr__(self, "query_center", center)

    @property
    def n(self) -> int:
        return self.X.shape[0]

    @property
    def d(self) -> int:
        return self.X.shape[1]

    @property
    def m(self) -> int | None:
        return None if self.Q is None else self.Q.shape[0]

    @property
    def target(self) -> str:
        """A short name of the map: ``"model layer 0 head 3 (dot)"``."""
        where = "" if self.layer is None else f" layer {self.layer}"
        where = f" {self.block}{where}" if self.block != "encoder" else where
        which = " (all heads)" if self.head is None else f" head {self.head}"
        extra = ", residual" if self.residual else ""
        role = "" if self.role == "self" else f", {self.role}"
        return f"{self.model or 'unnamed model'}{where}{which} ({self.score}{extra}{role})"

    def in_domain(self) -> bool:
        """Float check that every token lies in its domain (the exact check is in
        :func:`lipbound.numeric.recheck.recheck`)."""
        ok = True
        for key in ("X", "Y", "Q"):
            points = getattr(self, key)
            if points is None:
                continue
            query = key == "Q"
            gamma = self.query_gamma if query else self.gamma
            radius = self.query_radius if query else self.radius
            center = self.query_center if query else self.center
            if gamma is None:
                ok = ok and bool(np.all(in_ball(points, center, radius)))
            else:
                z = self.coordinates.get(key)
                if self.image == "rmsnorm":
                    center = np.zeros_like(gamma)
                ok = ok and z is not None and bool(np.all(np.linalg.norm(z, axis=-1) ** 2 <= z.shape[-1])) \
                    and bool(np.allclose(center + gamma * z, points, rtol=0, atol=1e-9 * (1 + np.abs(points).max())))
        return ok

    def metadata(self) -> dict:
        return {"format": WITNESS_FORMAT, "kind": self.kind, "value": self.value, "value_hex": self.value.hex(),
                "norm": self.norm, "radius": self.radius, "radius_hex": self.radius.hex(), "seed": self.seed,
                "method": self.method, "model": self.model, "weights": self.weights, "sha256": self.sha256,
                "domain": self.domain, "layer": self.layer, "head": self.head, "block": self.block,
                "role": self.role, "score": self.score, "residual": self.residual, "created": self.created,
                "query_radius_hex": None if self.query_radius is None else self.query_radius.hex(),
                "details": self.details, "n": self.n, "m": self.m, "d": self.d, "image": self.image}

    def save(self, path: str | Path) -> Path:
        """Write an ``.npz`` file: arrays ``X``, ``E`` or ``Y``, ``center`` (float64), the queries
        ``Q``, ``EQ``, ``query_center`` of cross-attention, ``gamma``/``query_gamma`` and
        ``coordinates.KEY`` of LayerNorm images, and ``metadata`` (a JSON string as a unicode array).
        Nothing is pickled.  Returns the path (``.npz`` is appended when missing, as numpy does)."""
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_name(path.name + ".npz")
        with atomic_write(path, "witness_dir") as handle:
            np.savez(handle, **self.to_arrays())
        return path

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The arrays of the file :meth:`save` writes (plain data: the witness travels between
        processes as this dict; :meth:`from_arrays` reads it back)."""
        arrays = {"X": self.X, "center": self.center, "metadata": np.array(json.dumps(self.metadata()))}
        for key in ("E", "Y", "Q", "EQ", "query_center", "gamma", "query_gamma"):
            if getattr(self, key) is not None:
                arrays[key] = getattr(self, key)
        arrays.update({f"coordinates.{key}": value for key, value in self.coordinates.items()})
        return arrays

    @classmethod
    def load(cls, path: str | Path) -> Witness:
        """Read a file written by :meth:`save` (``np.load(..., allow_pickle=False)``)."""
        path = Path(path)
        if not path.is_file():
            raise WeightsError(str(path), "an existing witness file (.npz)", "no such file",
                               "check the path (Witness.save appends .npz)")
        try:
            # the file opened here: np.load leaves its own open when a damaged archive fails to parse
            with path.open("rb") as file, np.load(file, allow_pickle=False) as data:
                if not hasattr(data, "files"):  # a plain .npy array, not an archive
                    raise ValueError("a single array, not an .npz archive")
                arrays = {key: data[key] for key in data.files}
        except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as error:
            raise WeightsError(str(path), "a witness .npz written by lipbound (verify, demo or Witness.save)",
                               f"a damaged, truncated or foreign file ({type(error).__name__}: {error})",
                               "re-create the witness, e.g. with lipbound verify") from None
        return cls.from_arrays(arrays, str(path))

    @classmethod
    def from_arrays(cls, arrays: dict, path: str = "witness") -> Witness:
        """The witness of :meth:`to_arrays` (``path`` names it in messages)."""
        if "metadata" not in arrays or "X" not in arrays or "center" not in arrays:
            raise WeightsError(path, "arrays X, center and metadata", f"arrays {sorted(arrays)}",
                               "this is not a lipbound witness file")
        try:
            meta = json.loads(str(arrays["metadata"][()]))
        except (json.JSONDecodeError, TypeError, IndexError) as error:
            raise WeightsError(path, "JSON metadata", f"unparsable metadata ({error})",
                               "re-create the witness with Witness.save") from None
        if not isinstance(meta, dict) or meta.get("format") not in (WITNESS_FORMAT, "lipbound-witness/2",
                                                                     "lipbound-witness/1"):
            raise WeightsError(path, f"format {WITNESS_FORMAT!r}", repr(meta.get("format") if isinstance(meta, dict)
                                                                         else meta)[:60],
                               "re-create the witness with this version of lipbound")
        try:
            return cls._from_metadata(arrays, meta, path)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise WeightsError(path, "a complete lipbound witness file", f"damaged metadata or arrays "
                               f"({type(error).__name__}: {error})", "re-create the witness, e.g. with lipbound verify"
                               ) from None

    @classmethod
    def _from_metadata(cls, arrays: dict, meta: dict, path: str) -> Witness:
        kind = meta["kind"]
        second = "E" if kind == "jacobian" else "Y"
        if second not in arrays:
            raise WeightsError(path, f"an array {second} for a {kind} witness", f"arrays {sorted(arrays)}",
                               "the file is incomplete; re-create it")
        query_radius = meta.get("query_radius_hex")
        return cls(kind=kind, X=arrays["X"], E=arrays.get("E"), Y=arrays.get("Y"),
                   value=float.fromhex(meta["value_hex"]), norm=meta["norm"],
                   radius=float.fromhex(meta["radius_hex"]), center=arrays["center"], seed=int(meta["seed"]),
                   method=meta["method"], model=meta["model"], weights=meta.get("weights", ""),
                   sha256=meta.get("sha256", ""), domain=meta.get("domain", ""), layer=meta["layer"], head=meta["head"],
                   score=meta["score"], residual=bool(meta["residual"]), created=meta["created"],
                   details=meta.get("details", {}), role=meta.get("role", "self"), Q=arrays.get("Q"),
                   EQ=arrays.get("EQ"), gamma=arrays.get("gamma"),
                   query_radius=None if query_radius is None else float.fromhex(query_radius),
                   query_center=arrays.get("query_center"), query_gamma=arrays.get("query_gamma"),
                   coordinates={key.split(".", 1)[1]: value for key, value in arrays.items()
                                if key.startswith("coordinates.")},
                   block=meta.get("block", "encoder"), image=meta.get("image", "layernorm"))


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
    return _project(X, radius * (1.0 - margin), center)
