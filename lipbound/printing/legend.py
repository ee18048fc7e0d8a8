r"""The symbol legend of a statement: every symbol it contains, with its definition.

:func:`legend_entries` collects the symbols of SymPy expressions -- sizes, radii, kernel
constants, the matrices inside norm symbols (``\|W_K b_Q\|_2`` gives :math:`W_K` and :math:`b_Q`),
named matrices (:math:`A`), the column-sum functions -- and pairs each with its definition from
:data:`MEANINGS` (the same definitions as ``docs/symbols.md``).  A symbol without a definition is
an error, so that no printed statement uses an undefined symbol.  :func:`legend_latex` writes the
entries as a ``description`` list.
"""

from __future__ import annotations

import sympy as sp

from ..errors import AssumptionError
from ..symbolic import symbols as S
from ..symbolic.calculus import Inner, Norm, SoftNorm
from ..symbolic.nonsoftmax import FeatureMap
from ..symbolic.record import Described
from .latex import LipboundLatexPrinter, symbol_latex

__all__ = ["MEANINGS", "FUNCTION_MEANINGS", "legend_entries", "legend_latex"]

#: Symbol name -> its definition (LaTeX prose), as in docs/symbols.md.
MEANINGS: dict[str, str] = {
    "n": r"number of tokens (the keys and values; the context of cross-attention)",
    "m": r"number of queries of cross-attention",
    "d": r"token width: every token is in $\mathbb{R}^d$",
    "d_k": r"query and key width of a head",
    "d_v": r"value width of a head",
    "H": r"number of heads of a layer",
    "R": r"radius of the ball holding every token",
    "gamma_max": r"largest gain of the LayerNorm or RMSNorm whose outputs the tokens are, $\|\gamma\|_\infty$",
    "tau": r"scale (temperature) of the score",
    "epsilon": (r"regulariser of the normalised score (of the RMSNorm on queries and keys under QK-norm), "
                r"$\varepsilon > 0$"),
    "x": r"a query token, a column vector of $\mathbb{R}^d$",
    "y": r"a key token, a column vector of $\mathbb{R}^d$",
    "W_Q": r"query projection ($d \times d_k$): the query is $W_Q^\top x$",
    "W_K": r"key projection ($d \times d_k$): the key is $W_K^\top y$",
    "W_V": r"value projection ($d \times d_v$)",
    "W_O": r"output projection of a layer ($H d_v \times d$)",
    "W": r"the tied projection of L2 attention, $W_Q = W_K = W$",
    "b_Q": r"query bias",
    "b_K": r"key bias",
    "b_V": r"value bias: the value map is $v(y) = V^\top y + b_V$",
    "c": r"centre of the domain (the LayerNorm bias for a LayerNorm image)",
    "A": r"$A = W_Q W_K^\top / \sqrt{d_k}$, the matrix of the bilinear part of the score",
    "A_tied": r"$A = W W^\top / \sqrt{d_k}$ (tied weights)",
    "gamma_{A,V}": r"$\max_{\|u\|_2 = 1} \|A u\|_2 \|W_V^\top u\|_2$",
    "L_V": r"Lipschitz constant of the value map: $\|V\|_2$",
    "rho": r"value spread, $\sup_y \|v(y) - v(c)\|_2$ over the domain",
    "alpha": (r"query sensitivity: $\operatorname{std}_{j \sim p_i}(\nabla_x s(x_i, x_j) \cdot e) \le \alpha \|e\|_2$ "
              r"for every weight vector $p_i$"),
    "beta": r"key sensitivity, $\sup \|\nabla_y s(x, y)\|_2$ over the domain",
    "omega": r"score spread, $\sup_{x, y, y'} |s(x, y) - s(x, y')|$ over the domain",
    "nu": r"value magnitude, $\sup_y \|V^\top y + b_V\|_2$ over the domain",
    "eta": r"query gradient bound, $\sup \|\nabla_x s(x, y)\|_2$ over the domain",
    "s_max": r"an upper bound on the score over the domain",
    "Lip": (r"$\operatorname{Lip}(f)$: the smallest $L$ with $\|f(X) - f(X')\| \le L \|X - X'\|$ for all inputs "
            r"$X, X'$ of the domain"),
    "norms": r"$\|M\|_2$ is the spectral norm of a matrix $M$, $\|u\|_2$ the Euclidean norm of a vector $u$",
    "inf-norms": r"$\|M\|_\infty$ is the largest absolute row sum of a matrix $M$",
    "lower": r"a positive lower bound stated in the assumptions",
    "soft-norm": r"the regularised norm $(\|u\|_2^2 + \varepsilon)^{1/2}$ of a vector $u$",
    "eps": r"the variance regulariser of a LayerNorm or RMSNorm, $\varepsilon > 0$",
    "sigma_min": r"a stated floor: every token's variance (RMSNorm: mean square) is at least $\sigma_{\min}^2$",
    "D_gamma": r"$\operatorname{diag}(\gamma)$, the gain of the normalisation",
    "Pi": r"the centring projection $I - \mathbf{1} \mathbf{1}^\top / d$ ($\Pi = I$ for RMSNorm)",
    "d_ff": r"hidden width of a feed-forward block",
    "W_1": r"first feed-forward weight ($d \times d_{\mathrm{ff}}$): $f(x) = W_2^\top \varphi(W_1^\top x + b_1) + b_2$",
    "W_2": r"second feed-forward weight ($d_{\mathrm{ff}} \times d$)",
    "ell_phi": r"$\ell_\varphi = \max(|\alpha_\varphi|, |\beta_\varphi|)$, the largest slope of the activation "
               r"$\varphi$, whose secant slopes lie in the certified range $[\alpha_\varphi, \beta_\varphi]$",
    "L_F": r"a Lipschitz constant of the inner map $F$ of a residual block, on the image of its normalisation",
    "L_N": r"a Lipschitz constant of the normalisation $N$ of a residual block",
    "L_N'": (r"a Lipschitz constant of the normalisation $N'$ after the branch (sandwich norms), "
             r"on all of $\mathbb{R}^d$"),
    "w": (r"width of a sliding window: token $i$ attends to the tokens $j$ with $|i - j| < w$ "
          r"($0 \le i - j < w$ when causal)"),
    "G": r"number of key/value groups of grouped-query attention (the $H$ query heads share $G$ key and value maps)",
    "a": (r"$a = \max_\Delta \|A_\Delta\|_2$, $A_\Delta = W_Q R_\Delta W_K^\top / \sqrt{d_k}$, "
          r"over the offsets $\Delta = p_j - p_i$ that occur: $2n - 1$ of them in self-attention, "
          r"the $n$ causal ones under a causal mask, those inside the window under a sliding window"),
    "g_Q": (r"$\max_\Delta \|W_K R_\Delta^\top (W_Q^\top c_Q + b_Q)\|_2 / \sqrt{d_k}$ over the offsets that occur, "
            r"$c_Q$ the centre of the queries' domain ($0$ for a ball about the origin): "
            r"the key gradient at that centre"),
    "g_K": (r"$\max_\Delta \|W_Q R_\Delta (W_K^\top c + b_K)\|_2 / \sqrt{d_k}$ over the offsets that occur, "
            r"$c$ the centre of the keys' domain: the query gradient at that centre"),
    "s_c": (r"$\max_\Delta |(W_Q^\top c_Q + b_Q)^\top R_\Delta (W_K^\top c + b_K)| / \sqrt{d_k}$ over the offsets that "
            r"occur: the score of the two centres"),
    "R_Delta": (r"the rotation between a query and a key $\Delta$ positions apart, $R(\theta p_i)^\top R(\theta p_j)$: "
                r"block-diagonal $2 \times 2$ rotations, orthogonal"),
    "gamma_q": r"largest gain of the query normalisation of QK-norm, $\|\gamma_q\|_\infty$",
    "gamma_k": r"largest gain of the key normalisation of QK-norm, $\|\gamma_k\|_\infty$",
    "gamma_qk": r"$\max_l |\gamma_{q,l} \gamma_{k,l}|$, the largest product of the query and key gains of QK-norm",
    "D_q": r"$\operatorname{diag}(\gamma_q)$, the gain of the query normalisation",
    "D_k": r"$\operatorname{diag}(\gamma_k)$, the gain of the key normalisation",
    "c_cap": r"the soft cap of the logits: the score is $c_{\mathrm{cap}} \tanh(s / c_{\mathrm{cap}})$",
    "m_A": r"the slope of ALiBi: the bias of a key $t$ positions from its query is $-m_A t$",
    "Delta_b": r"the largest spread of the position biases over a row, $\max_i (\max_j b_{ij} - \min_j b_{ij})$",
    "lambda_max": r"largest gain of LayerScale, $\|\lambda\|_\infty$",
    "gamma_post": r"largest gain of the RMSNorm after the branch (sandwich norms), $\|\gamma'\|_\infty$",
    "W_gate": (r"gate weight of a gated block ($d \times d_{\mathrm{ff}}$): "
               r"$f(x) = W_{\mathrm{down}}^\top (\varphi(W_{\mathrm{gate}}^\top x) \odot W_{\mathrm{up}}^\top x)$"),
    "W_up": r"up weight of a gated block ($d \times d_{\mathrm{ff}}$)",
    "W_down": r"down weight of a gated block ($d_{\mathrm{ff}} \times d$)",
    "Gamma_up": (r"$\|W_{\mathrm{down}}^\top D_u^{1/2}\|_2 \|D_u^{1/2} W_{\mathrm{gate}}^\top\|_2$ with "
                 r"$D_u = \operatorname{diag}(\|W_{\mathrm{up}}[:, i]\|_2)$: at most "
                 r"$\mu_{\mathrm{up}} \|W_{\mathrm{down}}\|_2 \|W_{\mathrm{gate}}\|_2$"),
    "Gamma_gate": (r"$\|W_{\mathrm{down}}^\top D_g^{1/2}\|_2 \|D_g^{1/2} W_{\mathrm{up}}^\top\|_2$ with "
                   r"$D_g = \operatorname{diag}(\|W_{\mathrm{gate}}[:, i]\|_2)$: at most "
                   r"$\mu_{\mathrm{gate}} \|W_{\mathrm{down}}\|_2 \|W_{\mathrm{up}}\|_2$"),
    "mu_up": r"largest column norm of $W_{\mathrm{up}}$, $\max_i \|W_{\mathrm{up}}[:, i]\|_2$",
    "r": r"a bound on the norm of every token, $\sup \|x\|_2$ over the domain ($R + \|c\|_2$ for a ball about $c$)",
    "mu_gate": r"largest column norm of $W_{\mathrm{gate}}$, $\max_i \|W_{\mathrm{gate}}[:, i]\|_2$",
}

