r"""Derivation records as LaTeX proofs.

A :class:`~lipbound.symbolic.record.Derivation` becomes the hypotheses as an
``itemize`` and one ``align*`` environment, one row per step::

    lhs &\le rhs && \parbox[t]{0.28\textwidth}{\raggedright\small justification (Lemma~\ref{lem:id})}\\

* Relations align at their relation symbol (``&\le``, ``&=``).
* Long right-hand sides are broken at top-level ``+``/``-`` signs, inside the longest
  parenthesised sum of a product (with ``\bigl(``...``\bigr)``, which, unlike
  ``\left``/``\right``, may span lines), and between the arguments of ``\min``/``\max``;
  continuation rows are indented by ``\quad``.  A long score spread inside
  :math:`\kappa_n(\cdot)` is named once, where it is derived
  (``\omega \le \bar\omega \coloneqq \ldots``), and written :math:`\bar\omega` afterwards.
* Justifications are ASCII prose with ASCII mathematics (``||W_O||``, ``<=``,
  ``sqrt(d)``, ``p_ij``); :func:`text_to_latex` turns the mathematics into inline
  LaTeX and escapes the prose, so that any string compiles.

The output needs ``amsmath`` and ``mathtools`` (for ``\coloneqq``) and is meant to be
used inside a ``proof`` environment; :func:`lipbound.printing.document.standalone`
provides the preamble.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import final

import sympy as sp
from sympy.core.sorting import default_sort_key
from sympy.simplify.radsimp import fraction

from ..errors import AssumptionError
from ..symbolic import symbols as S
from ..symbolic.lemmas import LEMMAS
from ..symbolic.record import Derivation, Described
from .latex import LipboundLatexPrinter, latex, ordered_factors, symbol_latex

__all__ = [
    "text_to_latex", "escape_text", "derivation_to_latex", "lemma_appendix", "cited_lemmas",
    "visual_width", "split_expression", "claim_rows", "hypotheses_latex", "justification_latex",
    "SpreadNames", "CLAIM_WIDTH", "DISPLAY_WIDTH",
]

#: Room for a claim (left side, relation, right side) in an ``align*`` row next to a justification
#: box of ``0.28\textwidth``, in points: the text width of :func:`~lipbound.printing.document.preamble`
#: (472pt) less the box (132pt) and the column gap.
CLAIM_WIDTH = 310.0
#: Room for a displayed equation without a justification column, in points.
DISPLAY_WIDTH = 440.0
_JUSTIFICATION_BOX = r"\parbox[t]{0.28\textwidth}{\raggedright\small %s}"

# --------------------------------------------------------------------------------------------
# ASCII mathematics in prose
# --------------------------------------------------------------------------------------------
_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<contraction>[A-Za-z]+'[a-z]+\b)
  | (?P<hword>[A-Za-z]{2,}(?:-[A-Za-z]{2,})+)
  | (?P<alnum>[A-Za-z]+\d+[A-Za-z0-9]*\b)
  | (?P<norm>\|\|(?:_(?:\{[^{}]*\}|[A-Za-z0-9]+))?)
  | (?P<rel><=|>=|!=|->|=>|<-|==|:=)
  | (?P<ellipsis>\.\.\.?)
  | (?P<sup>\^(?:\{[^{}]*\}|\([^()]*\)|-?[A-Za-z0-9]+))
  | (?P<ident>[A-Za-z]+(?:_(?:\{[^{}]*\}|[A-Za-z0-9]+))?'*(?:\.T(?![A-Za-z]))?)
  | (?P<number>\d+(?:\.\d+)?)
  | (?P<op>[-+*/=<>|~])
  | (?P<dot>\.)
  | (?P<open>[(\[{])
  | (?P<close>[)\]}])
  | (?P<punct>[,;:!?])
  | (?P<other>.)
""", re.VERBOSE | re.DOTALL)

_GREEK = {
    "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda",
    "mu", "nu", "xi", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega",
    "Gamma", "Delta", "Theta", "Lambda", "Xi", "Pi", "Sigma", "Upsilon", "Phi", "Psi", "Omega",
}
#: Operator words: mathematics when followed by mathematics or a bracket ("sup ||g||"), prose
#: otherwise ("sum over i").
_OPERATORS = {
    "sup": r"\sup", "inf": r"\inf", "max": r"\max", "min": r"\min", "lim": r"\lim", "sum": r"\sum",
    "exp": r"\exp", "log": r"\log", "det": r"\det", "grad": r"\nabla", "sqrt": r"\sqrt",
    "Lip": r"\operatorname{Lip}", "std": r"\operatorname{std}", "tr": r"\operatorname{tr}",
    "Cov": r"\operatorname{Cov}", "Var": r"\operatorname{Var}", "vec": r"\operatorname{vec}",
    "diag": r"\operatorname{diag}",
}
_ALWAYS_MATH_WORDS = {"infinity": r"\infty", "oo": r"\infty"}
_TEXT_LETTERS = {"a", "I"}
_RELATIONS = {"<=": r"\le", ">=": r"\ge", "!=": r"\ne", "->": r"\to", "=>": r"\Rightarrow",
              "<-": r"\leftarrow", "==": "=", ":=": r"\coloneqq"}
