"""Witnesses: inputs where attention really stretches (certified lower bounds).

The domain is ``D^n``, D a ball ``||x - c|| <= R`` or the image of a LayerNorm (an ellipsoid in a
hyperplane, :mod:`lipbound.numeric.domains`), a convex set, and ``f`` is smooth, so for the
Frobenius norm

    Lip(f; D^n) = sup_{X in D^n} ||Df(X)|| on tangent directions  >=  ||Df(X)[E]||_F / ||E||_F

for any X in ``D^n`` and any E != 0 whose rows are directions the tokens move in (all directions for
a ball), and for any norm ``Lip(f; D^n) >= ||f(X) - f(Y)|| / ||X - Y||`` for ``X, Y in D^n``.
Cross-attention (``role`` "cross-queries", "cross-context", "cross-joint") moves the m queries, the
n context tokens or both, each in its own domain; :mod:`.problem` holds the map, the role and the
charts of the domains.  A
:class:`~.record.Witness` stores such an ``(X, E)`` ("jacobian") or ``(X, Y)`` ("secant") with the
value it certifies; :func:`lipbound.numeric.recheck.recheck` recomputes that value in
high precision from the stored floats, so anyone can check it.

The search (:func:`search_witness`) exploits the structure of dot-product attention.
With ``A = W_Q W_K^T / sqrt(d_k)`` and ``u = W_K b_Q / sqrt(d_k)`` the score is
``s(x, y) = x^T A y + u . y`` up to terms in ``x`` alone (which softmax ignores), and

    Df_i[E] = sum_j p_ij W_V^T e_j + Cov_{j~p_i}(ds_ij, v(x_j)),
    ds_ij   = (A x_j) . e_i + (A^T x_i + u) . e_j                       .

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
(:func:`.structured.predicted_norm` refines it with the attention the queries keep on each other),
which :func:`structured_starts` maximises over unit ``a, b`` by batched Riemannian Adam with the tie
imposed exactly.  On an ellipsoid (a LayerNorm image, whose semi-axes span orders of magnitude)
positions are chart points and moves are measured in the tokens' own coordinates
(:mod:`.structured`): the key gradient ``g = b S A + u`` is taken in the tokens' coordinates, the
tie and the value spread in the chart.  Rather than asking the queries' own score to be low,
the keys' midpoint is lifted along the chart gradient until both keys score ``margin`` above
the queries (a small shift on real scores).  Cross-attention uses the same construction in the
charts of its two domains, for the role's terms (beta-type for the context, alpha-type for the
queries, both jointly), the other context tokens parked where the queries' scores are lowest.
The best candidates (with Castin et al.'s input, random inputs and a radius
continuation from R/4) are polished by a batched L-BFGS ascent of the local Jacobian norm
``sigma_max(Df(X))`` in smooth coordinates of the domain (all of them for 30% of the polish's work, then the best
alone: :func:`.ascent.polish_best`): power iteration (JVP/VJP) for the top
right singular vector E, and ``grad_X ||Df(X) E||`` by a second-order (reverse-over-forward)
formula.  A head sees a token only through ``x W_Q``, ``x W_K``, ``x W_V``, so a single head
is searched in the orthonormal basis of that span (at most ``3 d_k`` coordinates per token)
without loss, and its power iteration runs in output space through ``n x n`` Gram sandwiches
(:meth:`_Linearization._gram_step`).  For a multi-head layer every head contributes its
structured inputs, a greedy step ties further heads at the same input (:class:`.starts.TieSurrogate`),
and the polish runs on the layer map; a rotary layer first scouts its heads, each through its block of ``W_O`` in
its own chart (:mod:`.layer_starts`).  The best candidate's value is recomputed from scratch
in float64 with :mod:`lipbound.numeric.attention`, at a point that lies in the domain exactly.

Every deadline of the search is read on a :class:`~.clock.WorkClock`, which counts the work
done rather than the time spent, so a budget buys the same steps on any machine and the seed
alone fixes the witness.

Modules: :mod:`.record` (the witness file), :mod:`.engine` (batched Jacobian norms on the attention engine),
:mod:`.problem` (the map, its argument and the charts of its domains), :mod:`.structured` (two keys tied for many
queries, on balls and ellipsoids, self- and cross-attention), :mod:`.starts` (several heads tied
at once, cross-attention inputs, Castin et al.'s input), :mod:`.kernel_starts` (the starts of each attention kernel),
:mod:`.spread_starts` (rotary keys tied for queries at their own points),
:mod:`.layer_starts` (a rotary layer's heads scouted alone through ``W_O``, tied together and combined),
:mod:`.ascent` (the polish), :mod:`.values` (final values from scratch), :mod:`.clock` (the work
clock), :mod:`.search` (the public searches).
"""

from .engine import engine_for, jacobian_norms
from .record import WITNESS_FORMAT, Witness, in_ball, project_to_ball
from .search import castin_adversarial, naive_ascent, search_witness
from .structured import structured_starts
from .values import local_jacobian_norm

__all__ = ["Witness", "WITNESS_FORMAT", "engine_for", "jacobian_norms", "search_witness", "naive_ascent",
           "castin_adversarial", "structured_starts", "local_jacobian_norm", "in_ball", "project_to_ball"]
