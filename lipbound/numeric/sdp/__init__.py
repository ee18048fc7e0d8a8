"""SDP relaxations and matrix-aware certified constants for dot-product attention.

* :mod:`.certify` -- enclosure arithmetic, certified eigenvalue bounds, :class:`CertifiedBound`;
* :mod:`.joint` -- matrix-aware replacements of norm products (``gamma_{A,V}``, the
  trust-region ``beta``, LayerNorm-image constants), each an exact SDP or secular equation
  with a rigorous re-check;
* :mod:`.head` -- a relaxation of the local Lipschitz problem of one head;
* :mod:`.registry` -- :data:`SDP_RELAXATIONS`, keyed by the symbolic variant class.

cvxpy is imported only when a conic solver runs.
"""

from .certify import (CertifiedBound, Enclosure, is_psd_certified, lambda_max_upper, lambda_min_lower,
                      spectral_norm_upper)
from .head import (HeadBounds, closed_form_cross_attention, closed_form_self_attention, cross_attention_bound,
                   matrix_aware_closed_form, measure_attention_bound, self_attention_bound)
from .joint import (JointRange, gamma_AV, joint_gain, key_gradient_sup, layernorm_joint_gain,
                    layernorm_value_spread)
from .registry import SDP_RELAXATIONS, relax

__all__ = ["CertifiedBound", "Enclosure", "is_psd_certified", "lambda_max_upper", "lambda_min_lower",
           "spectral_norm_upper", "HeadBounds", "closed_form_self_attention", "closed_form_cross_attention",
           "cross_attention_bound", "measure_attention_bound", "matrix_aware_closed_form", "self_attention_bound",
           "JointRange", "gamma_AV",
           "joint_gain", "key_gradient_sup", "layernorm_joint_gain", "layernorm_value_spread",
           "SDP_RELAXATIONS", "relax"]
