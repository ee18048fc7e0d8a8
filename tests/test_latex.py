"""The LaTeX printer: exact strings for every lipbound node and every built-in bound.

As in SymPy's own printer tests, the strings are pinned: each was computed once with
:class:`~lipbound.printing.latex.LipboundLatexPrinter`, read (is this what a paper prints?),
and fixed here.  A change to a derivation or to the printer shows up as a readable diff.
Also: the printer has a ``_print_<Class>`` method for every symbol and function class that
:mod:`lipbound.symbolic` defines; the prose converter of justifications; the ``align*`` layout
of derivations; tables and sections.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import lipbound.symbolic as symbolic_package
from lipbound.errors import AssumptionError
from lipbound.printing.derivation import derivation_to_latex, lemma_appendix
from lipbound.printing.document import bound_section, comparison_table, standalone, statement_latex
from lipbound.printing.latex import LipboundLatexPrinter, latex
from lipbound.printing.layout import CLAIM_WIDTH, SpreadNames, split_expression, visual_width
from lipbound.printing.prose import text_to_latex
from lipbound.symbolic import symbols as S
from lipbound.symbolic.assumptions import Assumptions, Ball, LayerNormImage, Unbounded
from lipbound.symbolic.calculus import Inner, Norm, SoftNorm
from lipbound.symbolic.lemmas import LEMMAS
from lipbound.symbolic.record import Derivation, Described, eq, le
from lipbound.symbolic.registry import VARIANTS, variant
from lipbound.symbolic.scores import epsilon, tau

M = S.MatrixNormSymbol

# ------------------------------------------------------------------------------------------------
# Nodes
# ------------------------------------------------------------------------------------------------
NODES = [
    # spectral norms of constant matrices, by name; short names; a named joint quantity
    (M("W_K*W_Q.T"), r"\|W_K W_Q^\top\|_2"),
    (M("A"), r"\|A\|_2"),
    (M("W_V"), r"\|W_V\|_2"),
    (M("gamma_{A,V}"), r"\gamma_{A,V}"),
    (M("W*W.T*W_V"), r"\|W W^\top W_V\|_2"),
    (S.matrix_norm(S.W_Q * S.W_K.T), r"\|W_K W_Q^\top\|_2"),
    (M("W") ** 2, r"\|W\|_2^{2}"),
    (M("W_K*W_Q.T") ** 3, r"\|W_K W_Q^\top\|_2^{3}"),
    (sp.sqrt(M("A")), r"\sqrt{\|A\|_2}"),
    # Euclidean norms of constant vectors (a positive term first)
    (S.VectorNormSymbol("W_K*b_Q + W_K*W_Q.T*c"), r"\|W_K b_Q + W_K W_Q^\top c\|_2"),
    (S.VectorNormSymbol("-W_K*W_K.T*c + W_K*W_Q.T*c"), r"\|W_K W_Q^\top c - W_K W_K^\top c\|_2"),
    (S.vector_norm(S.W_Q.T * S.c + S.b_Q), r"\|b_Q + W_Q^\top c\|_2"),
    (S.InfNormSymbol("W_Q.T"), r"\|W_Q^\top\|_\infty"),
    # column sums and Lambert W
    (S.kappa(S.n, S.omega), r"\kappa_{n}(\omega)"),
    (sp.sqrt(S.kappa(S.n, S.omega)), r"\sqrt{\kappa_{n}(\omega)}"),
    (S.kappa(S.n, S.omega) ** 2, r"\kappa_{n}(\omega)^{2}"),
    (S.kappa(8, 2 * M("A") * S.R ** 2), r"\kappa_{8}(2 \|A\|_2 R^{2})"),
    (S.kappa(S.m, S.omega / S.n), r"\kappa_{m}\left(\frac{\omega}{n}\right)"),
    (S.causal_kappa(S.n, S.omega), r"\kappa^{\mathrm{c}}_{n}(\omega)"),
    (S.lambert_level(S.n), r"W_0\!\left(\frac{n - 1}{e}\right)"),
    (S.lambert_level(S.n) ** 2, r"W_0\!\left(\frac{n - 1}{e}\right)^{2}"),
    (S.lambert_level(8), r"W_0\!\left(\frac{7}{e}\right)"),
    (sp.LambertW(sp.exp(-1)), r"W_0\!\left(\frac{1}{e}\right)"),
    (sp.LambertW(S.n / sp.E), r"W_0\!\left(\frac{n}{e}\right)"),
    (sp.LambertW(S.t, -1), r"W_{-1}\!\left(t\right)"),
    # score atoms
    (Inner(S.W_Q.T * S.x, S.W_K.T * S.y), r"\langle W_Q^\top x, W_K^\top y\rangle"),
    (Inner(S.W_Q.T * S.x + S.b_Q, S.W_K.T * S.y) / sp.sqrt(S.d_k),
     r"\frac{\langle b_Q + W_Q^\top x, W_K^\top y\rangle}{\sqrt{d_k}}"),
    (Norm(S.W.T * S.x - S.W.T * S.y), r"\|W^\top x - W^\top y\|"),
    (-Norm(S.W_Q.T * S.x - S.W_K.T * S.y) ** 2 / sp.sqrt(S.d_k),
     r"- \frac{\|W_Q^\top x - W_K^\top y\|^{2}}{\sqrt{d_k}}"),
    (SoftNorm(S.W_Q.T * S.x, epsilon), r"N_{\varepsilon}(W_Q^\top x)"),
    (SoftNorm(S.W_Q.T * S.x, epsilon) ** 2, r"N_{\varepsilon}(W_Q^\top x)^{2}"),
    (SoftNorm(S.W_Q.T * S.x, epsilon) ** 3, r"N_{\varepsilon}(W_Q^\top x)^{3}"),
    (tau * Inner(S.W_Q.T * S.x, S.W_K.T * S.y) / (SoftNorm(S.W_Q.T * S.x, epsilon) * SoftNorm(S.W_K.T * S.y, epsilon)),
     r"\frac{\tau \langle W_Q^\top x, W_K^\top y\rangle}{N_{\varepsilon}(W_K^\top y) N_{\varepsilon}(W_Q^\top x)}"),
    # described quantities print verbatim and come last in products
    (Described(r"\|Df(X)[E]\|"), r"\|Df(X)[E]\|"),
    (S.L_V * Described("u_i"), r"L_V u_i"),
    (S.kappa(S.n, S.omega) * Described(r"\|E\|_F^2"), r"\kappa_{n}(\omega) \|E\|_F^2"),
    (S.rho * (S.alpha * Described(r"\|e_i\|") + S.beta * Described("u_i")),
     r"\rho \left(\alpha \|e_i\| + \beta u_i\right)"),
    (sp.Symbol(r"\|x - c\|"), r"\|x - c\|"),
    # matrices and transposes
    (S.W_Q.T, r"W_Q^\top"),
    (sp.Transpose(S.W_K * S.W_Q.T), r"\left(W_K W_Q^\top\right)^\top"),
    (S.W_K.T * S.c, r"W_K^\top c"),
    # symbols
    (S.RadiusSymbol("gamma_max"), r"\gamma_{\max}"),
    (epsilon, r"\varepsilon"),
    (tau, r"\tau"),
    (S.d_k, r"d_k"),
    (S.d_v, r"d_v"),
    (S.H, r"H"),
    (S.L_V, r"L_V"),
    (S.rho, r"\rho"),
    (S.alpha, r"\alpha"),
    (S.beta, r"\beta"),
    (S.omega, r"\omega"),
    (S.LowerBoundSymbol("m_Q"), r"m_Q"),
    # SymPy structure with lipbound leaves
    (sp.Min(S.R, S.d), r"\min\left(R, d\right)"),
    (sp.Max(M("A") * S.R ** 2, S.n), r"\max\left(n, \|A\|_2 R^{2}\right)"),
    (M("W_V") * S.R, r"\|W_V\|_2 R"),
    (M("W_O") * sp.sqrt(S.H) * (S.L_V + S.rho), r"\|W_O\|_2 \sqrt{H} \left(L_V + \rho\right)"),
    (le(S.alpha, M("A") * S.R), r"\alpha \le \|A\|_2 R"),
    (eq(S.L_V, M("W_V")), r"L_V = \|W_V\|_2"),
    (sp.Ge(S.R, 1, evaluate=False), r"R \ge 1"),
    (sp.Limit(S.t ** 2 / 4, S.t, sp.oo), r"\lim_{t \to \infty}\left(\frac{t^{2}}{4}\right)"),
]


@pytest.mark.parametrize("expr, expected", NODES, ids=[str(i) for i in range(len(NODES))])
def test_node(expr, expected):
    assert latex(expr) == expected


def test_latex_accepts_sympy_settings():
    assert latex(S.kappa(S.n, S.omega), mode="inline") == r"$\kappa_{n}(\omega)$"


def test_norm_names_print_from_the_name_alone():
    """The printed matrix comes from parsing the symbol's name, not from a registry that
    depends on what was derived before, so the same symbol always prints the same way."""
    symbol = M("W_Q*W_K.T*W_V")  # never registered by a derivation
    assert latex(symbol) == r"\|W_Q W_K^\top W_V\|_2"
    assert latex(M("W_h*W_QK.T")) == r"\|W_h W_{QK}^\top\|_2"  # matrices lipbound does not know
    assert latex(M(r"W^{(h)}_Q")) == r"\|W^{(h)}_Q\|_2"  # no parse: the name, verbatim, in bars


def test_every_symbolic_class_has_a_print_method():
    """Registry completeness: each symbol and function class defined in lipbound.symbolic
    has its own ``_print_<Class>`` on the printer (not only an inherited SymPy fallback)."""
    missing, found = [], []
    for info in pkgutil.iter_modules(symbolic_package.__path__):
        module = importlib.import_module(f"{symbolic_package.__name__}.{info.name}")
        for name, cls in vars(module).items():
            if inspect.isclass(cls) and cls.__module__ == module.__name__ and issubclass(cls, sp.Basic):
                found.append(name)
                if f"_print_{name}" not in vars(LipboundLatexPrinter):
                    missing.append(f"{module.__name__}.{name}")
    assert {"Inner", "Norm", "SoftNorm", "Described", "kappa", "MatrixNormSymbol"} <= set(found)
    assert not missing, f"add LipboundLatexPrinter._print_<Class> for: {missing}"


# ------------------------------------------------------------------------------------------------
# Built-in bounds
# ------------------------------------------------------------------------------------------------
_DOMAINS = {"ball": Ball(), "layernorm": LayerNormImage()}

BOUNDS = {
    ("dot-product", "fro", "ball"):
        r"\|W_V\|_2 R \left(\|A\|_2 R + \frac{\left(\|A\|_2 R \sqrt{d_k} + \|W_K b_Q\|_2\right) "
        r"\sqrt{\min\left(\frac{3 n}{4}, \kappa_{n}\left(\min\left(\frac{2 R \left(\|A\|_2 R "
        r"\sqrt{d_k} + \|W_K b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)\right)}}{\sqrt{d_k}}\right) + \|W_V\|_2 "
        r"\sqrt{\kappa_{n}\left(\min\left(\frac{2 R \left(\|A\|_2 R \sqrt{d_k} + \|W_K "
        r"b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)}",
    ("dot-product-nobias", "fro", "ball"):
        r"\|W_V\|_2 R \left(\|A\|_2 R \sqrt{\min\left(\frac{3 n}{4}, \kappa_{n}(2 \|A\|_2 "
        r"R^{2})\right)} + \|A\|_2 R\right) + \|W_V\|_2 \sqrt{\kappa_{n}(2 \|A\|_2 R^{2})}",
    ("causal", "fro", "ball"):
        r"\|W_V\|_2 R \left(\|A\|_2 R + \frac{\left(\|A\|_2 R \sqrt{d_k} + \|W_K b_Q\|_2\right) "
        r"\sqrt{\min\left(\frac{3 n}{4}, \kappa^{\mathrm{c}}_{n}\left(\min\left(\frac{2 R "
        r"\left(\|A\|_2 R \sqrt{d_k} + \|W_K b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R "
        r"\left(\|W_Q\|_2 R + \|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)\right)}}{\sqrt{d_k}}\right) "
        r"+ \|W_V\|_2 \sqrt{\kappa^{\mathrm{c}}_{n}\left(\min\left(\frac{2 R \left(\|A\|_2 R "
        r"\sqrt{d_k} + \|W_K b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)}",
    ("l2-tied", "fro", "ball"):
        r"\frac{\|W W^\top W_V\|_2 R \left(\frac{4 \|W\|_2^{2} R \sqrt{\min\left(\frac{3 n}{4}, "
        r"\kappa_{n}\left(\frac{4 \|W\|_2^{2} R^{2}}{\sqrt{d_k}}\right)\right)}}{\sqrt{d_k}} + "
        r"\frac{2 \|W\|_2^{2} R}{\sqrt{d_k}}\right)}{\sqrt{d_k}} + \frac{\|W W^\top W_V\|_2 "
        r"\sqrt{\kappa_{n}\left(\frac{4 \|W\|_2^{2} R^{2}}{\sqrt{d_k}}\right)}}{\sqrt{d_k}}",
    ("l2-untied", "fro", "ball"):
        r"\|W_V\|_2 R \left(2 \|A\|_2 R + \frac{2 R \left(\|A\|_2 \sqrt{d_k} + \|W_K\|_2^{2}\right) "
        r"\sqrt{\min\left(\frac{3 n}{4}, \kappa_{n}\left(\min\left(\frac{4 R^{2} \left(\|A\|_2 "
        r"\sqrt{d_k} + \|W_K\|_2^{2}\right)}{\sqrt{d_k}}, \frac{R^{2} \left(\|W_K\|_2^{2} + 2 "
        r"\|W_K\|_2 \|W_Q\|_2 + "
        r"\|W_Q\|_2^{2}\right)}{\sqrt{d_k}}\right)\right)\right)}}{\sqrt{d_k}}\right) + \|W_V\|_2 "
        r"\sqrt{\kappa_{n}\left(\min\left(\frac{4 R^{2} \left(\|A\|_2 \sqrt{d_k} + "
        r"\|W_K\|_2^{2}\right)}{\sqrt{d_k}}, \frac{R^{2} \left(\|W_K\|_2^{2} + 2 \|W_K\|_2 \|W_Q\|_2 "
        r"+ \|W_Q\|_2^{2}\right)}{\sqrt{d_k}}\right)\right)}",
    ("l2-tied-plain-values", "fro", "ball"):
        r"\|W_V\|_2 R \left(\frac{4 \|W\|_2^{2} R \sqrt{\min\left(\frac{3 n}{4}, "
        r"\kappa_{n}\left(\frac{4 \|W\|_2^{2} R^{2}}{\sqrt{d_k}}\right)\right)}}{\sqrt{d_k}} + "
        r"\frac{2 \|W\|_2^{2} R}{\sqrt{d_k}}\right) + \|W_V\|_2 \sqrt{\kappa_{n}\left(\frac{4 "
        r"\|W\|_2^{2} R^{2}}{\sqrt{d_k}}\right)}",
    ("cosine", "fro", "ball"):
        r"\|W_V\|_2 R \left(\frac{2 \|W_K\|_2 \tau \sqrt{\min\left(\frac{3 n}{4}, "
        r"\kappa_{n}\left(\min\left(2 \tau, \frac{4 \|W_K\|_2 R "
        r"\tau}{\sqrt{\varepsilon}}\right)\right)\right)}}{\sqrt{\varepsilon}} + \min\left(\frac{2 "
        r"\|W_Q\|_2 \tau}{\sqrt{\varepsilon}}, \frac{R \tau \left(\|A\|_2 \sqrt{d_k} + 3 \|W_K\|_2 "
        r"\|W_Q\|_2\right)}{\varepsilon}\right)\right) + \|W_V\|_2 \sqrt{\kappa_{n}\left(\min\left(2 "
        r"\tau, \frac{4 \|W_K\|_2 R \tau}{\sqrt{\varepsilon}}\right)\right)}",
    ("sigmoid", "fro", "ball"):
        r"\frac{\|W_V\|_2 n \kappa_{n + 1}\left(\frac{\|W_K\|_2 \|W_Q\|_2 R^{2} + \|W_K\|_2 R \|b_Q\|_2 + "
        r"\|W_Q\|_2 R \|b_K\|_2 + \|b_K\|_2 \|b_Q\|_2}{\sqrt{d_k}}\right)}{n + 1} + \left(\|W_V\|_2 R + \|"
        r"b_V\|_2\right) \left(\frac{\|A\|_2 R \sqrt{d_k} + \|W_K b_Q\|_2}{\sqrt{d_k}} + \frac{\|A\|_2 R "
        r"\sqrt{d_k} + \|W_Q b_K\|_2}{\sqrt{d_k}}\right) \min\left(\frac{n}{4}, \frac{n \kappa_{n + 1}\left"
        r"(\frac{\|W_K\|_2 \|W_Q\|_2 R^{2} + \|W_K\|_2 R \|b_Q\|_2 + \|W_Q\|_2 R \|b_K\|_2 + \|b_K\|_2 \|b"
        r"_Q\|_2}{\sqrt{d_k}}\right)}{n + 1}\right)",
    ("linear-elu", "fro", "ball"):
        r"\|W_V\|_2 R \left(\frac{\|W_K\|_2 \left(\|W_Q\|_2 R + \sqrt{d_k}\right) e^{\frac{\|W_K\|_2 R + "
        r"\|W_Q\|_2 R}{\sqrt{d_k}}} \sqrt{\min\left(\frac{3 n}{4}, \kappa_{n}\left(\min\left(\frac{2 \|W_K"
        r"\|_2 R \left(\|W_Q\|_2 R + \sqrt{d_k}\right) e^{\frac{\|W_K\|_2 R + \|W_Q\|_2 R}{\sqrt{d_k}}}}{d_"
        r"k}, \log{\left(\frac{\|W_K\|_2 R}{\sqrt{d_k}} + 1 \right)} + \log{\left(\frac{\|W_Q\|_2 R}{\sqrt"
        r"{d_k}} + 1 \right)} + \frac{\|W_K\|_2 R + \|W_Q\|_2 R}{\sqrt{d_k}}\right)\right)\right)}}{d_k} +"
        r" \frac{\|W_Q\|_2 \left(\|W_K\|_2 R + \sqrt{d_k}\right) e^{\frac{\|W_K\|_2 R + \|W_Q\|_2 R}{\sqrt"
        r"{d_k}}}}{d_k}\right) + \|W_V\|_2 \sqrt{\kappa_{n}\left(\min\left(\frac{2 \|W_K\|_2 R \left(\|W_Q"
        r"\|_2 R + \sqrt{d_k}\right) e^{\frac{\|W_K\|_2 R + \|W_Q\|_2 R}{\sqrt{d_k}}}}{d_k}, \log{\left(\f"
        r"rac{\|W_K\|_2 R}{\sqrt{d_k}} + 1 \right)} + \log{\left(\frac{\|W_Q\|_2 R}{\sqrt{d_k}} + 1 \right"
        r")} + \frac{\|W_K\|_2 R + \|W_Q\|_2 R}{\sqrt{d_k}}\right)\right)}",
    ("cross-queries", "fro", "ball"):
        r"\|A\|_2 \|W_V\|_2 R^{2}",
    ("cross-context", "fro", "ball"):
        r"\frac{\sqrt{m} \left(\frac{\|W_V\|_2 R \left(\|A\|_2 R \sqrt{d_k} + \|W_K "
        r"b_Q\|_2\right)}{\sqrt{d_k}} + \|W_V\|_2\right) \sqrt{\kappa_{n}\left(\min\left(\frac{2 R "
        r"\left(\|A\|_2 R \sqrt{d_k} + \|W_K b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R "
        r"\left(\|W_Q\|_2 R + \|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)}}{\sqrt{n}}",
    ("cross-joint", "fro", "ball"):
        r"\sqrt{\|A\|_2^{2} \|W_V\|_2^{2} R^{4} + \frac{m \left(\frac{\|W_V\|_2 R \left(\|A\|_2 R "
        r"\sqrt{d_k} + \|W_K b_Q\|_2\right)}{\sqrt{d_k}} + \|W_V\|_2\right)^{2} "
        r"\kappa_{n}\left(\min\left(\frac{2 R \left(\|A\|_2 R \sqrt{d_k} + \|W_K "
        r"b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)}{n}}",
    ("multi-head", "fro", "ball"):
        r"\|W_O\|_2 \sqrt{H} \left(\|W_V\|_2 R \left(\|A\|_2 R + \frac{\left(\|A\|_2 R \sqrt{d_k} + "
        r"\|W_K b_Q\|_2\right) \sqrt{\min\left(\frac{3 n}{4}, \kappa_{n}\left(\min\left(\frac{2 R "
        r"\left(\|A\|_2 R \sqrt{d_k} + \|W_K b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R "
        r"\left(\|W_Q\|_2 R + \|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)\right)}}{\sqrt{d_k}}\right) "
        r"+ \|W_V\|_2 \sqrt{\kappa_{n}\left(\min\left(\frac{2 R \left(\|A\|_2 R \sqrt{d_k} + \|W_K "
        r"b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)}\right)",
    ("multi-head-l2", "fro", "ball"):
        r"\|W_O\|_2 \sqrt{H} \left(\frac{\|W W^\top W_V\|_2 R \left(\frac{4 \|W\|_2^{2} R "
        r"\sqrt{\min\left(\frac{3 n}{4}, \kappa_{n}\left(\frac{4 \|W\|_2^{2} "
        r"R^{2}}{\sqrt{d_k}}\right)\right)}}{\sqrt{d_k}} + \frac{2 \|W\|_2^{2} "
        r"R}{\sqrt{d_k}}\right)}{\sqrt{d_k}} + \frac{\|W W^\top W_V\|_2 \sqrt{\kappa_{n}\left(\frac{4 "
        r"\|W\|_2^{2} R^{2}}{\sqrt{d_k}}\right)}}{\sqrt{d_k}}\right)",
    ("residual", "fro", "ball"):
        r"\|W_V\|_2 R \left(\|A\|_2 R + \frac{\left(\|A\|_2 R \sqrt{d_k} + \|W_K b_Q\|_2\right) "
        r"\sqrt{\min\left(\frac{3 n}{4}, \kappa_{n}\left(\min\left(\frac{2 R \left(\|A\|_2 R "
        r"\sqrt{d_k} + \|W_K b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)\right)}}{\sqrt{d_k}}\right) + \|W_V\|_2 "
        r"\sqrt{\kappa_{n}\left(\min\left(\frac{2 R \left(\|A\|_2 R \sqrt{d_k} + \|W_K "
        r"b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)} + 1",
    ("residual-multi-head", "fro", "ball"):
        r"\|W_O\|_2 \sqrt{H} \left(\|W_V\|_2 R \left(\|A\|_2 R + \frac{\left(\|A\|_2 R \sqrt{d_k} + "
        r"\|W_K b_Q\|_2\right) \sqrt{\min\left(\frac{3 n}{4}, \kappa_{n}\left(\min\left(\frac{2 R "
        r"\left(\|A\|_2 R \sqrt{d_k} + \|W_K b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R "
        r"\left(\|W_Q\|_2 R + \|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)\right)}}{\sqrt{d_k}}\right) "
        r"+ \|W_V\|_2 \sqrt{\kappa_{n}\left(\min\left(\frac{2 R \left(\|A\|_2 R \sqrt{d_k} + \|W_K "
        r"b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)}\right) + 1",
    ("measure-w1", "w1", "ball"):
        r"\|A\|_2 \|W_V\|_2 R^{2} + \left(\frac{2 \|W_V\|_2 R \left(\|A\|_2 R \sqrt{d_k} + \|W_K "
        r"b_Q\|_2\right)}{\sqrt{d_k}} + \|W_V\|_2\right) \kappa_{n}\left(\min\left(\frac{2 R "
        r"\left(\|A\|_2 R \sqrt{d_k} + \|W_K b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R "
        r"\left(\|W_Q\|_2 R + \|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)",
    ("measure-w1-mean-field", "w1", "ball"):
        r"\|A\|_2 \|W_V\|_2 R^{2} + \left(\frac{2 \|W_V\|_2 R \left(\|A\|_2 R \sqrt{d_k} + \|W_K "
        r"b_Q\|_2\right)}{\sqrt{d_k}} + \|W_V\|_2\right) e^{\min\left(\frac{2 R \left(\|A\|_2 R "
        r"\sqrt{d_k} + \|W_K b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right)}",
    ("measure-w1-residual", "w1", "ball"):
        r"\|A\|_2 \|W_V\|_2 R^{2} + \left(\frac{2 \|W_V\|_2 R \left(\|A\|_2 R \sqrt{d_k} + \|W_K "
        r"b_Q\|_2\right)}{\sqrt{d_k}} + \|W_V\|_2\right) \kappa_{n}\left(\min\left(\frac{2 R "
        r"\left(\|A\|_2 R \sqrt{d_k} + \|W_K b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R "
        r"\left(\|W_Q\|_2 R + \|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right) + 1",
    ("measure-cross-queries", "w1", "ball"):
        r"\|A\|_2 \|W_V\|_2 R^{2}",
    ("measure-cross-context", "w1", "ball"):
        r"\left(\frac{2 \|W_V\|_2 R \left(\|A\|_2 R \sqrt{d_k} + \|W_K b_Q\|_2\right)}{\sqrt{d_k}} + "
        r"\|W_V\|_2\right) e^{\min\left(\frac{2 R \left(\|A\|_2 R \sqrt{d_k} + \|W_K "
        r"b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right)}",
    ("dot-product", "fro", "layernorm"):
        r"\|W_V\|_2 \gamma_{\max} \sqrt{d} \left(\|A\|_2 \gamma_{\max} \sqrt{d} + \frac{\left(\|A\|_2 "
        r"\gamma_{\max} \sqrt{d} \sqrt{d_k} + \|W_K b_Q + W_K W_Q^\top c\|_2\right) "
        r"\sqrt{\min\left(\frac{3 n}{4}, \kappa_{n}\left(\min\left(\frac{2 \left(\|W_K\|_2 \|W_Q\|_2 "
        r"\gamma_{\max}^{2} d + \|W_K\|_2 \gamma_{\max} \sqrt{d} \|W_Q^\top c\|_2 + \|W_K\|_2 "
        r"\gamma_{\max} \sqrt{d} \|b_Q\|_2 + \|W_Q\|_2 \gamma_{\max} \sqrt{d} \|W_K^\top c\|_2 + "
        r"\|W_K^\top c\|_2 \|W_Q^\top c\|_2 + \|W_K^\top c\|_2 \|b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 "
        r"\gamma_{\max} \left(\|A\|_2 \gamma_{\max} d \sqrt{d_k} + \sqrt{d} \|W_K b_Q + W_K W_Q^\top "
        r"c\|_2\right)}{\sqrt{d_k}}\right)\right)\right)}}{\sqrt{d_k}}\right) + \|W_V\|_2 "
        r"\sqrt{\kappa_{n}\left(\min\left(\frac{2 \left(\|W_K\|_2 \|W_Q\|_2 \gamma_{\max}^{2} d + "
        r"\|W_K\|_2 \gamma_{\max} \sqrt{d} \|W_Q^\top c\|_2 + \|W_K\|_2 \gamma_{\max} \sqrt{d} "
        r"\|b_Q\|_2 + \|W_Q\|_2 \gamma_{\max} \sqrt{d} \|W_K^\top c\|_2 + \|W_K^\top c\|_2 \|W_Q^\top "
        r"c\|_2 + \|W_K^\top c\|_2 \|b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \gamma_{\max} \left(\|A\|_2 "
        r"\gamma_{\max} d \sqrt{d_k} + \sqrt{d} \|W_K b_Q + W_K W_Q^\top "
        r"c\|_2\right)}{\sqrt{d_k}}\right)\right)}",
    ("dot-product-nobias", "fro", "layernorm"):
        r"\|W_V\|_2 \gamma_{\max} \sqrt{d} \left(\|A\|_2 \gamma_{\max} \sqrt{d} + \frac{\left(\|A\|_2 "
        r"\gamma_{\max} \sqrt{d} \sqrt{d_k} + \|W_K W_Q^\top c\|_2\right) \sqrt{\min\left(\frac{3 "
        r"n}{4}, \kappa_{n}\left(\min\left(\frac{2 \left(\|W_K\|_2 \|W_Q\|_2 \gamma_{\max}^{2} d + "
        r"\|W_K\|_2 \gamma_{\max} \sqrt{d} \|W_Q^\top c\|_2 + \|W_Q\|_2 \gamma_{\max} \sqrt{d} "
        r"\|W_K^\top c\|_2 + \|W_K^\top c\|_2 \|W_Q^\top c\|_2\right)}{\sqrt{d_k}}, \frac{2 "
        r"\gamma_{\max} \left(\|A\|_2 \gamma_{\max} d \sqrt{d_k} + \sqrt{d} \|W_K W_Q^\top "
        r"c\|_2\right)}{\sqrt{d_k}}\right)\right)\right)}}{\sqrt{d_k}}\right) + \|W_V\|_2 "
        r"\sqrt{\kappa_{n}\left(\min\left(\frac{2 \left(\|W_K\|_2 \|W_Q\|_2 \gamma_{\max}^{2} d + "
        r"\|W_K\|_2 \gamma_{\max} \sqrt{d} \|W_Q^\top c\|_2 + \|W_Q\|_2 \gamma_{\max} \sqrt{d} "
        r"\|W_K^\top c\|_2 + \|W_K^\top c\|_2 \|W_Q^\top c\|_2\right)}{\sqrt{d_k}}, \frac{2 "
        r"\gamma_{\max} \left(\|A\|_2 \gamma_{\max} d \sqrt{d_k} + \sqrt{d} \|W_K W_Q^\top "
        r"c\|_2\right)}{\sqrt{d_k}}\right)\right)}",
    ("cosine", "fro", "layernorm"):
        r"\|W_V\|_2 \gamma_{\max} \sqrt{d} \left(\frac{2 \|W_K\|_2 \tau \sqrt{\min\left(\frac{3 "
        r"n}{4}, \kappa_{n}\left(\min\left(2 \tau, \frac{4 \|W_K\|_2 \gamma_{\max} \tau "
        r"\sqrt{d}}{\sqrt{\varepsilon}}\right)\right)\right)}}{\sqrt{\varepsilon}} + "
        r"\min\left(\frac{2 \|W_Q\|_2 \tau}{\sqrt{\varepsilon}}, \frac{\gamma_{\max} \tau \sqrt{d} "
        r"\left(\|A\|_2 \sqrt{d_k} + 3 \|W_K\|_2 \|W_Q\|_2\right)}{\varepsilon}\right)\right) + "
        r"\|W_V\|_2 \sqrt{\kappa_{n}\left(\min\left(2 \tau, \frac{4 \|W_K\|_2 \gamma_{\max} \tau "
        r"\sqrt{d}}{\sqrt{\varepsilon}}\right)\right)}",
    ("dot-product", "2,1", "ball"):
        r"\|A\|_2 \|W_V\|_2 R^{2} + \left(\frac{2 \|W_V\|_2 R \left(\|A\|_2 R \sqrt{d_k} + \|W_K "
        r"b_Q\|_2\right)}{\sqrt{d_k}} + \|W_V\|_2\right) \kappa_{n}\left(\min\left(\frac{2 R "
        r"\left(\|A\|_2 R \sqrt{d_k} + \|W_K b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R "
        r"\left(\|W_Q\|_2 R + \|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)",
    ("l2-tied", "2,1", "ball"):
        r"\frac{2 \|W\|_2^{2} \|W W^\top W_V\|_2 R^{2}}{d_k} + \left(\frac{8 \|W\|_2^{2} \|W W^\top "
        r"W_V\|_2 R^{2}}{d_k} + \frac{\|W W^\top W_V\|_2}{\sqrt{d_k}}\right) \kappa_{n}\left(\frac{4 "
        r"\|W\|_2^{2} R^{2}}{\sqrt{d_k}}\right)",
    ("cross-context", "2,1", "ball"):
        r"\frac{m \left(\frac{2 \|W_V\|_2 R \left(\|A\|_2 R \sqrt{d_k} + \|W_K "
        r"b_Q\|_2\right)}{\sqrt{d_k}} + \|W_V\|_2\right) \kappa_{n}\left(\min\left(\frac{2 R "
        r"\left(\|A\|_2 R \sqrt{d_k} + \|W_K b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R "
        r"\left(\|W_Q\|_2 R + \|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)}{n}",
    ("multi-head", "2,1", "layernorm"):
        r"\|W_O\|_2 H \left(\|A\|_2 \|W_V\|_2 \gamma_{\max}^{2} d + \left(\frac{2 \|W_V\|_2 "
        r"\gamma_{\max} \sqrt{d} \left(\|A\|_2 \gamma_{\max} \sqrt{d} \sqrt{d_k} + \|W_K b_Q + W_K "
        r"W_Q^\top c\|_2\right)}{\sqrt{d_k}} + \|W_V\|_2\right) \kappa_{n}\left(\min\left(\frac{2 "
        r"\left(\|W_K\|_2 \|W_Q\|_2 \gamma_{\max}^{2} d + \|W_K\|_2 \gamma_{\max} \sqrt{d} \|W_Q^\top "
        r"c\|_2 + \|W_K\|_2 \gamma_{\max} \sqrt{d} \|b_Q\|_2 + \|W_Q\|_2 \gamma_{\max} \sqrt{d} "
        r"\|W_K^\top c\|_2 + \|W_K^\top c\|_2 \|W_Q^\top c\|_2 + \|W_K^\top c\|_2 "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \gamma_{\max} \left(\|A\|_2 \gamma_{\max} d "
        r"\sqrt{d_k} + \sqrt{d} \|W_K b_Q + W_K W_Q^\top "
        r"c\|_2\right)}{\sqrt{d_k}}\right)\right)\right)",
    ("rope", "fro", "ball"):
        r"\|W_V\|_2 R \left(R a + g_K + \left(R a + g_Q\right) \sqrt{\min\left(\frac{3 n}{4}, "
        r"\kappa_{n}(2 R^{2} a + 2 R g_K + 2 R g_Q + 2 s_c)\right)}\right) + \|W_V\|_2 \sqrt{\kappa_{n}(2 "
        r"R^{2} a + 2 R g_K + 2 R g_Q + 2 s_c)}",
    ("rope-nobias", "fro", "ball"):
        r"\|W_V\|_2 R \left(R a \sqrt{\min\left(\frac{3 n}{4}, \kappa_{n}(2 R^{2} a)\right)} + R a\right) "
        r"+ \|W_V\|_2 \sqrt{\kappa_{n}(2 R^{2} a)}",
    ("rope-causal", "fro", "ball"):
        r"\|W_V\|_2 R \left(R a + g_K + \left(R a + g_Q\right) \sqrt{\min\left(\frac{3 n}{4}, "
        r"\kappa^{\mathrm{c}}_{n}(2 R^{2} a + 2 R g_K + 2 R g_Q + 2 s_c)\right)}\right) + \|W_V\|_2 "
        r"\sqrt{\kappa^{\mathrm{c}}_{n}(2 R^{2} a + 2 R g_K + 2 R g_Q + 2 s_c)}",
    ("rope-multi-head", "fro", "ball"):
        r"\|W_O\|_2 \sqrt{H} \left(\|W_V\|_2 R \left(R a + g_K + \left(R a + g_Q\right) "
        r"\sqrt{\min\left(\frac{3 n}{4}, \kappa_{n}(2 R^{2} a + 2 R g_K + 2 R g_Q + 2 s_c)\right)}\right) "
        r"+ \|W_V\|_2 \sqrt{\kappa_{n}(2 R^{2} a + 2 R g_K + 2 R g_Q + 2 s_c)}\right)",
    ("rope-residual", "fro", "ball"):
        r"\|W_V\|_2 R \left(R a + g_K + \left(R a + g_Q\right) \sqrt{\min\left(\frac{3 n}{4}, "
        r"\kappa_{n}(2 R^{2} a + 2 R g_K + 2 R g_Q + 2 s_c)\right)}\right) + \|W_V\|_2 \sqrt{\kappa_{n}(2 "
        r"R^{2} a + 2 R g_K + 2 R g_Q + 2 s_c)} + 1",
    ("rope-cross-joint", "fro", "ball"):
        r"\sqrt{\|W_V\|_2^{2} R^{2} \left(R a + g_K\right)^{2} + \frac{m \left(\|W_V\|_2 R \left(R a + "
        r"g_Q\right) + \|W_V\|_2\right)^{2} \kappa_{n}(2 R^{2} a + 2 R g_K + 2 R g_Q + 2 s_c)}{n}}",
    ("qk-norm", "fro", "ball"):
        r"\|W_V\|_2 R \left(\frac{\|W_K\|_2 \gamma_{qk} \tau \sqrt{d_k} \sqrt{\min\left(\frac{3 n}{4}, "
        r"\kappa_{n}\left(\min\left(2 \gamma_{qk} \tau d_k, \frac{2 \|W_K\|_2 R \gamma_{qk} \tau "
        r"\sqrt{d_k}}{\sqrt{\varepsilon}}\right)\right)\right)}}{\sqrt{\varepsilon}} + \frac{\|W_Q\|_2 "
        r"\gamma_{qk} \tau \sqrt{d_k}}{\sqrt{\varepsilon}}\right) + \|W_V\|_2 "
        r"\sqrt{\kappa_{n}\left(\min\left(2 \gamma_{qk} \tau d_k, \frac{2 \|W_K\|_2 R \gamma_{qk} \tau "
        r"\sqrt{d_k}}{\sqrt{\varepsilon}}\right)\right)}",
    ("qk-norm-rope", "fro", "ball"):
        r"\|W_V\|_2 R \left(\frac{\|W_K\|_2 \gamma_k \gamma_q \tau \sqrt{d_k} \sqrt{\min\left(\frac{3 "
        r"n}{4}, \kappa_{n}\left(\min\left(2 \gamma_k \gamma_q \tau d_k, \frac{2 \|W_K\|_2 R \gamma_k "
        r"\gamma_q \tau \sqrt{d_k}}{\sqrt{\varepsilon}}\right)\right)\right)}}{\sqrt{\varepsilon}} + "
        r"\frac{\|W_Q\|_2 \gamma_k \gamma_q \tau \sqrt{d_k}}{\sqrt{\varepsilon}}\right) + \|W_V\|_2 "
        r"\sqrt{\kappa_{n}\left(\min\left(2 \gamma_k \gamma_q \tau d_k, \frac{2 \|W_K\|_2 R \gamma_k "
        r"\gamma_q \tau \sqrt{d_k}}{\sqrt{\varepsilon}}\right)\right)}",
    ("gqa", "fro", "ball"):
        r"\|W_O\|_2 \sqrt{H} \left(\|W_V\|_2 R \left(\|A\|_2 R + \frac{\left(\|A\|_2 R \sqrt{d_k} + \|W_K "
        r"b_Q\|_2\right) \sqrt{\min\left(\frac{3 n}{4}, \kappa_{n}\left(\min\left(\frac{2 R \left(\|A\|_2 "
        r"R \sqrt{d_k} + \|W_K b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)\right)}}{\sqrt{d_k}}\right) + \|W_V\|_2 "
        r"\sqrt{\kappa_{n}\left(\min\left(\frac{2 R \left(\|A\|_2 R \sqrt{d_k} + \|W_K "
        r"b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)}\right)",
    ("sliding-window", "fro", "ball"):
        r"\|W_V\|_2 R \left(\|A\|_2 R + \frac{\left(\|A\|_2 R \sqrt{d_k} + \|W_K b_Q\|_2\right) "
        r"\sqrt{\min\left(\kappa^{\mathrm{c}}_{\min\left(n, w\right)}\left(\min\left(\frac{2 R "
        r"\left(\|A\|_2 R \sqrt{d_k} + \|W_K b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R "
        r"\left(\|W_Q\|_2 R + \|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right), \frac{3 \min\left(n, "
        r"w\right)}{4}\right)}}{\sqrt{d_k}}\right) + \|W_V\|_2 \sqrt{\kappa^{\mathrm{c}}_{\min\left(n, "
        r"w\right)}\left(\min\left(\frac{2 R \left(\|A\|_2 R \sqrt{d_k} + \|W_K "
        r"b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)}",
    ("sliding-window-bidirectional", "fro", "ball"):
        r"\|W_V\|_2 R \left(\|A\|_2 R + \frac{\left(\|A\|_2 R \sqrt{d_k} + \|W_K b_Q\|_2\right) "
        r"\sqrt{\min\left(\kappa_{\min\left(n, 2 w - 1\right)}\left(\min\left(\frac{2 R \left(\|A\|_2 R "
        r"\sqrt{d_k} + \|W_K b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right) + \log{\left(2 \right)}\right), \frac{3 \min\left(n, 2 w - "
        r"1\right)}{4}\right)}}{\sqrt{d_k}}\right) + \|W_V\|_2 \sqrt{\kappa_{\min\left(n, 2 w - "
        r"1\right)}\left(\min\left(\frac{2 R \left(\|A\|_2 R \sqrt{d_k} + \|W_K "
        r"b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right) + \log{\left(2 \right)}\right)}",
    ("alibi", "fro", "ball"):
        r"\|W_V\|_2 R \left(\|A\|_2 R + \frac{\left(\|A\|_2 R \sqrt{d_k} + \|W_K b_Q\|_2\right) "
        r"\sqrt{\min\left(\frac{3 n}{4}, 1 + \frac{\log{\left(e^{\min\left(\frac{2 R \left(\|A\|_2 R "
        r"\sqrt{d_k} + \|W_K b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right)} + 1 \right)}}{m_A}, \kappa^{\mathrm{c}}_{n}\left(m_A "
        r"\left(n - 1\right) + \min\left(\frac{2 R \left(\|A\|_2 R \sqrt{d_k} + \|W_K "
        r"b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)\right)}}{\sqrt{d_k}}\right) + \|W_V\|_2 "
        r"\sqrt{\min\left(1 + \frac{\log{\left(e^{\min\left(\frac{2 R \left(\|A\|_2 R \sqrt{d_k} + \|W_K "
        r"b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right)} + 1 \right)}}{m_A}, \kappa^{\mathrm{c}}_{n}\left(m_A "
        r"\left(n - 1\right) + \min\left(\frac{2 R \left(\|A\|_2 R \sqrt{d_k} + \|W_K "
        r"b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)\right)}",
    ("t5-bias", "fro", "ball"):
        r"\|W_V\|_2 R \left(\|A\|_2 R + \frac{\left(\|A\|_2 R \sqrt{d_k} + \|W_K b_Q\|_2\right) "
        r"\sqrt{\min\left(\frac{3 n}{4}, \kappa_{n}\left(\Delta_b + \min\left(\frac{2 R \left(\|A\|_2 R "
        r"\sqrt{d_k} + \|W_K b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)\right)}}{\sqrt{d_k}}\right) + \|W_V\|_2 "
        r"\sqrt{\kappa_{n}\left(\Delta_b + \min\left(\frac{2 R \left(\|A\|_2 R \sqrt{d_k} + \|W_K "
        r"b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)}",
    ("softcap", "fro", "ball"):
        r"\|W_V\|_2 R \left(\frac{\left(\|A\|_2 R \sqrt{d_k} + \|W_K b_Q\|_2\right) "
        r"\sqrt{\min\left(\frac{3 n}{4}, \kappa_{n}\left(\min\left(2 c_{\mathrm{cap}}, \frac{2 R "
        r"\left(\|A\|_2 R \sqrt{d_k} + \|W_K b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R "
        r"\left(\|W_Q\|_2 R + \|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)\right)}}{\sqrt{d_k}} + "
        r"\frac{\|A\|_2 R \sqrt{d_k} + \frac{\|W_Q b_K\|_2}{2}}{\sqrt{d_k}}\right) + \|W_V\|_2 "
        r"\sqrt{\kappa_{n}\left(\min\left(2 c_{\mathrm{cap}}, \frac{2 R \left(\|A\|_2 R \sqrt{d_k} + "
        r"\|W_K b_Q\|_2\right)}{\sqrt{d_k}}, \frac{2 \|W_K\|_2 R \left(\|W_Q\|_2 R + "
        r"\|b_Q\|_2\right)}{\sqrt{d_k}}\right)\right)}",
}


@pytest.mark.parametrize("key", list(BOUNDS), ids=["/".join(key) for key in BOUNDS])
def test_builtin_bound(key):
    name, norm, domain = key
    result = variant(name).derive(Assumptions(domain=_DOMAINS[domain], norm=norm), name)
    assert result.norm == norm
    assert latex(result.expr) == BOUNDS[key]
    assert latex(result.expr) == BOUNDS[key]


def test_every_registry_variant_is_pinned_on_a_ball():
    """Token-level variants in the Frobenius norm, measure-valued ones in Wasserstein-1."""
    pinned = {name for name, norm, domain in BOUNDS if norm in ("fro", "w1") and domain == "ball"}
    assert pinned == set(VARIANTS)


# ------------------------------------------------------------------------------------------------
# Prose with ASCII mathematics
# ------------------------------------------------------------------------------------------------
PROSE = [
    ("rho = sup_y ||V^T (y - c)|| <= ||V|| R on the key domain",
     r"$\rho = \sup_y \|V^\top (y - c)\| \le \|V\| R$ on the key domain"),
    ("Jensen, with u_i = (sum_j p_ij ||e_j||^2)^(1/2)",
     r"Jensen, with $u_i = (\sum_j p_{ij} \|e_j\|^2)^{1/2}$"),
    ("||vec Y||_inf <= ||Y||_{2,inf} and ||X||_{2,inf} <= sqrt(d) ||vec X||_inf",
     r"$\|\operatorname{vec} Y\|_{\infty} \le \|Y\|_{2,\infty}$ and "
     r"$\|X\|_{2,\infty} \le \sqrt{d} \|\operatorname{vec} X\|_{\infty}$"),
    ("each weight is at most e^omega/(e^omega + n - 1); m queries per column",
     r"each weight is at most $e^{\omega}/(e^{\omega} + n - 1)$; $m$ queries per column"),
    ("tokens lie in the image of a LayerNorm: x = gamma * z + c, z orthogonal to 1, ||z|| = sqrt(d)",
     r"tokens lie in the image of a LayerNorm: $x = \gamma \cdot z + c$, $z$ orthogonal to 1, "
     r"$\|z\| = \sqrt{d}$"),
    ("the kernel constants L_V, rho, alpha, beta, omega hold on the (convex) domain",
     r"the kernel constants $L_V$, $\rho$, $\alpha$, $\beta$, $\omega$ hold on the (convex) domain"),
    ("covariance in mean absolute deviation; alpha bounds std of the query term, |grad_y s . e_j| <= beta ||e_j||",
     r"covariance in mean absolute deviation; $\alpha$ bounds std of the query term, "
     r"$|\nabla_y s \cdot e_j| \le \beta \|e_j\|$"),
    ("mean value theorem along y -> y' inside the ball", r"mean value theorem along $y \to y'$ inside the ball"),
    ("||gamma * z|| <= ||gamma||_inf ||z|| = gamma_max sqrt(d)",
     r"$\|\gamma \cdot z\| \le \|\gamma\|_{\infty} \|z\| = \gamma_{\max} \sqrt{d}$"),
    ("(2,infinity) norm", r"$(2,\infty)$ norm"),
    ("X + Att(X), dot-product self-attention", r"$X + \operatorname{Att}(X)$, dot-product self-attention"),
    ("L2 self-attention (Kim et al. 2021), Cauchy-Schwarz", "L2 self-attention (Kim et al. 2021), Cauchy-Schwarz"),
    ("softmax is 1/2-Lipschitz", r"softmax is $1/2$-Lipschitz"),
    ("sum over i and exchange the sums", r"sum over $i$ and exchange the sums"),
    ("100% of $5 & #3 ~ a_b {c}", r"100\% of \$5 \& \#$3 \sim a_b \{c\}$"),
    ("p_ij <= p_ii for j != i", r"$p_{ij} \le p_{ii}$ for $j \ne i$"),
    ("x ≤ y → ∞", r"$x$ $\le$ $y$ $\to$ $\infty$"),
]


@pytest.mark.parametrize("text, expected", PROSE, ids=[str(i) for i in range(len(PROSE))])
def test_prose(text, expected):
    assert text_to_latex(text) == expected


def _unescaped_count(text: str, char: str) -> int:
    return len(re.findall(r"(?<!\\)" + re.escape(char), text.replace("\\\\", "")))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("abxyWQK_^|<=>-+*/.,;:()[]{}$%&#~\\' 0123éα≤∞⟂")), max_size=60))
def test_prose_output_is_balanced(text):
    """Any string: math shifts pair up and braces balance (tests/test_proofs.py compiles such strings)."""
    out = text_to_latex(text)
    assert _unescaped_count(out, "$") % 2 == 0, out
    depth = 0
    for char in re.sub(r"\\[{}$%&#_]|\\\\", "", out):
        depth += (char == "{") - (char == "}")
        assert depth >= 0, out
    assert depth == 0, out


def test_prose_rejects_non_strings():
    with pytest.raises(AssumptionError, match="text"):
        text_to_latex(3)


# ------------------------------------------------------------------------------------------------
# Derivations, sections, tables
# ------------------------------------------------------------------------------------------------
def _toy_record() -> Derivation:
    record = Derivation("toy")
    record.hypothesis("every token x_i satisfies ||x_i|| <= R")
    record.add(eq(S.L_V, M("W_V")), "L_V is the operator norm of v", "value-lipschitz")
    spread = (2 * S.R * (M("A") * S.R + S.VectorNormSymbol("W_K*b_Q")) + M("W_K*W_Q.T") * S.R ** 2
              + S.VectorNormSymbol("W_K*b_Q + W_K*W_Q.T*c") * S.R + M("W_Q") * M("W_K") * S.R ** 2)
    record.add(le(S.omega, spread), "mean value theorem", "mean-value")
    record.add(le(Described(r"\operatorname{Lip}(f)"), S.L_V * sp.sqrt(S.kappa(S.n, spread))), "substitute")
    return record


def test_derivation_layout():
    text = derivation_to_latex(_toy_record())
    assert text.startswith("Hypotheses:\n\\begin{itemize}\n  \\item every token $x_i$ satisfies "
                           "$\\|x_i\\| \\le R$\n\\end{itemize}\n\\begin{align*}\n")
    rows = text.split("\\begin{align*}\n")[1].split("\n\\end{align*}")[0].split("\\\\\n")
    assert rows[0] == (r"L_V &= \|W_V\|_2 && \parbox[t]{0.28\textwidth}{\raggedright\small "
                       r"$L_V$ is the operator norm of $v$ (Lemma~\ref{lem:value-lipschitz})}")
    # the long spread is named where it is derived, and used by name afterwards
    assert rows[1].startswith(r"\omega &\le \bar{\omega} \coloneqq ")
    assert rows[-1] == (r"\operatorname{Lip}(f) &\le L_V \sqrt{\kappa_{n}(\bar{\omega})} && "
                        r"\parbox[t]{0.28\textwidth}{\raggedright\small substitute}")
    continuation = [row for row in rows if row.startswith(r"&\quad")]
    assert continuation, "the long spread should break over lines"
    assert all(visual_width(row) <= CLAIM_WIDTH for row in continuation)


def test_derivation_without_hypotheses_and_errors():
    assert derivation_to_latex(_toy_record(), hypotheses=False).startswith("\\begin{align*}\n")
    record = Derivation("bad").add(le(S.alpha, S.R), "why", "no-such-lemma")
    with pytest.raises(AssumptionError, match="lemma"):
        derivation_to_latex(record)
    with pytest.raises(AssumptionError, match="record"):
        derivation_to_latex("not a record")


def test_split_expression_breaks_inside_sized_parentheses():
    expr = variant("dot-product").derive(Assumptions(domain=LayerNormImage()), "dot-product").expr
    spreads = SpreadNames()
    for spread in spreads.wanted(expr):  # as statements do: a long spread inside kappa gets a name
        spreads.name(spread)
    lines = split_expression(spreads.apply(expr), 300.0)
    assert len(lines) > 2
    assert all(visual_width(line) <= 300.0 * 1.15 for line in lines)
    joined = " ".join(lines)
    for opening, closing in ((r"\bigl(", r"\bigr)"), (r"\Bigl(", r"\Bigr)"), (r"\biggl(", r"\biggr)")):
        assert joined.count(opening) == joined.count(closing)
    assert joined.count(r"\left") == joined.count(r"\right")


def test_visual_width_orders_by_size():
    assert visual_width(r"\frac{a}{b}") < visual_width("a + b")
    assert visual_width(r"x_{ijk}") < visual_width("xijk")
    assert visual_width(r"\left(a\right)") > visual_width("(a)")


def test_lemma_appendix():
    text = lemma_appendix(["mean-value", "jensen", "mean-value"])
    assert text.count("\\begin{lemma}") == 2
    assert text.index("lem:jensen") < text.index("lem:mean-value")
    assert LEMMAS["jensen"][1] in text
    with pytest.raises(AssumptionError, match="lemma"):
        lemma_appendix(["no-such-lemma"])


def test_bound_section_and_standalone():
    result = variant("dot-product").derive(Assumptions(domain=Ball()), "dot-product")
    section = bound_section(result)
    assert section.startswith("\\section{dot-product: Frobenius norm, tokens in a ball}"
                              "\\label{sec:bound-dot-product-fro-ball}")
    assert r"\operatorname{Lip}(f) &\le \|W_V\|_2 R" in section
    assert r"&\text{where } \bar{\omega} \coloneqq \min" in section
    assert "\\begin{proof}" in section and "\\paragraph{Assumptions.}" in section
    document = standalone(section, "Dot-product attention, ||W_V|| R")
    assert document.startswith("\\documentclass[11pt]{article}")
    assert "\\title{Dot-product attention, $\\|W_V\\| R$}" in document
    cited = set(re.findall(r"\\ref\{lem:([^}]+)\}", document))
    stated = set(re.findall(r"\\label\{lem:([^}]+)\}", document))
    assert cited and cited == stated
    # regression: the assumptions were plain text ("sizes: n=n, m=m", "every token attends to itself: True")
    assumptions = section.split("\\paragraph{Assumptions.}")[1].split("\\begin{proof}")[0]
    assert "sizes" not in assumptions and "True" not in assumptions and "=n" not in assumptions
    assert r"$\|x_i\|_2 \le R$ for $i = 1, \dots, n$" in assumptions
    assert r"Frobenius norm $\|X\|_F" in assumptions
    with pytest.raises(AssumptionError, match="level"):
        bound_section(result, level="chapter")
    with pytest.raises(AssumptionError, match="result"):
        bound_section("not a result")


def test_bound_section_not_lipschitz():
    result = variant("dot-product").derive(Assumptions(domain=Unbounded()), "dot-product")
    section = bound_section(result)
    assert r"X_t &= \left[\begin{matrix}0\\t\end{matrix}\right]" in section
    assert r"\partial f / \partial x \,(X_t) &= \frac{t^{2}}{4} + \frac{1}{2}" in section
    assert r"$\operatorname{Lip}(f) = \infty$" in section


def test_statement_names_long_spreads():
    spread = sp.Min(2 * M("A") * S.R ** 2 + S.VectorNormSymbol("W_K*b_Q") * S.R, 3 * M("W_K") * M("W_Q") * S.R ** 2)
    text = statement_latex(S.L_V * sp.sqrt(S.kappa(S.n, spread)))
    assert r"\operatorname{Lip}(f) &\le L_V \sqrt{\kappa_{n}(\bar{\omega})}" in text
    assert r"&\text{where } \bar{\omega} \coloneqq \min" in text


def test_comparison_table():
    rows = [{"variant": "dot-product", "derived": M("W_V") * S.R, "value": 2116.0412},
            {"variant": "l2_tied", "derived": None, "value": 3, "ratio": 1.5e-7}]
    columns = [("variant", "Variant"), ("derived", "Derived"), ("value", "Value"), ("ratio", "Ratio")]
    assert comparison_table(rows, columns, booktabs=True) == (
        "\\begin{tabular}{llll}\n\\toprule\nVariant & Derived & Value & Ratio \\\\\n\\midrule\n"
        "dot-product & $\\|W_V\\|_2 R$ & $2116.04$ & -- \\\\\n"
        "l2\\_tied & -- & $3$ & $1.5 \\times 10^{-7}$ \\\\\n\\bottomrule\n\\end{tabular}\n")
    plain = comparison_table(rows, columns, booktabs=False)
    assert plain.count("\\hline") == 3 and "\\toprule" not in plain
    assert "\\usepackage{array,booktabs,graphicx}" in standalone(comparison_table(rows, columns, booktabs=True), "t")
    with pytest.raises(AssumptionError, match="columns"):
        comparison_table(rows, [])
    with pytest.raises(AssumptionError, match="rows"):
        comparison_table([{"variant": object()}], [("variant", "Variant")])


# ------------------------------------------------------------------------------------------------
# Fragments a user pastes: `derive --latex`, `derive --proof`, `lipbound preamble`
# ------------------------------------------------------------------------------------------------
#: What users paste into: a plain amsmath article (10pt, text width 345pt).
PLAIN_ARTICLE = "\\documentclass{article}\n\\usepackage{amsmath}\n"
FRAGMENTS = [["derive", "dot-product", "--proof"],
             ["derive", "custom", "--score", "tau*Inner(q, k)/(Norm(q)*Norm(k))", "--fact", "Norm(q) >= m_Q",
              "--fact", "Norm(k) >= m_K", "--proof"],
             ["derive", "l2-tied", "--domain", "unbounded", "--latex"],
             ["derive", "dot-product", "--domain", "layernorm", "--latex"],
             ["derive", "causal", "--domain", "unbounded", "--proof"]]


def _printed(capsys, args: list[str]) -> str:
    from lipbound.cli import main
    assert main(args) == 0
    return capsys.readouterr().out


@pytest.fixture(scope="module")
def fragments():
    import contextlib
    import io

    from lipbound.cli import main
    printed = []
    for args in [["preamble"]] + FRAGMENTS:
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            assert main(args) == 0
        printed.append(buffer.getvalue())
    return printed[0], printed[1:]


def test_fragments_are_latex_from_their_first_line(fragments):
    """Regressions: `derive --proof` began with bare mathematics outside math mode, cited 30
    lemmas it never stated, and listed plain-text hypotheses ("sizes: n=n, m=m", "every token
    attends to itself: True")."""
    preamble, texts = fragments
    assert "\\documentclass" not in preamble and "\\allowdisplaybreaks" in preamble
    for args, text in zip(FRAGMENTS, texts):
        first = text.lstrip().splitlines()[0]
        assert first.startswith(("\\begin{equation*}", "{\\sloppy")), (args, first)
        assert "sizes:" not in text and ": True" not in text
        cited = set(re.findall(r"\\ref\{(lb:lem:[^}]+)\}", text))
        stated = set(re.findall(r"\\label\{(lb:lem:[^}]+)\}", text))
        assert cited <= stated, (args, sorted(cited - stated))
    dot_product = texts[0]
    assert "A &\\coloneqq" in dot_product  # the symbol A is defined before it is used
    assert re.search(r"\\item\[\$A\$\]", dot_product)


@pytest.mark.tex
def test_pasted_fragments_compile_in_a_plain_article(fragments, tmp_path):
    """Exactly what a user does: `lipbound preamble` into the preamble of a plain amsmath article,
    the printed fragments into its body; zero errors, every reference resolved, no line overfull
    by more than 10 pt (the proof's align* breaks across pages)."""
    from test_paper import compile_latex
    preamble, texts = fragments
    document = PLAIN_ARTICLE + preamble + "\\begin{document}\n" + "\n\n".join(texts) + "\\end{document}\n"
    (tmp_path / "pasted.tex").write_text(document)
    _, pages = compile_latex(tmp_path, "pasted.tex")
    assert pages >= 4


def test_every_registry_variant_prints_with_a_complete_legend():
    """Every symbol a statement uses has a definition (the legend raises otherwise), and every
    definition is also in docs/symbols.md."""
    from pathlib import Path

    from lipbound.printing.legend import MEANINGS, legend_entries
    from lipbound.printing.theorem import result_latex
    for name in VARIANTS:
        chosen = variant(name)
        result = chosen.derive(Assumptions(domain=Ball(), norm=chosen.norms[0],
                                           tied=True if chosen.score.tied else None), name)
        parts = result_latex(chosen, result)
        assert parts.legend and parts.lemmas, name
    docs = (Path(__file__).resolve().parent.parent / "docs" / "symbols.md").read_text()
    plain = {"Lip": "Lip(f)", "norms": "||M||_2", "inf-norms": "||M||_inf", "lower": "m_Q", "A_tied": "W W^T",
             "soft-norm": "N_eps(u)"}
    for key in MEANINGS:
        assert f"`{plain.get(key, key)}" in docs or plain.get(key, key) in docs, key
    with pytest.raises(AssumptionError, match="legend"):
        legend_entries(S.MatrixNormSymbol("Z_9"))
