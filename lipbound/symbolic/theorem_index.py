"""What each general theorem is about, in one line: the descriptions ``lipbound list`` prints.

A theorem id is a family and, for most, the norm it is stated in (``self-attention-fro``,
``cross-attention-queries-2inf``, ``layernorm-global-inf``).  :data:`THEOREM_FAMILIES` describes
each family, :data:`NORM_SUFFIXES` each norm; :func:`describe_theorem` joins them.  A new theorem
needs its family here (``tests/test_cli.py`` checks that every theorem ``lipbound list`` shows
has a description).
"""

from __future__ import annotations

from ..errors import AssumptionError

__all__ = ["THEOREM_FAMILIES", "NORM_SUFFIXES", "describe_theorem"]

#: Theorem family (the id without its norm suffix) -> what it bounds.
THEOREM_FAMILIES: dict[str, str] = {
    "self-attention": "one softmax head on a bounded domain, from its kernel constants L_V, rho, alpha, beta, omega",
    "self-attention-causal": "one causal (masked) softmax head on a bounded domain, from its kernel constants",
    "cross-attention-queries": "cross-attention as a map of its m queries, the context fixed",
    "cross-attention-context": "cross-attention as a map of its n context tokens, the queries fixed",
    "cross-attention-joint": "cross-attention as a map of its queries and its context together",
    "multi-head-self-attention": "multi-head self-attention sum_h f^h(X) W_O^h, from the heads' bounds",
    "residual-self-attention": "one head with its residual, X + f(X)",
    "residual-multi-head-self-attention": "multi-head self-attention with its residual, X + MHA(X)",
    "sigmoid-attention": "sigmoid attention sigma(s + b), no row normalisation, on a bounded domain",
    "measure-w1-uniform": "self-attention on uniform empirical measures of n tokens, in Wasserstein-1",
    "measure-w1-mean-field": "self-attention on measures of any size (mean-field), in Wasserstein-1",
    "measure-w1-cross-queries": "cross-attention on measures, in the query measure, in Wasserstein-1",
    "measure-w1-cross-context": "cross-attention on measures, in the context measure, in Wasserstein-1",
    "residual-measure-w1-uniform": "x + attention pushed forward on uniform measures, in Wasserstein-1",
    "layernorm-global": "LayerNorm on all of R^d: ||diag(gamma) P||_2 / sqrt(eps)",
    "layernorm-variance-floor": "LayerNorm on tokens whose variance is at least sigma_min^2",
    "rmsnorm-global": "RMSNorm on all of R^d",
    "rmsnorm-variance-floor": "RMSNorm on tokens whose mean square is at least sigma_min^2",
    "feed-forward": "a feed-forward block W_2^T phi(W_1^T x + b_1) + b_2, token by token",
    "pre-ln-feed-forward": "x + FFN(LN(x)), the pre-LN feed-forward step (GPT-2, Whisper)",
    "post-ln-feed-forward": "LN(x + FFN(x)), the post-LN feed-forward step (BERT)",
    "self-attention-window": "one softmax head under a sliding window |i - j| < w, on a bounded domain",
    "self-attention-causal-window": "one causal softmax head under a sliding window 0 <= i - j < w",
    "self-attention-causal-alibi": "one causal softmax head with ALiBi biases -m |i - j| added to its scores",
    "self-attention-relative-bias": "one softmax head with relative position biases (T5) of spread Delta_b per row",
    "grouped-multi-head-self-attention": "grouped-query (and multi-query) attention: heads of a key/value group share "
                                         "W_K and W_V, one block of W_O per query head",
    "gated-feed-forward-silu": "a gated feed-forward block W_down^T (SiLU(W_gate^T x) * W_up^T x) on a bounded "
                               "domain (SwiGLU)",
    "gated-feed-forward-gelu": "a gated feed-forward block with the exact GELU gate on a bounded domain (GeGLU)",
    "gated-feed-forward-gelu-new": "a gated feed-forward block with the tanh-approximated GELU gate on a bounded "
                                   "domain (GeGLU, Gemma)",
    "not-lipschitz-swiglu": "SwiGLU on all of R^d is not Lipschitz (a witness family along the gate and up rows)",
    "not-lipschitz-geglu": "GeGLU on all of R^d is not Lipschitz (a witness family along the gate and up rows)",
    "not-lipschitz-geglu-tanh": "GeGLU with the tanh gate on all of R^d is not Lipschitz (a witness family)",
    "pre-rmsnorm-swiglu": "x + SwiGLU(RMSNorm(x)), the pre-norm gated feed-forward step (Llama, Qwen, Mistral)",
    "sandwich-pre-rmsnorm-geglu-tanh": "x + RMSNorm(GeGLU(RMSNorm(x))), the sandwich-norm feed-forward step "
                                       "(Gemma 2/3)",
    "layerscale-residual": "x + diag(lambda) F(x), a residual step with a LayerScale gain",
    "sandwich-residual": "x + N_out(F(N_in(x))), a residual step with a norm before and after its branch",
    "pre-norm-residual": "x + F(N(x)) from the constants of F and N",
    "post-norm-residual": "N(x + F(x)) from the constants of F and N",
}

#: Norm suffix of a theorem id -> the norm, as the description ends.
NORM_SUFFIXES: dict[str, str] = {
    "fro": "Frobenius norm on X",
    "21": "(2,1) norm: the sum of the token norms",
    "2inf": "(2,inf) norm: the largest token norm",
    "inf": "l_inf norm on vec X",
}


def describe_theorem(theorem_id: str) -> str:
    """``"self-attention-fro"`` -> ``"one softmax head ...; Frobenius norm on X"``."""
    if theorem_id in THEOREM_FAMILIES:
        return THEOREM_FAMILIES[theorem_id]
    family, _, suffix = theorem_id.rpartition("-")
    if family in THEOREM_FAMILIES and suffix in NORM_SUFFIXES:
        return f"{THEOREM_FAMILIES[family]}; {NORM_SUFFIXES[suffix]}"
    raise AssumptionError("theorem_id", "a theorem with a description", repr(theorem_id),
                          "add its family to lipbound.symbolic.theorem_index.THEOREM_FAMILIES")