_TEXT_ESCAPES = {
    "\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$", "&": r"\&", "#": r"\#",
    "%": r"\%", "_": r"\_", "^": r"\^{}", "~": r"\~{}", "<": r"\textless{}", ">": r"\textgreater{}",
    "|": r"\textbar{}",
}
#: Non-ASCII characters that have a LaTeX spelling; others outside Latin-1 become "?".
_UNICODE = {
    "≤": r"$\le$", "≥": r"$\ge$", "≠": r"$\ne$", "→": r"$\to$", "∞": r"$\infty$", "·": r"$\cdot$",
    "×": r"$\times$", "⟂": r"$\perp$", "⊥": r"$\perp$", "−": r"$-$", "–": "--", "—": "---",
    "‖": r"$\|$", "…": r"\dots{}", "‘": "`", "’": "'", "“": "``", "”": "''", "√": r"$\surd$",
    "α": r"$\alpha$", "β": r"$\beta$", "γ": r"$\gamma$", "κ": r"$\kappa$", "ρ": r"$\rho$",
    "ω": r"$\omega$", "ε": r"$\varepsilon$", "τ": r"$\tau$", "μ": r"$\mu$", "σ": r"$\sigma$",
}


def escape_text(text: str) -> str:
    """Escape prose for LaTeX text mode (no mathematics is recognised)."""
    out = []
    for char in text:
        if char in _TEXT_ESCAPES:
            out.append(_TEXT_ESCAPES[char])
        elif ord(char) < 128:
            out.append(char)
        elif char in _UNICODE:
            out.append(_UNICODE[char])
        elif ord(char) < 256 and char.isalpha():
            out.append(char)  # Latin-1 letters: inputenc (utf8) handles them
        else:
            out.append("?")
    return "".join(out)


@final
@dataclass
class _Token:
    """A piece of a justification: its regex group, its text, and whether it is mathematics."""

    kind: str
    text: str
    role: str = "text"  # "math", "neutral" or "text"


def _tokenize(text: str) -> list[_Token]:
    tokens = [_Token(match.lastgroup, match.group()) for match in _TOKEN.finditer(text)]
    for index, token in enumerate(tokens):
        token.role = _role(tokens, index)
    # operator words: decided from the right, by what follows them
    for index in range(len(tokens) - 1, -1, -1):
        token = tokens[index]
        if token.kind == "ident" and _split_ident(token.text)[0] in _OPERATORS and token.role == "pending":
            following = _next_visible(tokens, index)
            token.role = "math" if following is not None and (
                following.role == "math" or following.kind == "open" or following.kind == "sup") else "text"
    return tokens


def _role(tokens: list[_Token], index: int) -> str:
    token = tokens[index]
    kind, text = token.kind, token.text
    if kind == "op" and text == "-" and index + 1 < len(tokens) and \
            tokens[index + 1].kind in ("ident", "hword", "alnum") and len(tokens[index + 1].text) > 1 and \
            _split_ident(tokens[index + 1].text)[0] not in _OPERATORS:
        return "text"  # a hyphen: "1/2-Lipschitz"
    if kind == "op" and text == "-" and 0 < index < len(tokens) - 1 and tokens[index + 1].kind == "number" and \
            tokens[index - 1].kind in ("ident", "hword", "alnum") and tokens[index - 1].role == "text":
        return "text"  # a hyphen: "Wasserstein-1"
    if kind in ("norm", "rel", "ellipsis", "sup", "number", "op"):
        return "math"
    if kind == "ident":
        base, subscript, rest = _split_ident(text)
        if subscript or rest:
            return "math"
        if base in _OPERATORS:
            return "pending"
        if base in _GREEK or base in _ALWAYS_MATH_WORDS:
            return "math"
        if len(base) == 1:
            return "text" if base in _TEXT_LETTERS else "math"
        following = tokens[index + 1] if index + 1 < len(tokens) else None
        if following is not None and following.text == "(":
            return "math"  # a function applied without a space: "Att(X)", "softmax(z)"
        return "text"
    if kind == "dot":
        before = tokens[index - 1] if index > 0 else None
        after = tokens[index + 1] if index + 1 < len(tokens) else None
        spaced = before is not None and after is not None and before.kind == "space" and after.kind == "space"
        return "math" if spaced else "neutral"
    if kind == "punct" and text in ";:!?":
        return "text"  # sentence punctuation ends a formula
    if kind in ("open", "close", "punct", "space"):
        return "neutral"
    return "text"  # words, hyphenated words, contractions, other characters


def _next_visible(tokens: list[_Token], index: int) -> _Token | None:
    for token in tokens[index + 1:]:
        if token.kind != "space":
            return token
    return None


def _split_ident(text: str) -> tuple[str, str, str]:
    """``"W_K.T" -> ("W", "K", ".T")``, ``"y'" -> ("y", "", "'")``, ``"gamma_{A,V}" -> ("gamma", "A,V", "")``."""
    match = re.match(r"([A-Za-z]+)(?:_(\{[^{}]*\}|[A-Za-z0-9]+))?('*(?:\.T)?)$", text)
    if match is None:
        return text, "", ""
    base, subscript, rest = match.groups()
    subscript = (subscript or "")
    if subscript.startswith("{"):
        subscript = subscript[1:-1]
    return base, subscript, rest


_OPENERS = {"(": ")", "[": "]", "{": "}"}


