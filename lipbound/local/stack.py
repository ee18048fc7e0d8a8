"""A stack of whole layers through its blocks' own curves (theorem local-chain on the blocks, lemmas
normwise-product and prefix-chain): each block's certified constant and variation on a ball that holds the
images of U, and the stack's Jacobian at the centre multiplied block by block."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import math
from typing import final

import numpy as np

from ..errors import NotCertifiedError
from ..rigorous.intervals import interval, upper, upper_product
from ..rigorous.linalg import Enclosure, spectral_norm_upper_large
from ..symbolic import local as T
from .balls import Neighbourhood
from .bounds import evaluate_theorem
from .centre import ChainCentre, reach, rounding_reach
from .chains import NormwiseProduct
from .enclosed import EnclosedAttention, release_block

__all__ = ["StackOfBlocks", "composed_variation", "prefix_constant", "release_products", "return_freed_pages"]


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "malloc_trim", None)
    except OSError:
        return None


def return_freed_pages() -> None:
    """Free the garbage in reference cycles, then give the heap's free pages back to the system (glibc's
    ``malloc_trim(0)``; nothing elsewhere).

    A block's objects that refer to one another (a closure over its owner, a cached property's back-reference) are
    freed only by a full collection of the cycle collector, which runs when the long-lived Python objects have grown
    by a quarter: the models and the symbolic layer's theorems make those many, and a block allocates arrays, not
    objects, so its cycles (with their arrays) stayed.  A block's enclosures are arrays of 5-30 MB, below glibc's
    mmap threshold once it has risen after the first large frees, so they come from the heap; freed, their pages stay
    with the process, and a stack's resident memory grew by about 0.7 GB a block while its live arrays did not."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@final
