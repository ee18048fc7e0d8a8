"""Attention kernels: one object per score, registered, owning its facts, its scores with their
derivatives, its use of positions and its weights; and the masks and position terms between scores
and weights.

* :mod:`.base` -- :class:`AttentionKernel`, :class:`KernelFacts`, :class:`ScoreMap`, :data:`KERNELS`;
* :mod:`.weights` -- the one float softmax and sigmoid weights;
* :mod:`.masks` -- :class:`AttentionMask` (causal, window, position bias, soft-cap), :class:`ALiBi`,
  :class:`T5Bias`, and :class:`HeadMasks` for the heads of a layer;
* :mod:`.scores` -- :class:`DotProduct`, :class:`L2Distance`, :class:`ScaledCosine`;
* :mod:`.rotary` -- :class:`Rotary` (RoPE); :mod:`.qknorm` -- :class:`QKNorm`;
* :mod:`.nonsoftmax` -- :class:`Sigmoid`, :class:`FeatureMap` (linear attention);
* :mod:`.custom` -- :class:`CustomKernel`, a user-defined score compiled to numpy.

docs/architecture.md says how to add a kernel.
"""

from .base import KERNELS, AttentionKernel, KernelFacts, ScoreMap, default_scale, kernel_from_arrays, reduce_to
from .custom import CustomKernel
from .masks import ALiBi, AttentionMask, HeadMasks, T5Bias, t5_buckets
from .nonsoftmax import FeatureMap, Sigmoid
from .qknorm import QKNorm
from .rotary import Rotary
from .scores import DotProduct, L2Distance, ScaledCosine
from .weights import SOFTMAX, SigmoidWeights, Softmax, Weights, softmax

__all__ = ["KERNELS", "AttentionKernel", "KernelFacts", "ScoreMap", "default_scale", "kernel_from_arrays", "reduce_to",
           "DotProduct", "L2Distance", "ScaledCosine", "Rotary", "QKNorm", "Sigmoid", "FeatureMap", "CustomKernel",
           "AttentionMask", "ALiBi", "T5Bias", "HeadMasks", "t5_buckets", "Weights", "Softmax", "SigmoidWeights",
           "SOFTMAX", "softmax"]