def _math_spans(tokens: list[_Token]) -> list[tuple[int, int]]:
    """Maximal runs of math and neutral tokens that start and end with math, widened to balance brackets."""
    spans = []
    index = 0
    while index < len(tokens):
        if tokens[index].role != "math":
            index += 1
            continue
        end = index
        probe = index
        depth = 0
        while probe < len(tokens) and tokens[probe].role in ("math", "neutral"):
            token = tokens[probe]
            depth += (token.kind == "open") - (token.kind == "close")
            following = tokens[probe + 1] if probe + 1 < len(tokens) else None
            if token.text == "," and depth <= 0 and following is not None and following.kind == "space":
                break  # ", " outside brackets separates formulas: "$x_1 = 0$, $x_2 = t$"
            if token.role == "math":
                end = probe
            probe += 1
        spans.append([index, end])
        index = end + 1
    widened = []
    for start, end in spans:
        start, end = _balance(tokens, start, end)
        if widened and start <= widened[-1][1]:
            widened[-1][1] = max(widened[-1][1], end)
        else:
            widened.append([start, end])
    return [(start, end) for start, end in widened]


def _balance(tokens, start, end):
    for _ in range(len(tokens)):
        depth_open, depth_close = _unbalanced(tokens[start:end + 1])
        moved = False
        if depth_close:
            before = start - 1
            while before >= 0 and tokens[before].kind == "space":
                before -= 1
            if before >= 0 and tokens[before].kind == "open":
                start, moved = before, True
        if depth_open:
            after = end + 1
            while after < len(tokens) and tokens[after].kind == "space":
                after += 1
            if after < len(tokens) and tokens[after].kind == "close":
                end, moved = after, True
        if not moved and not depth_open and not depth_close:
            # a formula that fills a bracket pair takes the brackets: "$(2,1)$ norm"
            before, after = start - 1, end + 1
            if before >= 0 and after < len(tokens) and tokens[before].kind == "open" and \
                    tokens[after].kind == "close" and _OPENERS[tokens[before].text] == tokens[after].text:
                start, end, moved = before, after, True
        if not moved:
            break
    return start, end


def _unbalanced(tokens) -> tuple[int, int]:
    """(unmatched openers, unmatched closers) among bracket tokens."""
    opened, unmatched_close = 0, 0
    for token in tokens:
        if token.kind == "open":
            opened += 1
        elif token.kind == "close":
            if opened:
                opened -= 1
            else:
                unmatched_close += 1
    return opened, unmatched_close


def _script_math(body: str) -> str:
    """A subscript or superscript body: ``ij``, ``2,inf``, ``max``, ``-t``, ``1/2``, ``omega``."""
    return _math_from_text(body, script=True)


def _braced(mark: str, body: str) -> str:
    return f"{mark}{body}" if len(body) == 1 and body.isalnum() else f"{mark}{{{body}}}"


def _ident_math(text: str, script: bool = False, applied: bool = False) -> str:
    """An identifier; ``applied`` when a bracket follows it directly (a function name)."""
    base, subscript, rest = _split_ident(text)
    if script and base in ("inf", "infty", "infinity"):
        head = r"\infty"
    elif script and base in ("max", "min"):
        head = "\\" + base
    elif base in _OPERATORS:
        head = _OPERATORS[base]
    elif base in _ALWAYS_MATH_WORDS:
        head = _ALWAYS_MATH_WORDS[base]
    elif base in _GREEK:
        head = symbol_latex(base)
    elif applied and len(base) > 1:
        head = r"\operatorname{%s}" % base
    else:
        head = base
    tex = head
    if subscript:
        tex += _braced("_", _script_math(subscript))
    primes = rest.replace(".T", "")
    tex += primes
    if rest.endswith(".T"):
        tex += r"^\top"
    return tex


def _sup_math(text: str) -> str:
    body = text[1:]
    if body.startswith(("(", "{")):
        body = body[1:-1]
    if body == "T":
        return r"^\top"
    return _braced("^", _script_math(body))


def _ends_with_superscript(pieces: list[str]) -> bool:
    for piece in reversed(pieces):
        if piece != " ":
            return piece.startswith("^") or piece.endswith(r"^\top") or bool(re.search(r"\^\{[^{}]*\}$", piece))
    return False


def _math_from_tokens(tokens: list[_Token], script: bool = False) -> str:
    pieces: list[str] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        kind, text = token.kind, token.text
        if kind == "sup" and _ends_with_superscript(pieces):
            pieces.append("{}")  # "x^T^2": a second superscript needs a base of its own
        if kind == "space":
            pieces.append(" ")
        elif kind == "ident" and _split_ident(text)[0] == "sqrt" and not _split_ident(text)[1]:
            close = _matching_close(tokens, index + 1)
            if close is None:
                pieces.append(r"\sqrt{\phantom{x}}")
            else:
                pieces.append(r"\sqrt{" + _math_from_tokens(tokens[index + 2:close], script) + "}")
                index = close
        elif kind == "ident":
            following = tokens[index + 1] if index + 1 < len(tokens) else None
            pieces.append(_ident_math(text, script, applied=following is not None and following.text == "("))
        elif kind == "sup":
            pieces.append(_sup_math(text))
        elif kind == "norm":
            subscript = text[2:]
            tex = r"\|"
            if subscript:
                body = subscript[1:]
                if body.startswith("{"):
                    body = body[1:-1]
                tex += _braced("_", _script_math(body))
            pieces.append(tex)
        elif kind == "rel":
            pieces.append(_RELATIONS[text])
        elif kind == "ellipsis":
            pieces.append(r"\dots")
        elif kind == "op":
            pieces.append({"*": r"\cdot", "~": r"\sim"}.get(text, text))
        elif kind == "dot":
            pieces.append(r"\cdot" if token.role == "math" else ".")
        elif kind in ("open", "close"):
            pieces.append("\\" + text if text in "{}" else text)
        elif kind == "punct":
            pieces.append(text)
        elif kind == "number":
            pieces.append(text)
        else:  # prose inside a script, e.g. "^(n choose 2)": roman text
            pieces.append(r"\text{" + escape_text(text) + "}")
        index += 1
    return _join(pieces)


