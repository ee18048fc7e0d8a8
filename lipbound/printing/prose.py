"""ASCII mathematics in prose, as LaTeX: justifications and hypotheses that always compile.

Derivation steps are justified in ASCII (``||W_O||``, ``<=``, ``sqrt(d)``, ``p_ij``);
:func:`text_to_latex` finds the mathematical spans, writes them as inline LaTeX and escapes the
rest as text, so that any string compiles.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import final

from ..errors import AssumptionError
from .latex import symbol_latex

__all__ = ["text_to_latex", "escape_text"]

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
_ALWAYS_MATH_WORDS = {"infinity": r"\infty", "oo": r"\infty", "ell": r"\ell"}
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
