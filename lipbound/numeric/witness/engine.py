"""Batched local Jacobian norms for the witness search, on the one attention engine.

:func:`engine_for` prepares a head or a layer (:class:`~lipbound.numeric.attention.AttentionMap`)
in working coordinates about the domain's centre, reduced to the span of its projections;
:func:`jacobian_norms` runs a fixed number of power-iteration steps on a batch of inputs (for a
single dot-product head in output space, through ``n x n`` Gram sandwiches).
"""

from __future__ import annotations

import numpy as np

from ..attention import GRAM_TOKENS, AttentionMap, unit_rows
from ..blas import one_blas_thread
from ..model import Head, Layer

__all__ = ["jacobian_norms", "engine_for", "CHUNK"]

#: Inputs per block in :func:`jacobian_norms` (measured fastest: the block's arrays stay in cache).
CHUNK = 128


def engine_for(target: Head | Layer, center: np.ndarray | None, reduce: bool = True) -> AttentionMap:
    """The map in working coordinates ``(x - center) U`` (``U`` spans the projections when ``reduce``)."""
    return AttentionMap(target, center, reduce=reduce)


@one_blas_thread
def jacobian_norms(engine: AttentionMap, Xw: np.ndarray, steps: int = 20, seed: int = 0,
                   directions: bool = True):
    """Batched local Jacobian norms by power iteration with a fixed number of steps.

    Parameters
    ----------
    engine : AttentionMap
    Xw : ndarray, shape (b, n, d_in)
        Inputs in the engine's working coordinates (``engine.to_work(X)``).
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
    if engine.gram is None or Xw.shape[1] > GRAM_TOKENS:
        sigma, E, _ = engine.linearize(Xw).top_singular(rng.standard_normal(Xw.shape), steps)
        return sigma, (E if directions else None)
    starts = rng.standard_normal((Xw.shape[0], Xw.shape[1], engine.d_v))
    sigma, E = np.empty(len(Xw)), (np.empty(Xw.shape) if directions else None)
    for first in range(0, len(Xw), CHUNK):     # chunks keep the working set in cache
        part = slice(first, first + CHUNK)
        lin = engine.linearize(Xw[part])
        G = starts[part]
        for _ in range(steps):
            G = lin.gram_step(G)
            G *= (1.0 / np.maximum(np.sqrt(np.einsum("bij,bij->b", G, G)), 1e-300))[:, None, None]
        JJG = lin.gram_step(G)
        sigma[part] = np.sqrt(np.einsum("bij,bij->b", JJG, JJG)
                              / np.maximum(np.einsum("bij,bij->b", G, JJG), 1e-300))
        if directions:
            E[part] = unit_rows(lin.vjp(G))
    return sigma, E