def _matching_close(tokens: list[_Token], open_index: int) -> int | None:
    while open_index < len(tokens) and tokens[open_index].kind == "space":
        open_index += 1
    if open_index >= len(tokens) or tokens[open_index].text != "(":
        return None
    depth = 0
    for index in range(open_index, len(tokens)):
        if tokens[index].text == "(":
            depth += 1
        elif tokens[index].text == ")":
            depth -= 1
            if depth == 0:
                return index
    return None


def _join(pieces: list[str]) -> str:
    """Concatenate, keeping one space where the source had one or where a control word needs it."""
    out = ""
    for piece in pieces:
        if piece == " ":
            if out and not out.endswith(" "):
                out += " "
            continue
        if re.search(r"\\[A-Za-z]+$", out) and re.match(r"[A-Za-z0-9]", piece):
            out += " "
        out += piece
    return out.strip()


def _math_from_text(text: str, script: bool = False) -> str:
    tokens = [_Token(match.lastgroup, match.group()) for match in _TOKEN.finditer(text)]
    for index, token in enumerate(tokens):
        token.role = _role(tokens, index)
        if token.role == "pending":
            token.role = "math"
    return _math_from_tokens(tokens, script)


def text_to_latex(text: str) -> str:
    r"""Prose with ASCII mathematics -> LaTeX text with inline mathematics.

    ``"rho = sup_y ||V^T (y - c)|| <= ||V|| R on the key domain"`` becomes
    ``"$\rho = \sup_y \|V^\top (y - c)\| \le \|V\| R$ on the key domain"``.
    Recognised: ``||`` (norm bars, ``||_inf``, ``||_{2,1}``), ``<= >= != -> :=``, ``^T``,
    ``^(1/2)``, ``x_ij``, ``.T``, ``sqrt(...)``, ``sum_j``, ``sup``, ``max``, Greek names,
    ``..``/``...``; words of two or more letters are prose.  Everything else is escaped,
    so the result always compiles.
    """
    if not isinstance(text, str):
        raise AssumptionError("text", "a string", type(text).__name__, "pass the justification as str")
    tokens = _tokenize(text)
    spans = _math_spans(tokens)
    out: list[str] = []
    position = 0
    for start, end in spans:
        if all(token.kind in ("number", "space") or token.role == "neutral" for token in tokens[start:end + 1]):
            continue  # a bare number is prose: "section 2", "Kim et al. 2021"
        out.append(_text_from_tokens(tokens[position:start]))
        out.append("$" + _math_from_tokens(tokens[start:end + 1]) + "$")
        position = end + 1
    out.append(_text_from_tokens(tokens[position:]))
    return "".join(out)


def _text_from_tokens(tokens: list[_Token]) -> str:
    return escape_text("".join(token.text for token in tokens))


# --------------------------------------------------------------------------------------------
# Widths and line breaking
# --------------------------------------------------------------------------------------------
_COMMAND = re.compile(r"\\([A-Za-z]+|.)")
#: Commands that print nothing themselves (font switches, delimiter sizes, environments).
_ZERO_WIDTH = {"left", "right", "textstyle", "displaystyle", "limits", "nolimits", "mathbb", "mathcal",
               "boldsymbol", "mathbf", "bigl", "bigr", "Bigl", "Bigr", "biggl", "biggr", "big", "Big", "bigg",
               "raggedright", "small", "begin", "end"}
#: Widths in points (11pt Computer Modern, display style), calibrated against TeX's own box widths
#: of the claims lipbound prints (median estimate/actual 0.94, 95% within 1.1).
_POINTS = {"upper": 8.6, "lower": 5.6, "digit": 5.5, "bar": 5.5, "binop": 13.5, "relation": 15.5,
           "paren": 4.3, "tall-paren": 7.5, "comma": 4.8, "command": 6.8, "root": 10.0, "fraction": 2.0,
           "operator": 19.0, "top": 7.0, "quad": 11.0}
_OPERATOR_NAMES = {"sup", "inf", "max", "min", "lim", "log", "exp", "det"}
_RELATION_NAMES = {"le", "ge", "leq", "geq", "ne", "to", "simeq", "coloneqq", "sim", "in", "approx"}
_SCRIPT_SCALE = 0.7


def visual_width(tex: str) -> float:
    r"""Estimated printed width of a LaTeX math string, in points (11pt, display style).

    Fractions count their wider part, scripts 0.7 of their width, font switches and delimiter
    sizes nothing.  An estimate for line breaking, not typesetting: the test suite compiles the
    generated proofs to catch real overflow.
    """
    return _width(tex, 1.0)


def _group(tex: str, index: int) -> tuple[str, int]:
    """The brace group (or single token) starting at ``index``; returns (content, next index)."""
    while index < len(tex) and tex[index] == " ":
        index += 1
    if index >= len(tex):
        return "", index
    if tex[index] == "{":
        depth = 0
        for end in range(index, len(tex)):
            if tex[end] == "{":
                depth += 1
            elif tex[end] == "}":
                depth -= 1
                if depth == 0:
                    return tex[index + 1:end], end + 1
        return tex[index + 1:], len(tex)
    command = _COMMAND.match(tex, index)
    if command:
        return command.group(), command.end()
    return tex[index], index + 1