class StackOfBlocks:
    """A stack ``F = B_L o ... o B_1`` of whole layers through its blocks' own curves (Frobenius norm).

    With ``X~_l`` the float centres of the chain at the blocks' inputs (``X~_1 = X``) and ``J~_l`` the product of
    block l's component Jacobians along the float chain from ``X~_l`` (the dense Jacobian that block's own
    curve certifies), telescoping over the blocks (theorem local-chain, one block per step) gives, for any
    points ``Y_l`` in sets ``U_l`` that hold the images of U,

        sup_U ||DF(Y) - J~_L ... J~_1|| <= sum_l (L_L ... L_(l+1)) V_l (N_(l-1) ... N_1),   Lip_U(F) <= L_L ... L_1,

    with ``L_l``, ``V_l`` block l's certified constant and variation (about ``J~_l``) on ``U_l`` and ``N_l =
    ||J~_l||`` (block 1 restricted to the moving tokens); ``J~_L ... J~_1`` is the stack's own dense Jacobian
    at the centre.  ``U_1 = U``; ``U_l`` for l > 1 is the Frobenius ball about ``X~_l`` of radius ``rho_l``,
    ``rho_2 = R_1 + e_2``, ``rho_(l+1) = R_l + e_(l+1)``, where ``R_l <= L_l rho_l`` (``L_1 theta_U eps``) is block
    l's certified reach on ``U_l`` (its curve point's ``reach``, lemma block-reach) and ``e_(l+1)`` bounds how far
    the exact image of ``X~_l`` lies from ``X~_(l+1)`` (the float chain's rounding through block l, pushed through
    its components' movement bounds): ``U_l`` holds every image of U, the exact image of X included.

    The products of the Jacobians at the centres are also kept themselves (lemmas normwise-product and
    prefix-chain, docs/mathematics.md): ``pi_l >= ||J~_l ... J~_1||`` certified from a float product with one
    normwise radius, so that ``||DF(X)|| <= pi_L``, the variation is also at most ``sum_l (L_L ... L_(l+1)) V_l
    pi_(l-1)`` (the smaller counts) and ``rho_(l+1)`` is also at most ``lambda_l theta_U eps + D_(l+1)``, with
    ``lambda_l`` that bound's constant for the first l blocks and ``D_(l+1)`` how far the exact image of X lies
    from ``X~_(l+1)``.

    ``block_curve(X_l, layer, ball, positions, eps, progress, attention, chain=..., centre=...)`` is one block's own
    curve (:func:`lipbound.local.curve.lipschitz_curve` with its chain and centre handed over), ``attention`` the
    first block's attention curve on U (a ``LipschitzCurve``); ``dense`` whether the blocks' dense Jacobians are
    formed.  Attributes ``variation``, ``product``, ``jacobian_norm`` and ``blocks`` (the
    per-block breakdown).
    """

    def __init__(self, block_curve, chain, centre: ChainCentre, X, first: int, ball: str, positions, eps: list,
                 progress, attention, blocks: int, moving: np.ndarray, estimate: float, dense: bool):
        def report(l):
            return None if progress is None else \
                lambda done, total, what: progress(done, total, f"{what} (block {first + l} of the stack)")

        size = len(chain) // blocks                  # components per block: 4 post-norm, 2 pre-norm or sandwich
        def part(l):
            start, stop = size * l, size * (l + 1)
            return {"chain": chain[start:stop], "centre": centre.part(chain, start, stop, dense)}

        # the stack's Jacobian at X: its blocks' dense Jacobians along the float chain, multiplied normwise
        product = NormwiseProduct() if dense else None
        rows = np.concatenate([np.arange(j * X.shape[1], (j + 1) * X.shape[1]) for j in np.flatnonzero(moving)])

        def multiply(l, piece):
            """Block l's Jacobian onto the product, before its curve: the curve lets the Jacobian go once it has its
            norm, which :func:`settle` then gives the product."""
            if product is None:
                return
            J = piece["centre"].jacobian
            product.multiply(J if l or np.all(moving) else Enclosure(J.mid[rows], J.rad[rows]), None)

        def settle(l, piece, norm_bound):
            """The certified norm of the product so far (inf without one), block l's norm given (or formed from its
            Jacobian where its curve ran at no radius)."""
            if product is None:
                return math.inf
            J = piece["centre"].jacobian
            product.settle(norm_bound if math.isfinite(norm_bound) or J is None else spectral_norm_upper_large(J))
            return product.norm_upper(estimate * (1 + 1e-8) if l == blocks - 1 else None)

        hoods = [Neighbourhood(ball, e, tuple(positions)) for e in eps]
        piece = part(0)
        # the first block's prefixes are its piece's now: the whole chain's centre lets them go, so that they leave
        # with the piece (two dense (n d)^2 enclosures, 0.9 GB each at n = 20 on MiniLM)
        centre.prefix_jacobian.clear()
        multiply(0, piece)
        curve = block_curve(X, first, ball, positions, list(eps), report(0), attention,
                            **piece)   # the stack's own attention curve: the same neighbourhoods
        #: prefix[l]: certified ``||J~_l ... J~_1||`` (prefix[0] = 1: no block yet)
        prefix = [1.0, settle(0, piece, curve.jacobian_norm)]
        piece = None   # (its Jacobians go before the next block's are formed)
        release_products(centre, 0, size)
        return_freed_pages()
        if progress is not None:
            progress(1, blocks, "blocks of the stack")
        cpu = [p.cpu_seconds for p in curve.points]
        L, V, N = [[p.certified for p in curve.points]], [[p.variation for p in curve.points]], [curve.jacobian_norm]
        rho = [p.reach for p in curve.points]    # sup_U ||B_1(Y) - B_1(X)||_F (lemma block-reach)
        drifted = [0.0] * len(eps)   # how far the exact image of X can lie from the float centre X~_l
        radii = [list(eps)]
        for l in range(1, blocks):
            drift = rounding_reach(chain[size * (l - 1):size * l], centre, size * (l - 1))
            drifted = [upper(interval(upper_product(a, e)) + interval(drift)) for a, e in zip(L[-1], drifted)]
            # U_l: the image of U under the first l blocks, through their own constants' product or through the
            # prefix stack's certified constant (lemma prefix-chain), about the exact image of X
            rho = [min(upper(interval(r) + interval(drift)),
                       upper(interval(reach(prefix_constant(L, V, prefix, l, k), hoods[k], X.shape[0]))
                             + interval(drifted[k])))
                   for k, r in enumerate(rho)]
            radii.append(rho)
            # a radius past the float range gives this block (and the blocks after it) no bound at that eps
            finite = [k for k, r in enumerate(rho) if math.isfinite(r)]
            L.append([math.inf] * len(eps))
            V.append([math.inf] * len(eps))
            N.append(math.inf)
            piece = part(l)
            multiply(l, piece)
            moved = [math.inf] * len(eps)   # sup_(U_l) ||B_l(Y) - B_l(X~_l)||_F per eps (lemma block-reach)
            if finite:
                curve = block_curve(centre.points[size * l], first + l, "fro", (), [rho[k] for k in finite],
                                    report(l), None, **piece)
                for k, p in zip(finite, curve.points):
                    cpu[k] += p.cpu_seconds
                    L[-1][k], V[-1][k], moved[k] = p.certified, p.variation, p.reach
                N[-1] = curve.jacobian_norm
            prefix.append(settle(l, piece, N[-1]))
            piece = None
            release_products(centre, size * l, size * (l + 1))
            # the block before is read no more (this block's rounding reaches the next one): its per-block caches go
            release_block(*(component.target for component in chain[size * (l - 1):size * l]))
            return_freed_pages()
            if progress is not None:
                progress(l + 1, blocks, "blocks of the stack")
            rho = [min(upper_product(a, r), m) for a, r, m in zip(L[-1], rho, moved)]
        release_block(*(component.target for component in chain[size * (blocks - 1):]))
        #: certified ``||J~_L ... J~_1||`` (block 1 restricted to the moving tokens), inf without dense Jacobians
        self.jacobian_norm = prefix[-1]
        theorem = T.chain_variation(blocks)
        #: per eps, the CPU seconds of the blocks' own radii (the attention curve's in the first block's)
        self.cpu_seconds = cpu
        #: per block: its certified constants and variations per eps, its ``||DF(X~_l)||`` and the radii of its U_l
        self.blocks = [{"layer": first + l, "jacobian_norm": float(N[l]), "certified": [float(v) for v in L[l]],
                        "variation": [float(v) for v in V[l]], "radius": [float(v) for v in radii[l]]}
                       for l in range(blocks)]
        self.variation, self.product = [], []
        for k in range(len(eps)):
            values = {**{f"M_{{{l + 1}}}": L[l][k] for l in range(blocks)},
                      **{f"V_{{{l + 1}}}": V[l][k] for l in range(blocks)},
                      **{f"N_{{{l + 1}}}": N[l] for l in range(blocks)}}
            self.variation.append(min(_evaluated(theorem, values), composed_variation(L, V, prefix, blocks, k)))
            self.product.append(upper_product(*(L[l][k] for l in range(blocks))))


