"""Local certificates: how far real representations can move around a real input.

The global constants of :mod:`lipbound.numeric.certify` hold on the whole LayerNorm ball.  This
package certifies on a neighbourhood of a concrete input X -- a product of token balls
``U = {Y : ||y_j - x_j|| <= r_j}`` -- from facts measured on X in interval arithmetic (scores,
attention ranges, value and key norms, LayerNorm scales, GELU slope ranges), fed into the local
theorems of :mod:`lipbound.symbolic.local`:

* :mod:`.balls` -- token balls and the neighbourhoods a user names (Frobenius, (2,1), (2,inf)
  balls, "these tokens move");
* :mod:`.enclosed` -- rigorous evaluation of heads, attention layers, LayerNorms and feed-forward
  blocks at a point (values and Jacobian blocks as interval arrays);
* :mod:`.bounds` -- on token balls: per-token movement, the matrix of block Jacobian bounds and of
  block Jacobian variations, for each component;
* :mod:`.chains` -- the components a user names and their chains (head, layer, block, stack);
* :mod:`.curvature` -- the second derivative of attention on a neighbourhood (Gram route, split bound);
* :mod:`.grouped` -- the Jacobian's norm at X from its blocks between groups of tokens (inputs too long
  for the dense Jacobian);
* :mod:`.tail` -- a whole layer split at its attention's output: how far the per-token maps' Jacobian
  moves (the LayerNorms folded into the feed-forward block's second derivative);
* :mod:`.curve` -- the local Lipschitz constant ``L(eps)`` of a head, a layer, a block or a stack,
  certified and witnessed;
* :mod:`.path` -- the movement of one edit, certified along the segment between the inputs;
* :mod:`.propagate` -- a set of inputs (every edit in a set) pushed through the layers;
* :mod:`.candidates` -- edit sets edit by edit: each edited sentence a float point with certified
  radii, re-centred after every stage;
* :mod:`.candidate_groups` -- edit sets group by group: a ball of candidate words carried by the same
  stages, split where its bound is too wide;
* :mod:`.relational` -- the attention layer pushed through a Frobenius ball as affine forms;
* :mod:`.jacobian_forms` -- the attention layer's Jacobian bounded over the whole neighbourhood, path by
  path (value, query, key), as a variation and as a supremum.

Layer: above :mod:`lipbound.numeric` (it uses the model description, the attention engine and the
certified global constants), below :mod:`lipbound.measures`.
"""