def _width(tex: str, scale: float) -> float:
    total = 0.0
    index = 0
    tall = False  # the next delimiter follows \left or \right
    while index < len(tex):
        char = tex[index]
        if char in "{} ":
            index += 1
            continue
        if char in "^_":
            body, index = _group(tex, index + 1)
            total += _width(body, scale * _SCRIPT_SCALE)
            continue
        if char == "\\":
            command = _COMMAND.match(tex, index)
            name = command.group(1)
            index = command.end()
            if name == "frac":
                top, index = _group(tex, index)
                bottom, index = _group(tex, index)
                total += max(_width(top, scale), _width(bottom, scale)) + _POINTS["fraction"] * scale
            elif name == "sqrt":
                body, index = _group(tex, index)
                total += _width(body, scale) + _POINTS["root"] * scale
            elif name in ("text", "mathrm", "operatorname"):
                body, index = _group(tex, index)
                total += (6.0 * len(body) + (3.0 if name == "operatorname" else 0.0)) * scale
            elif name == "phantom":
                body, index = _group(tex, index)
                total += _width(body, scale)
            elif name in ("left", "right"):
                tall = True
            elif name in _ZERO_WIDTH:
                pass
            elif name == "|":
                total += (_POINTS["tall-paren"] if tall else _POINTS["bar"]) * scale
                tall = False
            elif name == "sum":
                total += 12.0 * scale
            elif name in _OPERATOR_NAMES:
                total += _POINTS["operator"] * scale
            elif name in _RELATION_NAMES:
                total += _POINTS["relation"] * scale
            elif name in ("quad", "qquad"):
                total += _POINTS["quad"] * (2 if name == "qquad" else 1) * scale
            elif name == ",":
                total += 1.8 * scale
            elif name == "!":
                total -= 1.8 * scale
            elif name in ("langle", "rangle"):
                total += _POINTS["paren"] * scale
            else:
                total += (_POINTS["top"] if name == "top" else _POINTS["command"]) * scale
            continue
        if char.isupper():
            total += _POINTS["upper"] * scale
        elif char.isdigit():
            total += _POINTS["digit"] * scale
        elif char in "+-":
            total += _POINTS["binop"] * scale
        elif char in "=<>":
            total += _POINTS["relation"] * scale
        elif char in "()[]|.":
            total += (_POINTS["tall-paren"] if tall else _POINTS["paren"]) * scale
            tall = False
        elif char in ",;":
            total += _POINTS["comma"] * scale
        else:
            total += _POINTS["lower"] * scale
        index += 1
    return total


def _delimiters(content: str) -> tuple[str, str]:
    """Sized, breakable delimiters tall enough for the content."""
    if r"\frac" in content:
        return r"\biggl(", r"\biggr)"
    if r"\sqrt" in content or r"\sum" in content or r"\left" in content:
        return r"\Bigl(", r"\Bigr)"
    return r"\bigl(", r"\bigr)"


_BREAKABLE_FUNCTIONS = (sp.Min, sp.Max)
#: The narrowest first line worth starting a broken expression on, in points.
_MIN_FIRST = 60.0
#: Room taken by a sized delimiter and the space around it, in points.
_DELIMITER = 12.0


def split_expression(expr, width: float, printer: LipboundLatexPrinter | None = None,
                     first: float | None = None) -> list[str]:
    r"""Break the LaTeX of ``expr`` into lines of at most about ``width`` points.

    Returns one string per line; the lines after the first continue the expression (a
    caller indents them).  ``first`` is the room on the first line (default ``width``).
    Breaks at top-level ``+``/``-``, inside the longest parenthesised sum (or
    ``\min``/``\max``) of a product with ``\bigl(``/``\bigr)`` delimiters, and after a
    leading ``\frac{c}{\cdot}`` factor; an expression with no break point stays on one line.
    """
    printer = printer or LipboundLatexPrinter()
    first = width if first is None else max(min(first, width), _MIN_FIRST)
    whole = printer.doprint(expr)
    if visual_width(whole) <= first or not isinstance(expr, sp.Basic):
        return [whole]
    if isinstance(expr, sp.Add):
        return _split_sum(expr, width, first, printer)
    if isinstance(expr, sp.Mul):
        return _split_product(expr, width, first, printer) or [whole]
    if isinstance(expr, _BREAKABLE_FUNCTIONS):
        return _split_extremum(expr, width, first, printer, "")
    if _is_group_power(expr):
        return _split_group(expr.base, width, first, printer, "", "", _power_tex(expr, printer))
    return [whole]


def _is_group_power(expr) -> bool:
    """``(a + b)^k`` or ``sqrt(a + b)``: a sum that can break inside sized parentheses."""
    return isinstance(expr, sp.Pow) and isinstance(expr.base, sp.Add) and (
        (expr.exp.is_Integer and expr.exp > 1) or expr.exp == sp.Rational(1, 2))


def _power_tex(expr: sp.Pow, printer) -> str:
    return "^{1/2}" if expr.exp == sp.Rational(1, 2) else "^{%s}" % printer._print(expr.exp)