def release_products(centre: ChainCentre, start: int, stop: int) -> None:
    """Let the Jacobians' products of the attention enclosures among ``centre.enclosed[start:stop]`` go
    (:meth:`~lipbound.local.enclosed.EnclosedAttention.release_products`): a block's curve has read them, the stack's
    own radii read the enclosures' bounds only, and each block's stayed until the stack's end (about 0.2 GB a block at
    n = 20 on MiniLM)."""
    for enclosed in centre.enclosed[start:stop]:
        if isinstance(enclosed, EnclosedAttention):
            enclosed.release_products()


def composed_variation(L: list, V: list, prefix: list, count: int, k: int) -> float:
    """``sum_(j < count) (L_(count-1) ... L_(j+1)) V_j ||J~_(j-1) ... J~_0||`` at eps number k (theorem
    local-prefix-chain, blocks counted from 0): the telescoped variation of the first ``count`` blocks with the
    products of their Jacobians at the centres in place of the products of those Jacobians' norms; inf where a
    factor is."""
    values = {**{f"L_{{{m + 1}}}": L[m][k] for m in range(count)}, **{f"V_{{{j + 1}}}": V[j][k] for j in range(count)},
              **{rf"\pi_{{{j}}}": prefix[j] for j in range(1, count)}}
    return _evaluated(T.chain_prefix(count), values)


def _evaluated(theorem, values: dict) -> float:
    """The theorem's bound at these values, outward rounded; inf where a value is or where the bound leaves the
    float range (six blocks' constants of 1e98 multiply past it)."""
    if not all(math.isfinite(v) for v in values.values()):
        return math.inf
    try:
        with np.errstate(over="ignore", invalid="ignore"):   # the overflow is the answer, not a warning
            return float(evaluate_theorem(theorem, **{key: np.float64(v) for key, v in values.items()}))
    except NotCertifiedError:
        return math.inf


def prefix_constant(L: list, V: list, prefix: list, count: int, k: int) -> float:
    """A certified Lipschitz constant on U of the first ``count`` blocks: ``||J~_(count-1) ... J~_0|| +`` their
    composed variation (:func:`composed_variation`)."""
    return upper(interval(prefix[count]) + interval(composed_variation(L, V, prefix, count, k))) \
        if math.isfinite(prefix[count]) else math.inf