#: Function classes -> (symbol LaTeX, definition).
FUNCTION_MEANINGS: dict[type, tuple[str, str]] = {
    S.kappa: (r"\kappa_n(\omega)", r"$n e^{\omega} / (e^{\omega} + n - 1) \le \min(n, e^{\omega})$: a bound on "
              r"every column sum of the attention matrix when the score spread is at most $\omega$"),
    S.causal_kappa: (r"\kappa^{\mathrm{c}}_n(\omega)", r"$\sum_{i=1}^{n} e^{\omega} / (e^{\omega} + i - 1)$: the "
                     r"same bound under a causal mask"),
    S.lambert_level: (r"W_0", r"the principal branch of the Lambert W function"),
    sp.LambertW: (r"W_0", r"the principal branch of the Lambert W function"),
    FeatureMap: (r"\phi", r"the feature map $\phi(u) = \mathrm{elu}(u) + 1$, coordinatewise"),
}

_NORM_SYMBOLS = (S.MatrixNormSymbol, S.VectorNormSymbol, S.InfNormSymbol)
_MATRIX_NAMESPACE = {value.name: value for value in vars(S).values() if isinstance(value, sp.MatrixSymbol)}


def _matrices_of(name: str) -> list[str]:
    """Names of the matrices inside a norm symbol's name (``"W_K*W_Q.T" -> ["W_K", "W_Q"]``)."""
    if name in MEANINGS:
        return [name]
    try:
        parsed = sp.sympify(name, locals=_MATRIX_NAMESPACE)
    except (sp.SympifyError, SyntaxError, TypeError, ValueError, AttributeError, sp.ShapeError):
        parsed = None
    if not isinstance(parsed, sp.MatrixExpr):
        raise AssumptionError("legend", "a norm of weights lipbound knows", repr(name),
                              "add its definition to lipbound.printing.legend.MEANINGS")
    return sorted(atom.name for atom in parsed.atoms(sp.MatrixSymbol))