def _split_sum(expr: sp.Add, width: float, first: float, printer) -> list[str]:
    pieces: list[list[str]] = []
    for position, term in enumerate(printer._as_ordered_terms(expr)):
        negative = term.could_extract_minus_sign()
        body = -term if negative else term
        sign = "- " if negative else ("+ " if position else "")
        room = width - (_POINTS["binop"] if sign else 0.0)
        lines = split_expression(body, room, printer, first=(first if position == 0 else width) - (
            _POINTS["binop"] if sign else 0.0))
        if sign:
            lines = [("{}" if position else "") + sign + lines[0]] + lines[1:]
        pieces.append(lines)
    return _pack(pieces, width, first)


def _pack(pieces: list[list[str]], width: float, first: float) -> list[str]:
    """Greedy filling: single-line pieces join the current line while it has room."""
    lines: list[str] = []
    current = ""
    for piece in pieces:
        room = first if not lines else width
        if len(piece) == 1 and (not current or visual_width(current + " " + piece[0]) <= room):
            joined = piece[0][2:] if current and piece[0].startswith("{}") else piece[0]
            current = (current + " " + joined).strip()  # "{}" (binary spacing) only starts a line
            continue
        if current:
            lines.append(current)
        lines.extend(piece[:-1])
        current = piece[-1]
    if current:
        lines.append(current)
    return lines


def _factor_tex(factor, printer) -> str:
    tex = printer._print(factor)
    if isinstance(factor, sp.Add):
        return r"\left(" + tex + r"\right)"
    return tex


def _split_product(expr: sp.Mul, width: float, first: float, printer) -> list[str] | None:
    sign = ""
    if expr.could_extract_minus_sign():
        sign, expr = "- ", -expr
    numerator, denominator = fraction(expr, exact=True)
    if denominator != 1:
        # c X / D is written (c / D) X so that X can break across lines
        coefficient, rest = numerator.as_coeff_Mul()
        if not (coefficient.is_Rational and coefficient > 0):
            coefficient, rest = sp.Integer(1), numerator
        top = sp.Integer(coefficient.p)
        bottom = denominator * coefficient.q
        prefix = sign + r"\frac{%s}{%s}" % (printer._print(top), printer._print(bottom))
        if isinstance(rest, sp.Add):
            return _split_group(rest, width, first, printer, prefix, "")
        lines = split_expression(rest, width, printer, first=first - visual_width(prefix))
        if len(lines) == 1:
            return None
        return [prefix + " " + lines[0]] + lines[1:]
    factors = ordered_factors(expr)
    candidates = [i for i, f in enumerate(factors)
                  if isinstance(f, (sp.Add,) + _BREAKABLE_FUNCTIONS) or _is_group_power(f)]
    if not candidates:
        return None
    chosen = max(candidates, key=lambda i: (visual_width(printer._print(factors[i])), -i))
    before = " ".join(_factor_tex(f, printer) for f in factors[:chosen])
    after = " ".join(_factor_tex(f, printer) for f in factors[chosen + 1:])
    prefix = (sign + before).strip()
    target = factors[chosen]
    if isinstance(target, sp.Add):
        return _split_group(target, width, first, printer, prefix, after)
    if _is_group_power(target):
        return _split_group(target.base, width, first, printer, prefix, after, _power_tex(target, printer))
    lines = _split_extremum(target, width, first, printer, prefix)
    if after:
        lines[-1] += " " + after
    return lines


def _split_group(target: sp.Add, width: float, first: float, printer, prefix: str, after: str,
                 power: str = "") -> list[str]:
    r"""``prefix \bigl( target \bigr)^{power} after`` with the sum broken inside the delimiters.

    The prefix goes on a line of its own when it leaves too little room; a sum that fits on one
    line is still broken if the factors after it would overflow that line; factors that do not
    fit after the closing delimiter continue the product on a new line (``\cdot``).
    """
    room = first - visual_width(prefix) - 2 * _DELIMITER
    alone = room < _MIN_FIRST
    if alone:
        room = width - _DELIMITER
    lines = _split_sum(target, width - _DELIMITER, room, printer)
    if len(lines) == 1 and visual_width(lines[0] + after) > room:
        lines = _split_sum(target, width - _DELIMITER, room - visual_width(after), printer)
    opening, closing = _delimiters(" ".join(lines))
    lines = list(lines)
    lines[-1] += closing + power
    tail: list[str] = []
    if after and visual_width(lines[-1] + " " + after) > width:
        tail = [r"{}\cdot " + after]
    elif after:
        lines[-1] += " " + after
    if alone and prefix:
        return [prefix + " " + opening] + lines + tail
    lines[0] = (prefix + " " + opening).strip() + " " + lines[0]
    return lines + tail


def _split_extremum(expr, width: float, first: float, printer, prefix: str) -> list[str]:
    name = r"\min" if isinstance(expr, sp.Min) else r"\max"
    arguments = sorted(expr.args, key=default_sort_key)  # SymPy's order for Min/Max
    opening_room = visual_width(prefix + name) + _DELIMITER
    lines: list[str] = []
    for position, argument in enumerate(arguments):
        room = (first - opening_room) if position == 0 else width - _DELIMITER
        piece = split_expression(argument, width - _DELIMITER, printer, first=room)
        if position < len(arguments) - 1:
            piece[-1] += ","
        lines.extend(piece)
    opening, closing = _delimiters(" ".join(lines))
    return _wrap(lines, (prefix + " " + name + opening).strip(), closing)


def _wrap(lines: list[str], opening: str, closing: str) -> list[str]:
    lines = list(lines)
    lines[0] = opening + " " + lines[0]
    lines[-1] = lines[-1] + closing
    return lines


