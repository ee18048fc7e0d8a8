"""SDP relaxations and matrix-aware certified constants for dot-product attention.

* :mod:`.joint` -- matrix-aware replacements of norm products (``gamma_{A,V}``, the
  trust-region ``beta``, LayerNorm-image constants), each an exact SDP or secular equation
  with a rigorous re-check;
* :mod:`.region` -- where tokens live (balls and ellipsoids such as LayerNorm images) and the
  trust-region supremum over them;
* :mod:`.head` -- a relaxation of the local Lipschitz problem of one head;
* :mod:`.layer` -- a whole multi-head layer, its heads seen jointly with ``W_O``;
* :mod:`.registry` -- :data:`SDP_RELAXATIONS`, keyed by the symbolic variant class.

Every result is a :class:`~lipbound.rigorous.value.CertifiedValue` whose number comes from a
re-check in :mod:`lipbound.rigorous.linalg`, never from a solver's objective.  cvxpy is
imported only when a conic solver runs.
"""

from .head import (
                    HeadBounds,
                    cross_attention_bound,
                    matrix_aware_closed_form,
                    measure_attention_bound,
                    self_attention_bound,
)
from .joint import JointRange, gamma_AV, joint_gain, layernorm_joint_gain, layernorm_value_spread, sdp_value
from .layer import layer_head_bounds, layer_joint_bound
from .region import Region, key_gradient_sup, trust_region_sup
from .registry import SDP_RELAXATIONS, relax

__all__ = ["HeadBounds", "cross_attention_bound", "measure_attention_bound", "matrix_aware_closed_form",
           "self_attention_bound", "JointRange", "gamma_AV", "joint_gain", "key_gradient_sup",
           "layernorm_joint_gain", "layernorm_value_spread", "sdp_value", "SDP_RELAXATIONS", "relax",
           "layer_head_bounds", "layer_joint_bound", "Region", "trust_region_sup"]
