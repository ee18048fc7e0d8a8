"""The witness of ``L(eps)``: a point Y of ``U(X, eps)`` and the Jacobian norm there, found in floats.

Power iteration (JVP/VJP) gives the Frobenius norm at a point, the column or row maximisation of a dense float
Jacobian the mixed norms; projected ascent improves the point, its gradient the symmetric difference of VJPs
along the top singular direction, from X and from the best of :data:`SCREENED_STARTS` random points of U's
boundary (and from the further starts a caller hands in).  The same ascent on ``||DF(Y) - DF(X)||`` witnesses the
variation term.  Nothing here is certified: :mod:`lipbound.local.witness_check` re-checks a witness.
"""

from __future__ import annotations

import numpy as np

from .balls import Neighbourhood
from .chains import chain_forward, chain_jvp, chain_vjp

__all__ = ["SCREENED_STARTS", "ascent", "float_jacobian", "mixed_norm", "top_singular", "witness_value", "project",
           "screened_start", "larger", "uphill"]


def float_jacobian(chain, Y: np.ndarray, moving: np.ndarray, chunk: int = 512) -> np.ndarray:
    """Dense float Jacobian at Y, blocks ``(n_out, d_out, n_moving, d)``, from JVPs along ``chunk`` basis
    directions at a time (the whole basis at once would hold several copies of the Jacobian)."""
    n, d = Y.shape
    columns = np.flatnonzero(moving)
    out = None
    for begin in range(0, columns.size * d, chunk):
        index = np.arange(begin, min(begin + chunk, columns.size * d))
        basis = np.zeros((index.size, n, d))
        basis[np.arange(index.size), columns[index // d], index % d] = 1.0
        states = chain_forward(chain, np.broadcast_to(Y, basis.shape).copy())
        part = chain_jvp(states, basis)                 # (chunk, n, d_out)
        if out is None:
            out = np.empty((n, part.shape[-1], columns.size, d))
        out[:, :, index // d, index % d] = part.transpose(1, 2, 0)
    return out


def mixed_norm(J: np.ndarray, norm: str, iterations: int = 30) -> float:
    """Lower bound on the (2,1) or (2,inf) operator norm of a dense float Jacobian (n_out, d_out, m, d)."""
    best = 0.0
    if norm == "2,1":     # max over input tokens j of max_{|e|=1} sum_i ||B_ij e||
        for j in range(J.shape[2]):
            blocks = J[:, :, j, :]
            e = np.linalg.svd(blocks.reshape(-1, blocks.shape[-1]), full_matrices=False)[2][0]
            for _ in range(iterations):
                images = np.einsum("iad,d->ia", blocks, e)
                sizes = np.linalg.norm(images, axis=1, keepdims=True)
                e = np.einsum("iad,ia->d", blocks, images / np.where(sizes > 0, sizes, 1.0))
                e /= max(np.linalg.norm(e), 1e-300)
            best = max(best, float(np.sum(np.linalg.norm(np.einsum("iad,d->ia", blocks, e), axis=1))))
        return best
    for i in range(J.shape[0]):  # max over output tokens i of max_{||e_j|| <= 1} ||sum_j B_ij e_j||
        row = J[i]                                              # (d_out, m, d)
        y = np.linalg.svd(row.reshape(row.shape[0], -1), full_matrices=False)[0][:, 0]
        for _ in range(iterations):
            e = np.einsum("amd,a->md", row, y)
            e /= np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-300)
            y = np.einsum("amd,md->a", row, e)
            y /= max(np.linalg.norm(y), 1e-300)
        e = np.einsum("amd,a->md", row, y)
        e /= np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-300)
        best = max(best, float(np.linalg.norm(np.einsum("amd,md->a", row, e))))
    return best


def top_singular(chain, Y: np.ndarray, moving: np.ndarray, start: np.ndarray | None, seed: int, steps: int = 40,
                  reference=None):
    """Power iteration on ``M^T M`` restricted to the moving tokens, ``M = DF(Y)``, or ``DF(Y) - DF(X)`` with
    ``reference`` the chain's states at X: ``(sigma, E, G)``."""
    rng = np.random.default_rng(seed)
    states = chain_forward(chain, Y[None])

    def image(E):
        out = chain_jvp(states, E[None])[0]
        return out if reference is None else out - chain_jvp(reference, E[None])[0]

    def back(G):
        out = chain_vjp(states, G[None])[0]
        return out if reference is None else out - chain_vjp(reference, G[None])[0]

    E = rng.standard_normal(Y.shape) if start is None else start.copy()
    E *= moving[:, None]
    E /= max(np.linalg.norm(E), 1e-300)
    for _ in range(steps):
        E = back(image(E)) * moving[:, None]
        E /= max(np.linalg.norm(E), 1e-300)
    out = image(E)
    sigma = float(np.linalg.norm(out))
    return sigma, E, out / max(sigma, 1e-300)


def witness_value(chain, Y, moving, norm, seed, start=None):
    if norm == "fro":
        sigma, E, _ = top_singular(chain, Y, moving, start, seed)
        return sigma, E
    return mixed_norm(float_jacobian(chain, Y, moving), norm), start


def project(X: np.ndarray, Y: np.ndarray, hood: Neighbourhood, moving: np.ndarray) -> np.ndarray:
    """The point of ``U(X, eps)`` nearest to Y (a little inside)."""
    offset = (Y - X) * moving[:, None]
    eps = hood.eps * (1 - 1e-9)
    sizes = np.linalg.norm(offset, axis=1)
    if hood.ball == "fro":
        total = np.linalg.norm(offset)
        return X + offset * min(1.0, eps / total) if total > 0 else X.copy()
    if hood.ball in ("2,inf", "tokens"):
        return X + offset * np.minimum(1.0, eps / np.where(sizes > 0, sizes, 1.0))[:, None]
    if sizes.sum() <= eps:  # (2,1): project the row norms onto the l1 ball, keep directions
        return X + offset
    ordered = np.sort(sizes)[::-1]
    cumulative = np.cumsum(ordered)
    k = np.flatnonzero(ordered - (cumulative - eps) / np.arange(1, sizes.size + 1) > 0)[-1]
    threshold = (cumulative[k] - eps) / (k + 1)
    shrunk = np.maximum(sizes - threshold, 0.0)
    return X + offset * (shrunk / np.where(sizes > 0, sizes, 1.0))[:, None]


#: Random points of U screened per eps for the second start of the witness ascent (a generated head at
#: eps = 4, far beyond its LayerNorm image: 3.16 from X alone, 8.7-18.4 over five seeds with 16 points,
#: 23-36 with 64).
SCREENED_STARTS = 16
#: the first step of the climb from the best further start, as a share of eps, and the most steps it takes
STEP_SHARE = 0.05
UPHILL_STEPS = 40


def _gradient(chain, Y: np.ndarray, E: np.ndarray, G: np.ndarray, hood: Neighbourhood,
              moving: np.ndarray) -> np.ndarray:
    """The gradient in Y of ``<G, DF(Y) E>``: the symmetric difference of the VJPs of G at ``Y +- h E``."""
    h = 1e-4 * hood.eps + 1e-7
    states_plus = chain_forward(chain, (Y + h * E)[None])
    states_minus = chain_forward(chain, (Y - h * E)[None])
    return (chain_vjp(states_plus, G[None])[0] - chain_vjp(states_minus, G[None])[0]) / (2 * h) * moving[:, None]


def uphill(chain, X: np.ndarray, hood: Neighbourhood, moving: np.ndarray, Y: np.ndarray, seed: int,
           steps: int | None = None, share: float = STEP_SHARE, largest: float = 0.5) -> tuple:
    """``(sigma, Y', E)``: projected ascent on ``||DF(Y)||_2`` (Frobenius ball norms) from the point Y of
    ``U(X, eps)``, in steps of ``share`` eps along the gradient of ``<G, DF(Y) E>`` at the top singular pair (E, G),
    each kept only where the norm rises (the share then doubles, up to ``largest``) and halved where it does not,
    until the share falls below ``STEP_SHARE / 64`` or after ``steps`` (default :data:`UPHILL_STEPS`) steps.  The
    climb of :func:`ascent` steps a whole eps, which on MiniLM's layer 0 at 1e-1 R leaves the basin of a widened
    pair start (16.77 stays 16.77 where these steps reach 17.2).  The value never falls below Y's own, and Y' lies
    in U (every step is projected)."""
    sigma, E, G = top_singular(chain, Y, moving, None, seed, steps=25)
    for _ in range(UPHILL_STEPS if steps is None else steps):
        gradient = _gradient(chain, Y, E, G, hood, moving)
        size = np.linalg.norm(gradient)
        if not np.isfinite(size) or size == 0:
            break
        Z = project(X, Y + gradient * (share * hood.eps / size), hood, moving)
        rise, F, H = top_singular(chain, Z, moving, E, seed, steps=15)
        if rise > sigma:
            Y, sigma, E, G, share = Z, rise, F, H, min(2 * share, largest)
        else:
            share /= 2
            if share < STEP_SHARE / 64:
                break
    return sigma, Y, E


def screened_start(chain, X, hood, moving, seed):
    """The best of :data:`SCREENED_STARTS` random points on U's boundary by a short power iteration (even
    draws move every moving token, odd ones a single token: the corners of the (2,1) ball):
    ``(sigma, Y, E)``."""
    rng = np.random.default_rng(seed + 1)
    columns = np.flatnonzero(moving)
    best = (-1.0, X, None)
    for k in range(SCREENED_STARTS):
        offset = rng.standard_normal(X.shape)
        offset /= np.linalg.norm(offset, axis=1, keepdims=True)
        mask = moving if k % 2 == 0 else np.isin(np.arange(X.shape[0]), rng.choice(columns, 1))
        Y = project(X, X + offset * mask[:, None] * (2 * hood.eps), hood, moving)  # on the boundary
        sigma, E, _ = top_singular(chain, Y, moving, None, seed + k, steps=8)
        if sigma > best[0]:
            best = (sigma, Y, E)
    return best


def ascent(chain, X, hood, moving, norm, at_x, direction, steps, seed, change: bool = False, starts=()) -> tuple:
    """The largest Jacobian norm found in ``U(X, eps)`` (X itself, then projected ascent), or with ``change``
    the largest ``||DF(Y) - DF(X)||``.  The gradient of ``<G, DF(Y) E>`` in Y (the same for the change:
    ``DF(X)`` is constant) is the symmetric difference of VJPs along E; at X the change is 0, so its
    first step follows the Jacobian's own top direction.  For the Jacobian norm a second climb starts from
    the best of a few random points of U (:func:`screened_start`): from X the climb stays near X's own
    maximum (on the shortest sentence's attention layer at 0.3 R: 7.83 from X, 25.7 from the screened
    point).  ``starts``: more points of U to climb from, the best of them by its Jacobian norm (an attention layer's
    queries split between two keys, :func:`~lipbound.local.pair_starts.pair_starts`); in the Frobenius norm, where that
    start beats the other climbs, short uphill steps from it as well.  Returns ``(value, Y, E)``:
    the point and, in the Frobenius norm, the direction with ``||DF(Y) E|| / ||E||`` = value (X and ``direction``
    when nothing above ``at_x`` is found)."""
    best = (at_x, X, direction)
    if hood.eps == 0 or steps == 0:
        return best
    reference = chain_forward(chain, X[None]) if change else None
    dense_at_x = float_jacobian(chain, X, moving) if change and norm != "fro" else 0.0

    def value(Y, E):
        if norm == "fro":
            sigma, E, _ = top_singular(chain, Y, moving, E, seed, steps=25, reference=reference)
            return sigma, Y, E
        jacobian = float_jacobian(chain, Y, moving)
        jacobian -= dense_at_x
        return mixed_norm(jacobian, norm), Y, E

    def climb(Y, E, from_x):
        found = (0.0, Y, E)
        for step in range(steps):
            # from X the change is 0 and has no direction: the first step follows DF(X)'s own
            sigma, E, G = top_singular(chain, Y, moving, E, seed + step, steps=15,
                                        reference=None if from_x and step == 0 else reference)
            gradient = _gradient(chain, Y, E, G, hood, moving)
            size = np.linalg.norm(gradient)
            if not np.isfinite(size) or size == 0:
                break
            Y = project(X, Y + gradient * (hood.eps / size), hood, moving)
            found = larger(found, value(Y, E))
        return found

    best = larger(best, climb(X.copy(), direction, True))
    if change:  # (the change's witness only shows where a gap comes from: one climb is enough there)
        return best
    _, Y, E = screened_start(chain, X, hood, moving, seed)
    best = larger(best, value(Y, E), climb(Y, E, False))
    if starts:
        found = [(top_singular(chain, Z, moving, None, seed, steps=25), Z) for Z in
                 (project(X, Z, hood, moving) for Z in starts)]
        (sigma, E, _), Y = max(found, key=lambda item: item[0][0])
        # the short steps only from a start that already beats the climbs from X and the screened point (at small
        # radii the starts sit in X's basin, and those steps would cost a second of nothing)
        short = norm == "fro" and sigma > best[0]
        best = larger(best, (sigma, Y, E), climb(Y, E, False))
        if short:
            best = larger(best, uphill(chain, X, hood, moving, Y, seed))
    return best


def larger(*found: tuple) -> tuple:
    """The ``(value, Y, E)`` of largest value (the first on ties)."""
    return max(found, key=lambda item: item[0])