# --------------------------------------------------------------------------------------------
# Spreads named once
# --------------------------------------------------------------------------------------------
_KAPPAS = (S.kappa, S.causal_kappa)
#: A spread shorter than this (e.g. ``2 \|A\|_2 R^{2}``) stays inline, in points.
_SPREAD_INLINE_WIDTH = 100.0


def _spread_sites(expr) -> list:
    r"""Where a score spread appears in a bound: the second argument of :math:`\kappa_n`,
    :math:`\kappa^{\mathrm{c}}_n`, and exponents :math:`e^{\omega}`."""
    sites = []
    for node in sp.preorder_traversal(expr):
        if isinstance(node, _KAPPAS):
            sites.append(node.args[1])
        elif isinstance(node, sp.exp):
            sites.append(node.args[0])
    return sites


@final
class SpreadNames:
    r"""Long score spreads (inside :math:`\kappa_n(\cdot)` or :math:`e^{(\cdot)}`), named
    :math:`\bar\omega, \bar\omega_2, \ldots` in order of first definition."""

    def __init__(self):
        self.names: dict = {}
        #: spreads that some claim uses (see :meth:`expect`)
        self.pending: set = set()

    def expect(self, claims) -> None:
        """Note the long spreads that the claims use, so that their definitions get named."""
        for claim in claims:
            if isinstance(claim, sp.core.relational.Relational):
                self.pending |= self.wanted(claim.rhs) | self.wanted(claim.lhs)
            else:
                self.pending |= self.wanted(claim)

    def wanted(self, expr) -> set:
        """Long spreads that occur in ``expr`` where a score spread goes."""
        if not isinstance(expr, sp.Basic):
            return set()
        return {spread for spread in _spread_sites(expr)
                if not spread.is_Atom and visual_width(latex(spread)) > _SPREAD_INLINE_WIDTH}

    def name(self, spread) -> Described:
        if spread not in self.names:
            index = len(self.names) + 1
            self.names[spread] = Described(r"\bar{\omega}" if index == 1 else r"\bar{\omega}_{%d}" % index)
        return self.names[spread]

    def apply(self, expr):
        """``expr`` with every named spread written by its name."""
        if not self.names or not isinstance(expr, sp.Basic):
            return expr
        return expr.xreplace(self.names)


# --------------------------------------------------------------------------------------------
# Derivations
# --------------------------------------------------------------------------------------------
_RELATION_TEX = {"==": "=", "<=": r"\le", ">=": r"\ge", "<": "<", ">": ">", "!=": r"\ne"}
_STRING_RELATIONS = re.compile(r"\\simeq|\\le(?![A-Za-z])|\\ge(?![A-Za-z])|(?<![:\\])=")


def _split_string_claim(text: str) -> tuple[str, str, str]:
    """``"Df_i[E] = ..." -> ("Df_i[E]", "=", "...")`` at the first top-level relation, else ("", "", text)."""
    depth = 0
    index = 0
    while index < len(text):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        elif depth == 0:
            match = _STRING_RELATIONS.match(text, index)
            if match and index > 0:
                return text[:index].strip(), match.group(), text[match.end():].strip()
        index += 1
    return "", "", text


def _split_string(text: str, width: float, first: float | None = None) -> list[str]:
    """Break a LaTeX string at top-level ``,\\ `` separators and ``+``/``-`` signs (outside
    braces, brackets, ``\\left``/``\\right`` pairs and norm bars)."""
    first = width if first is None else first
    if visual_width(text) <= first:
        return [text]
    pieces, depth, in_norm, start, index = [], 0, False, 0, 0
    while index < len(text):
        char = text[index]
        if text.startswith(r"\|", index):
            in_norm = not in_norm
            index += 2
            continue
        if text.startswith(r"\left", index):
            depth += 1
        elif text.startswith(r"\right", index):
            depth -= 1
        elif char in "{([":
            depth += 1
        elif char in "})]":
            depth -= 1
        top = depth == 0 and not in_norm
        if top and text.startswith(r",\ ", index):
            pieces.append([text[start:index + 1].strip() + r"\ "])  # keep the author's space
            start = index + 3
            index += 3
            continue
        if top and char in "+-" and index > 0 and text[index - 1] == " ":
            pieces.append([text[start:index].strip()])
            start = index
        index += 1
    pieces.append([text[start:].strip()])
    pieces = [[("{}" + p[0]) if p[0][:1] in "+-" else p[0]] for p in pieces if p[0]]
    lines = _pack(pieces, width, first)
    return [re.sub(r",\\\s*$", ",", line) for line in lines]  # no forced space before a line break


def _claim_parts(claim, spreads: SpreadNames, printer) -> tuple[object, str, object]:
    """(left side, relation LaTeX, right side) of a claim; sides are SymPy objects or LaTeX strings."""
    if isinstance(claim, sp.core.relational.Relational):
        return spreads.apply(claim.lhs), _RELATION_TEX[claim.rel_op], spreads.apply(claim.rhs)
    text = claim.name if isinstance(claim, sp.Symbol) else (claim if isinstance(claim, str) else printer.doprint(claim))
    left, relation, right = _split_string_claim(text)
    return left, relation, right


def _side_lines(side, width: float, printer, first: float | None = None) -> list[str]:
    if isinstance(side, str):
        return _split_string(side, width, first)
    return split_expression(side, width, printer, first=first)


def _side_tex(side, printer) -> str:
    return side if isinstance(side, str) else printer.doprint(side)


