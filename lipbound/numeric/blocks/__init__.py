"""Token-wise blocks around attention: normalisations, feed-forward blocks, residual blocks.

* :mod:`.activations` -- the activations in floating point (forward, slope, curvature) and their
  certified slope ranges;
* :mod:`.norms` -- LayerNorm and RMSNorm as maps: Jacobian, certified constants (global and with
  a variance floor);
* :mod:`.ffn` -- feed-forward blocks: Jacobian, the closed form and the midpoint form;
* :mod:`.certify` -- a block theorem of :mod:`lipbound.symbolic.blocks` evaluated in interval
  arithmetic;
* :mod:`.constants` -- every constant of a block side by side, the residual rule on certified
  numbers, the image of a normalisation (the domain of the next block).

LipSDP-Neuron lives with the other relaxations (:mod:`lipbound.numeric.sdp.ffn`), the witnesses
with the others (:mod:`lipbound.numeric.witness.blocks`).  Every function takes plain arrays
(or the model description's LayerNorm and FeedForward) and returns plain data: certified values.
"""
