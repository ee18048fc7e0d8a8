r"""The setting of a theorem as mathematics: where the tokens live, the norm, the sizes, the facts.

:func:`assumption_items` reads the :class:`~lipbound.symbolic.assumptions.Assumptions` a result
was derived under (``Bound.stated``) and writes each as a sentence with inline mathematics --
``$\|x_i\|_2 \le R$ for every token'' rather than ``domain: ... <= R'' -- and
:func:`assumption_list` wraps them in an ``enumerate``.  A sizes line appears only for sizes given
as numbers; the self-attention of every token only where a theorem needs it (L2 scores).
"""

from __future__ import annotations

from ..symbolic import symbols as S
from ..symbolic.assumptions import Assumptions, Ball, Domain, LayerNormImage, RMSNormImage, Unbounded
from .latex import LipboundLatexPrinter, latex
from .prose import text_to_latex

__all__ = ["assumption_items", "assumption_list", "domain_sentence", "NORM_SENTENCES"]

#: How each norm on X reads in a theorem.
NORM_SENTENCES = {
    "fro": r"inputs and outputs are measured in the Frobenius norm $\|X\|_F = (\sum_i \|x_i\|_2^2)^{1/2}$",
    "2,1": r"inputs and outputs are measured in the $(2,1)$ norm $\|X\|_{2,1} = \sum_i \|x_i\|_2$",
    "2,inf": r"inputs and outputs are measured in the $(2,\infty)$ norm $\|X\|_{2,\infty} = \max_i \|x_i\|_2$",
    "inf": r"inputs and outputs are measured in the norm $\|\operatorname{vec} X\|_\infty = \max_{i,k} |X_{ik}|$",
    "w1": (r"inputs and outputs are probability measures, at Wasserstein-1 distance $W_1$ "
           r"(Euclidean ground cost)"),
}


def _centre(domain) -> str:
    return "0" if getattr(domain, "center", None) is None else latex(domain.center)


def domain_sentence(domain: Domain, tokens: str = "x_i", count: str = "n") -> str:
    """Where ``tokens`` live, as a sentence with inline mathematics."""
    if isinstance(domain, Ball):
        radius = latex(domain.radius)
        if domain.center is None:
            return (rf"every token lies in a ball about the origin: $\|{tokens}\|_2 \le {radius}$ "
                    rf"for $i = 1, \dots, {count}$")
        return (rf"every token lies in a ball about ${_centre(domain)}$: "
                rf"$\|{tokens} - {_centre(domain)}\|_2 \le {radius}$ for $i = 1, \dots, {count}$")
    if isinstance(domain, LayerNormImage):
        centre = _centre(domain)
        return (rf"every token is an output of a LayerNorm: ${tokens} = \gamma \odot z_i + {centre}$ with "
                rf"$z_i \perp \mathbf{{1}}$, $\|z_i\|_2 \le \sqrt{{{latex(domain.dim)}}}$ and "
                rf"$\|\gamma\|_\infty \le {latex(domain.gain)}$, for $i = 1, \dots, {count}$")
    if isinstance(domain, RMSNormImage):
        return (rf"every token is an output of an RMSNorm: ${tokens} = \gamma \odot u_i$ with "
                rf"$\|u_i\|_2 < \sqrt{{{latex(domain.dim)}}}$ and $\|\gamma\|_\infty \le {latex(domain.gain)}$, "
                rf"for $i = 1, \dots, {count}$")
    if isinstance(domain, Unbounded):
        return rf"the tokens are unconstrained: $X \in \mathbb{{R}}^{{{count} \times d}}$"
    return text_to_latex(domain.describe())


def assumption_items(result) -> list[str]:
    """The assumptions of a derived result (:class:`~lipbound.symbolic.bound.Bound` or
    :class:`~lipbound.symbolic.bound.NotLipschitz`), one LaTeX sentence each.  Without the
    assumptions object (a result built by hand), the stored text is converted."""
    stated = getattr(result, "stated", None)
    if not isinstance(stated, Assumptions):
        return [text_to_latex(text) for text in result.assumptions]
    items = []
    if stated.query_domain is not None:
        items.append("the context: " + domain_sentence(stated.domain))
        items.append("the queries: " + domain_sentence(stated.query_domain, "y_i", latex(stated.m)))
    else:
        items.append(domain_sentence(stated.domain))
    items.append(NORM_SENTENCES.get(stated.norm.key, text_to_latex(stated.norm.title)))
    given = [f"{latex(getattr(S, name))} = {latex(getattr(stated, name))}"
             for name in ("n", "m", "d", "d_k", "d_v", "H") if getattr(stated, name).is_Number]
    if given:
        items.append("the sizes are $" + "$, $".join(given) + "$")
    facts = getattr(result, "facts", None)
    if stated.tied is not None and (facts is None or facts.score == "l2"):
        items.append(r"the query and key weights are tied: $W_Q = W_K = W$" if stated.tied
                     else r"the query and key weights are not tied")
    if facts is not None and facts.score == "l2" and stated.self_attends is not None:
        items.append(r"every token attends to itself (no diagonal mask)" if stated.self_attends
                     else r"the diagonal is masked: no token attends to itself")
    printer = LipboundLatexPrinter()
    for fact in stated.facts:
        vector = printer.doprint(fact.vector)
        items.append(rf"$\|{vector}\|_2 \ge {printer.doprint(fact.bound)}$ for every token of the domain")
    return items


def assumption_list(result, extra=()) -> str:
    r"""``\begin{enumerate}`` of :func:`assumption_items`, then ``extra`` (hypotheses of the score
    or the theorem, ASCII mathematics converted)."""
    items = assumption_items(result) + [text_to_latex(text) for text in extra]
    return "\\begin{enumerate}\n" + "".join(f"  \\item {item[:1].upper() + item[1:]}.\n" for item in items) \
        + "\\end{enumerate}\n"