def claim_rows(claim, spreads: SpreadNames, printer: LipboundLatexPrinter | None = None,
               width: float = CLAIM_WIDTH, left_width: float | None = None) -> list[str]:
    r"""The ``align*`` cells of one claim: ``["lhs &\le rhs1", "&\quad {}+ rhs2", ...]``.

    A long spread defined by the claim (``\omega \le X``) is named here: the row reads
    ``\omega &\le \bar\omega \coloneqq X`` and later claims write :math:`\bar\omega`.
    """
    printer = printer or LipboundLatexPrinter()
    left, relation, right = _claim_parts(claim, spreads, printer)
    left_tex = _side_tex(left, printer)
    prefix = ""
    if isinstance(claim, sp.core.relational.Relational) and claim.lhs == S.omega and \
            claim.rel_op in ("<=", "==") and claim.rhs in spreads.pending:
        prefix = printer.doprint(spreads.name(claim.rhs)) + r" \coloneqq "
    room = width - (left_width if left_width is not None else visual_width(left_tex)) - _POINTS["relation"]
    room = max(room, 160.0)
    lines = _side_lines(right, room - _POINTS["quad"], printer, first=room - visual_width(prefix))
    lines[0] = prefix + lines[0]
    relation_cell = f"&{relation} " if relation else "& "
    rows = [f"{left_tex} {relation_cell}{lines[0]}".strip()]
    rows += [r"&\quad " + line for line in lines[1:]]
    return rows


def justification_latex(justification: str, lemma: str | None) -> str:
    """The justification in prose, with ``(Lemma~\\ref{lem:id})`` when a lemma is cited."""
    text = text_to_latex(justification) if justification else ""
    if lemma:
        _require_lemma(lemma)
        reference = r"(Lemma~\ref{lem:%s})" % lemma
        text = (text + " " + reference).strip()
    return text


def _require_lemma(lemma: str) -> None:
    if lemma not in LEMMAS:
        raise AssumptionError("lemma", "an id defined in lipbound.symbolic.lemmas.LEMMAS", repr(lemma),
                              "add the lemma's title and statement to LEMMAS, or cite an existing one")


def hypotheses_latex(hypotheses) -> str:
    """An ``itemize`` of hypotheses (ASCII mathematics converted), or "" when there are none."""
    if not hypotheses:
        return ""
    items = "\n".join(r"  \item " + text_to_latex(text) for text in hypotheses)
    return "\\begin{itemize}\n" + items + "\n\\end{itemize}\n"


def derivation_to_latex(record: Derivation, hypotheses: bool = True,
                        spreads: SpreadNames | None = None) -> str:
    r"""A derivation as LaTeX: its hypotheses as an ``itemize``, then one ``align*``, a row per step.

    Parameters
    ----------
    record : Derivation
        Title, hypotheses and steps (claims are SymPy relations or LaTeX strings).
    hypotheses : bool
        Whether to print the hypotheses (a caller that states them in a theorem omits them).
    spreads : SpreadNames, optional
        Names of long spreads shared with the caller (so that a statement printed after the
        proof can use the same :math:`\bar\omega`).

    Returns
    -------
    str
        LaTeX for use inside a ``proof`` environment (needs amsmath and mathtools).
    """
    if not isinstance(record, Derivation):
        raise AssumptionError("record", "a lipbound.symbolic.record.Derivation", type(record).__name__,
                              "pass result.record of a Bound or NotLipschitz")
    printer = LipboundLatexPrinter()
    spreads = spreads if spreads is not None else SpreadNames()
    spreads.expect(step.claim for step in record.steps)
    out = []
    if hypotheses and record.hypotheses:
        out.append("Hypotheses:\n" + hypotheses_latex(record.hypotheses))
    if not record.steps:
        return "".join(out)
    left_width = _common_left_width(record, printer)
    rows = []
    for step in record.steps:
        cells = claim_rows(step.claim, spreads, printer, CLAIM_WIDTH, left_width)
        why = justification_latex(step.justification, step.lemma)
        first = cells[0] + (" && " + _JUSTIFICATION_BOX % why if why else "")
        rows.append("\\\\\n".join([first] + cells[1:]))
    out.append("\\begin{align*}\n" + "\\\\\n".join(rows) + "\n\\end{align*}\n")
    return "".join(out)


def _common_left_width(record: Derivation, printer) -> float:
    """All left sides share one column: the widest one sets the room left for right sides."""
    widths = [0.0]
    for step in record.steps:
        left, _, _ = _claim_parts(step.claim, SpreadNames(), printer)
        widths.append(visual_width(_side_tex(left, printer)))
    return max(widths)


def cited_lemmas(*records: Derivation) -> list[str]:
    """Sorted ids of the lemmas cited by the records."""
    return sorted({step.lemma for record in records for step in record.steps if step.lemma})


def lemma_appendix(ids) -> str:
    r"""One ``\begin{lemma}[title]\label{lem:<id>}`` per lemma id (sorted, each once), with its statement.

    Raises
    ------
    AssumptionError
        If an id is not in :data:`lipbound.symbolic.lemmas.LEMMAS`.
    """
    blocks = []
    for lemma in sorted(set(ids)):
        _require_lemma(lemma)
        title, statement = LEMMAS[lemma]
        blocks.append("\\begin{lemma}[%s]\\label{lem:%s}\n%s\n\\end{lemma}\n" % (
            escape_text(title), lemma, statement))
    return "\n".join(blocks)