def _atoms(expr):
    """Symbols, matrix symbols and function nodes of an expression (matrix arguments included)."""
    yield from sp.preorder_traversal(expr)


def legend_entries(*exprs, tied: bool = False) -> list[tuple[str, str]]:
    """``(symbol LaTeX, definition)`` for every symbol of ``exprs``, in a stable order: norms
    first, then sizes and radii, weights, constants, functions.

    ``tied``: the statement is about tied weights (``A = W W^T / sqrt(d_k)``).

    Raises
    ------
    AssumptionError
        A symbol has no definition in :data:`MEANINGS` (add one, and to docs/symbols.md).
    """
    names: dict[str, None] = {}
    functions: dict[type, None] = {}
    norms = infinity = lower = lip = soft = False
    for expr in exprs:
        if not isinstance(expr, sp.Basic):
            continue
        for node in _atoms(expr):
            if isinstance(node, S.InfNormSymbol):
                infinity = True
                names.update(dict.fromkeys(_matrices_of(node.name)))
            elif isinstance(node, _NORM_SYMBOLS) or isinstance(node, (Norm, SoftNorm)):
                norms = True
                soft = soft or isinstance(node, SoftNorm)
                if isinstance(node, _NORM_SYMBOLS):
                    names.update(dict.fromkeys(_matrices_of(node.name)))
            elif isinstance(node, S.LowerBoundSymbol):
                lower = True
                names[node.name] = None
            elif isinstance(node, Described):  # described in place; only Lip(f) is in the legend
                lip = lip or node.name.startswith(r"\operatorname{Lip}")
            elif isinstance(node, (sp.MatrixSymbol, sp.Symbol)):
                names[node.name] = node if isinstance(node, sp.Symbol) else None
            elif type(node) in FUNCTION_MEANINGS:
                functions[type(node)] = None
            elif isinstance(node, Inner):
                norms = True
    printer = LipboundLatexPrinter()
    entries = []
    if lip:
        entries.append((r"\operatorname{Lip}(f)", MEANINGS["Lip"].split(": ", 1)[1]))
    if norms:
        entries.append((r"\|\cdot\|_2", MEANINGS["norms"]))
    if infinity:
        entries.append((r"\|\cdot\|_\infty", MEANINGS["inf-norms"]))
    if soft:
        entries.append((r"N_{\varepsilon}(u)", MEANINGS["soft-norm"]))
    order = list(MEANINGS)
    for name in sorted(names, key=lambda n: (order.index(n) if n in order else len(order), n)):
        symbol = printer.doprint(names[name] or sp.Symbol(name)) if name not in _MATRIX_NAMESPACE \
            else symbol_latex(name)  # the symbol itself: its class may print it (eps as \varepsilon)
        if name in MEANINGS:
            meaning = MEANINGS["A_tied"] if (name == "A" and tied) else MEANINGS[name]
        elif lower and name not in _MATRIX_NAMESPACE:
            meaning = MEANINGS["lower"]
        else:
            raise AssumptionError("legend", "a symbol with a definition", repr(name),
                                  "add its definition to lipbound.printing.legend.MEANINGS and docs/symbols.md")
        entries.append((symbol, meaning))
    for function in functions:
        entries.append(FUNCTION_MEANINGS[function])
    return list(dict.fromkeys(entries))


def legend_latex(entries: list[tuple[str, str]]) -> str:
    r"""The entries as a ``description`` list, one ``\item[$symbol$]`` each."""
    if not entries:
        return ""
    return "\\begin{description}\n" + "".join(
        f"  \\item[${symbol}$] {meaning[:1].upper() + meaning[1:] if not meaning.startswith('$') else meaning}.\n"
        for symbol, meaning in entries) + "\\end{description}\n"
