"""Named lemmas that derivation steps cite, with their statements.

The proof documents print each cited lemma once, in an appendix, so that a
reader can check every step without leaving the paper.  The registry is tested
for completeness: every lemma a step cites must be defined here.
"""

from __future__ import annotations

from typing import Final

__all__ = ["LEMMAS"]

#: ``id -> (title, statement in LaTeX)``
LEMMAS: Final[dict[str, tuple[str, str]]] = {
    "softmax-derivative": (
        "Derivative of attention",
        r"For $f_i(X) = \sum_j p_{ij} v(x_j)$ with $p_{ij} = e^{s_{ij}} / \sum_k e^{s_{ik}}$, "
        r"$Df_i[E] = \sum_j p_{ij} V^\top e_j + \operatorname{Cov}_{j \sim p_i}(\mathrm{d}s_{ij}, v(x_j))$, "
        r"where $\mathrm{d}s_{ij} = \nabla_x s(x_i, x_j) \cdot e_i + \nabla_y s(x_i, x_j) \cdot e_j$."),
    "jensen": (
        "Jensen",
        r"For weights $p_j \ge 0$ summing to one, "
        r"$\|\sum_j p_j V^\top e_j\| \le \|V\|_2 (\sum_j p_j \|e_j\|^2)^{1/2}$."),
    "cauchy-schwarz-cov": (
        "Covariance bound",
        r"$\|\operatorname{Cov}_p(a, w)\| = \|\mathbb{E}_p[(a - \bar a)(w - c)]\| \le "
        r"\operatorname{std}_p(a) \sup_j \|w_j - c\|$ for every vector $c$."),
    "covariance-cap": (
        "Covariance of the values",
        r"For a distribution $p$ on points $w_j$ with $\|w_j - c\| \le \rho$, "
        r"$\operatorname{tr}\operatorname{Cov}_p(w) \le \rho^2$ and, for every $k$, "
        r"$\operatorname{tr}\operatorname{Cov}_p(w) \le \mathbb{E}_p\|w - w_k\|^2 \le 4\rho^2 (1 - p_k)$; "
        r"hence $\sum_i p_{ij} \operatorname{tr}\operatorname{Cov}_{p_i}(w) "
        r"\le \rho^2 \min(\kappa_{n}(\omega), 3n/4)$, "
        r"since $p \min(1, 4(1-p)) \le \min(p, 3/4)$."),
    "mean-abs-cov": (
        "Covariance bound in mean absolute deviation",
        r"$\|\operatorname{Cov}_p(a, w)\| \le \mathbb{E}_p|a - \bar a| \, \sup_j \|w_j - c\|$ and "
        r"$\mathbb{E}_p|a - \bar a| \le 2\,\mathbb{E}_p|a|$."),
    "minkowski": (
        "Minkowski",
        r"$\operatorname{std}(a + b) \le \operatorname{std}(a) + \operatorname{std}(b)$ and "
        r"$\operatorname{std}(a) \le (\mathbb{E} a^2)^{1/2}$; and $\|u + w\|_2 \le \|u\|_2 + \|w\|_2$ "
        r"for vectors of per-token norms."),
    "weight-cap": (
        "Attention weights are capped by the score spread",
        r"If $|s(x, y) - s(x, y')| \le \omega$ for all keys, then "
        r"$p_{ij} \le e^{\omega} / (e^{\omega} + n - 1)$, so every column of $P$ sums to at most "
        r"$\kappa_{n}(\omega) = n e^{\omega} / (e^{\omega} + n - 1) \le \min(n, e^{\omega})$."),
    "causal-cap": (
        "Column sums under causal masking",
        r"Row $i$ attends to $i$ tokens, so $p_{ij} \le e^\omega / (e^\omega + i - 1)$ and every column "
        r"sums to at most $\kappa^{\mathrm{c}}_{n}(\omega) = \sum_{i=1}^{n} e^\omega / (e^\omega + i - 1) "
        r"= e^\omega (\psi(e^\omega + n) - \psi(e^\omega))$."),
    "mean-value": (
        "Mean value theorem",
        r"On a convex set, $\|f(X) - f(X')\| \le \sup_{Z} \|Df(Z)\| \, \|X - X'\|$ for the operator norm "
        r"induced by the chosen norms."),
    "popoviciu": (
        "Popoviciu",
        r"A random variable with values in an interval of length $\ell$ has standard deviation at most "
        r"$\ell / 2$."),
    "norm-equivalence": (
        "Norm equivalence",
        r"$\|u\|_\infty \le \|u\|_2 \le \sqrt{d}\,\|u\|_\infty$ for $u \in \mathbb{R}^d$."),
    "submultiplicative": (
        "Submultiplicativity",
        r"$\|MN\|_2 \le \|M\|_2 \|N\|_2$."),
    "block-diagonal": (
        "Block-diagonal matrices",
        r"$\|\operatorname{diag}(B_1, \dots, B_n)\|_2 = \max_i \|B_i\|_2$; in particular, if $\|B_i\|_2 \le \omega_i$ "
        r"then $\operatorname{diag}(B_i) = \operatorname{diag}(B_i / \omega_i)\,\operatorname{diag}(\omega_i I)$ "
        r"(a zero block where $\omega_i = 0$) with the first factor of norm at most 1."),
    "norm-calculus": (
        "Norm calculus",
        r"Triangle inequality, Cauchy--Schwarz $|\langle u, w\rangle| \le \|u\| \|w\|$, "
        r"submultiplicativity and $\|y - c\| \le R$ on the domain."),
    "value-lipschitz": (
        "Affine values",
        r"$v(y) = V^\top y + b_V$ is $\|V\|_2$-Lipschitz."),
    "value-spread": (
        "Value spread",
        r"$\sup_{y \in B(c, R)} \|v(y) - v(c)\| = \|V\|_2 R$."),
    "score-range": (
        "Score range",
        r"$\sup_{y, y'} |s(x, y) - s(x, y')| \le \sup s - \inf s$, at most $\sup |s|$ for a score of "
        r"constant sign and $2 \sup |s|$ otherwise."),
    "shift-invariance": (
        "Shift invariance of softmax",
        r"Adding to all scores of a row a quantity that does not depend on the key leaves $p_{ij}$ unchanged."),
    "layernorm-ball": (
        "LayerNorm image",
        r"$\mathrm{LN}(x) = \gamma \odot z + c$ with $z \perp \mathbf{1}$, $\|z\| = \sqrt{d}$ "
        r"(less with the LayerNorm $\epsilon$), hence $\|\mathrm{LN}(x) - c\| \le \|\gamma\|_\infty \sqrt{d}$; "
        r"the convex hull of the image lies in that ball."),
    "multi-head": (
        "Multi-head composition",
        r"$F(X) = [f^1(X), \dots, f^H(X)] W_O$: per token $\|[u_1, \dots, u_H] W_O\| \le "
        r"\|W_O\|_2 (\sum_h \|u_h\|^2)^{1/2} \le \|W_O\|_2 \sum_h \|u_h\|$."),
    "residual": (
        "Residual connection",
        r"$\operatorname{Lip}(\mathrm{id} + f) \le 1 + \operatorname{Lip}(f)$ in every norm."),
    "cross-queries": (
        "Cross-attention in the queries",
        r"With the context fixed, $Df_i[E_Y] = \operatorname{Cov}_{j \sim p_i}(\nabla_x s(y_i, x_j) "
        r"\cdot e_i, v(x_j))$: only the query-gradient term survives and no sum over tokens appears."),
    "lambert-moment": (
        "Second moment under L2 attention",
        r"If $p_j \propto e^{-t_j}$ over $N$ tokens with $t_j \ge 0$ and one $t_j = 0$, then "
        r"$\sum_j p_j t_j \le W_0((N - 1)/e)$: with $u_j = e^{-t_j}$, concavity of $-u \log u$ puts the "
        r"maximum at equal $u_j$, and $\max_S -S \log(S/(N-1)) / (1 + S) = W_0((N-1)/e)$."),
    "l2-self-weight": (
        "Self-weight under L2 attention",
        r"A token attends to itself with score $0 \ge s_{ij}$, so $p_{ij} \le p_{ii}$, hence $p_{ij} \le 1/2$ "
        r"for $j \ne i$ and every column of $P$ sums to at most $(n + 1)/2$; and "
        r"$p_{ij} t_{ij} \le t e^{-t} / (1 + e^{-t}) \le W_0(1/e)$."),
    "witness-family": (
        "Unbounded growth",
        r"Along the curve $X_t$, $\|Df(X_t)\| \to \infty$ as $t \to \infty$, so no finite Lipschitz "
        r"constant exists on the unbounded domain."),
    "kantorovich": (
        "Kantorovich--Rubinstein",
        r"$W_1(\mu, \nu) = \sup_{\mathrm{Lip}(\varphi) \le 1} \int \varphi \, d(\mu - \nu)$; for an "
        r"$L$-Lipschitz map $T$, $W_1(T_\# \mu, T_\# \nu) \le L \, W_1(\mu, \nu)$."),
    "permutation-coupling": (
        "Uniform measures of equal size",
        r"For $\mu = \frac1n \sum_i \delta_{x_i}$ and $\nu = \frac1n \sum_i \delta_{y_i}$, "
        r"$W_1(\mu, \nu) = \min_\sigma \frac1n \sum_i \|x_i - y_{\sigma(i)}\| = "
        r"\min_\sigma \frac1n \|X - P_\sigma Y\|_{2,1}$, and attention is permutation-equivariant."),
    "softmax-monotone": (
        "Monotonicity of softmax",
        r"$p_{ij} = m_j e^{s_{ij}} / \sum_l m_l e^{s_{il}}$ increases with $s_{ij}$ and decreases with every "
        r"$s_{il}$, $l \ne j$; so scores within $[s^-_{il}, s^+_{il}]$ give "
        r"$p_{ij} \le m_j e^{s^+_{ij}} / (m_j e^{s^+_{ij}} + \sum_{l \ne j} m_l e^{s^-_{il}})$, and symmetrically."),
    "box-simplex": (
        "Linear functions on the softmax box",
        r"Over $\{p : p^-_l \le p_l \le p^+_l, \sum_l p_l = 1\}$ the maximum of $\sum_l p_l z_l$ is reached by "
        r"raising the weights of the largest $z_l$ from $p^-_l$ to $p^+_l$ in turn until the total is one."),
    "layernorm-jacobian": (
        "Jacobian of LayerNorm",
        r"With $u = Pz$, $n(u) = (\|u\|^2 + d\epsilon)^{1/2}$ and $g = u / n(u)$: "
        r"$D\,\mathrm{LN}(z) = \operatorname{diag}(\gamma) \sqrt d\,(P - g g^\top) / n(u)$, and "
        r"$0 \preceq P - g g^\top \preceq I$."),
    "cap-chord": (
        "Directions in a ball",
        r"If $\|u' - u\| \le R < \|u\|$, the angle between $u'$ and $u$ is at most $\arcsin(R / \|u\|)$, so "
        r"$\|u'/\|u'\| - u/\|u\|\| \le \sqrt{2 - 2\sqrt{1 - R^2/\|u\|^2}}$."),
    "secant-slope": (
        "Secant slopes",
        r"For a $C^1$ function $\sigma$, $(\sigma(b) - \sigma(a)) / (b - a) = \sigma'(\xi)$ for some $\xi$ between "
        r"$a$ and $b$: it lies in the range of $\sigma'$ over $[a, b]$."),
    "telescoping": (
        "Telescoping the chain rule",
        r"$A_m \cdots A_1 - B_m \cdots B_1 = \sum_k A_m \cdots A_{k+1} (A_k - B_k) B_{k-1} \cdots B_1$."),
    "midpoint-integral": (
        "Integral along a segment",
        r"$F(X') - F(X) = \int_0^1 DF(X(t)) (X' - X)\,dt$ for $X(t) = (1 - t) X + t X'$ and $F$ of class $C^1$."),
    "radial-normalization": (
        "Normalisation is radial",
        r"For $g(u) = u / \sqrt{\|u\|^2/d + \varepsilon}$ write $g(u) = h(\|u\|)\, u / \|u\|$ with "
        r"$h(r) = r / \sqrt{r^2/d + \varepsilon}$: $h(r)/r = (r^2/d + \varepsilon)^{-1/2}$ decreases and "
        r"$0 \le h'(r) = \varepsilon\, (r^2/d + \varepsilon)^{-3/2} \le h(r)/r$.  For $\|u\|, \|u'\| \ge r_0$ "
        r"at angle $\theta$, $\|g(u) - g(u')\|^2 = (h(\|u\|) - h(\|u'\|))^2 + 2 h(\|u\|) h(\|u'\|) "
        r"(1 - \cos\theta) \le L^2 \|u - u'\|^2$ with $L = (r_0^2/d + \varepsilon)^{-1/2}$, since "
        r"$\|u - u'\|^2 = (\|u\| - \|u'\|)^2 + 2 \|u\| \|u'\| (1 - \cos\theta)$.  No convexity is needed."),
    "normalization-sharpness": (
        "The normalisation bound is attained",
        r"Let $v$ be a top right singular vector of $D_\gamma \Pi$ ($v \perp \mathbf{1}$).  At a token $x_0$ with "
        r"$\Pi x_0 \perp v$ and $\|\Pi x_0\|^2/d = \sigma_{\min}^2$ ($x_0 = 0$ without a floor), "
        r"$DN(x_0)\, v = D_\gamma \Pi v / \sqrt{\sigma_{\min}^2 + \varepsilon}$, and $x_0 + t v$ keeps the "
        r"variance floor for every real $t$; so the bound is the Lipschitz constant (with a floor, $d \ge 3$ leaves "
        r"room for $\Pi x_0$; for RMSNorm $\Pi = I$, $v$ a unit vector where $|\gamma|$ is largest, $d \ge 2$)."),
    "slope-restriction": (
        "Slope-restricted activations",
        r"If every secant slope $(\varphi(s) - \varphi(t))/(s - t)$ lies in $[\alpha_\varphi, \beta_\varphi]$ "
        r"(for a $C^1$ activation: $\varphi'$ does), then $|\varphi(s) - \varphi(t)| \le \ell_\varphi |s - t|$ "
        r"with $\ell_\varphi = \max(-\alpha_\varphi, \beta_\varphi)$, entrywise and hence in the Euclidean norm."),
    "tokenwise": (
        "Token-wise maps",
        r"If $F(X) = (f(x_1), \dots, f(x_n))$ and $\|f(x) - f(y)\| \le L \|x - y\|$, then "
        r"$\|F(X) - F(Y)\|_{2,p} \le L \|X - Y\|_{2,p}$ for $p \in \{1, 2, \infty\}$ "
        r"($p = 2$: the Frobenius norm)."),
    "composition": (
        "Composition",
        r"If $f$ is $L_f$-Lipschitz on $D$ and $g$ is $L_g$-Lipschitz on a set holding $f(D)$, then "
        r"$g \circ f$ is $L_g L_f$-Lipschitz on $D$."),
    "value-magnitude": (
        "Value magnitude",
        r"$\sup_{y \in B(c, R)} \|V^\top y + b_V\| \le \|V\|_2 R + \|V^\top c + b_V\|$ (triangle inequality)."),
    "sigmoid-derivative": (
        "Derivative of sigmoid attention",
        r"For $f_i(X) = \sum_j \sigma_{ij} v(x_j)$ with $\sigma_{ij} = \sigma(s(x_i, x_j) + b)$, "
        r"$Df_i[E] = \sum_j \sigma_{ij} V^\top e_j + \sum_j \sigma'_{ij}\, \mathrm{d}s_{ij}\, v(x_j)$, where "
        r"$\sigma' = \sigma(1 - \sigma)$ and $\mathrm{d}s_{ij} = \nabla_x s(x_i, x_j) \cdot e_i + "
        r"\nabla_y s(x_i, x_j) \cdot e_j$."),
    "sigmoid-weights": (
        "Sigmoid weights",
        r"$\sigma(t) = 1 / (1 + e^{-t})$ is increasing and $\sigma' = \sigma(1 - \sigma) \le \min(1/4, \sigma)$. "
        r"If $s \le s_{\max}$ and $b = -\log n$, every row and column of $(\sigma_{ij})$ sums to at most "
        r"$n \sigma(s_{\max} - \log n) = n / (1 + n e^{-s_{\max}}) = \frac{n}{n + 1} \kappa_{n+1}(s_{\max}) "
        r"\le \min(n, e^{s_{\max}})$, with $\kappa_N(\omega) = N e^{\omega} / (e^{\omega} + N - 1)$."),
    "schur-test": (
        "Schur's test",
        r"A matrix $M$ with non-negative entries satisfies $\|M\|_2 \le (\max_i \sum_j M_{ij})^{1/2} "
        r"(\max_j \sum_i M_{ij})^{1/2}$."),
    "cube-vertices": (
        "Maxima on a cube",
        r"A convex function on the cube $[-1, 1]^n$ attains its maximum at a vertex $s \in \{-1, 1\}^n$; in "
        r"particular $\|y\|_1 = \max_{t \in \{-1, 1\}^n} t^\top y$ and "
        r"$\max_{\|x\|_\infty \le 1} \|M x\|_1 = \max_{s, t \in \{-1, 1\}^n} t^\top M s$."),
    "semidefinite-cauchy-schwarz": (
        "Cauchy-Schwarz for a positive semidefinite form",
        r"If $M$ is symmetric positive semidefinite, $t^\top M s \le (t^\top M t)^{1/2} (s^\top M s)^{1/2} "
        r"\le \max(t^\top M t, s^\top M s)$. For a probability vector $p$, "
        r"$z^\top (\operatorname{diag}(p) - p p^\top) z = \sum_i p_i z_i^2 - (p^\top z)^2 \ge 0$ (a variance)."),
    "number-partition": (
        "Balanced splits of weights",
        r"For weights $p_i > 0$ there is a sign vector $s$ with $|p^\top s| \le \max_i p_i$ (place the weights "
        r"in decreasing order, each on the lighter side). Deciding whether $p^\top s = 0$ for some $s$, i.e. "
        r"whether the weights split into two sets of equal mass, is the partition problem, NP-complete for "
        r"integer (or rational) weights (Karp 1972; Garey and Johnson 1979, problem SP12) and solvable in time "
        r"polynomial in $n$ and the common denominator by dynamic programming."),
    "proximal-firm": (
        "Proximal maps are firmly non-expansive",
        r"For a proper, closed, convex $\phi$ on a Euclidean space, $P(x) = \arg\min_y \phi(y) + "
        r"\tfrac12 \|y - x\|^2$ satisfies $x - P(x) \in \partial\phi(P(x))$; monotonicity of "
        r"$\partial\phi$ gives $\|P(x) - P(x')\|^2 \le \langle x - x', P(x) - P(x') \rangle$, hence "
        r"$\|P(x) - P(x')\| \le \|x - x'\|$ (Moreau 1965)."),
    "gradient-step": (
        "A relaxed gradient step",
        r"If $0 \preceq M \preceq L I$ and $0 < \eta \le 2 / (2 + L)$, then "
        r"$\|(1 - \eta) I - \eta M\|_2 = \max(|1 - \eta|, |1 - \eta - \eta L|) \le 1 - \eta$."),
    "feature-map": (
        "Linear attention as a Markov kernel",
        r"With $K(x, y) = \phi(W_Q^\top x) \cdot \phi(W_K^\top y) > 0$, the weights "
        r"$p_{ij} = K(x_i, x_j) / \sum_l K(x_i, x_l)$ are the softmax of $s = \log K$. For "
        r"$\phi(t) = \mathrm{elu}(t) + 1$ coordinatewise, $e^{-|t|} \le \phi(t) \le 1 + |t|$ and "
        r"$0 < \phi'(t) \le 1$; hence $\|\phi(u)\| \le \sqrt{d_k} + \|u\|$, "
        r"$\phi(q) \cdot \phi(k) \ge \sum_i e^{-|q_i| - |k_i|} \ge d_k e^{-(\|q\| + \|k\|)/\sqrt{d_k}}$ "
        r"(Jensen and $\|u\|_1 \le \sqrt{d_k} \|u\|$), and "
        r"$\|\nabla_y s\| \le \|W_K\|_2 \|\phi(q)\| / K$."),
    "rotary-offset": (
        "Rotary positions",
        r"With $R(\varphi)$ block-diagonal with $2 \times 2$ rotations by the angles $\theta_l \varphi$, "
        r"$R(\theta p_i)^\top R(\theta p_j) = R(\theta (p_j - p_i)) =: R_\Delta$, orthogonal, with $R_0 = I$: the "
        r"rotated query and key give $s_{ij} = q_i^\top R_\Delta k_j / \sqrt{d_k}$, a function of the offset "
        r"$\Delta = p_j - p_i$."),
    "rotary-query-term": (
        "Query terms under rotary positions",
        r"If $|z_j| \le M$ for every $j$, then "
        r"$\operatorname{std}_{j \sim p}(z_j) \le (\mathbb{E}_p z_j^2)^{1/2} \le M$.  "
        r"Under rotary positions "
        r"$\nabla_x s(x_i, x_j) = A_{\Delta_{ij}} (x_j - c) + W_Q R_{\Delta_{ij}} k_c / \sqrt{d_k}$ "
        r"differs from key to key by its matrix, so the mean value theorem along the keys does not bound the spread; "
        r"the bound on every term does, and with $\|A_\Delta\|_2 \le a$ it gives "
        r"$|\nabla_x s \cdot e| \le (a R + g_K)\|e\|$."),
    "qk-norm": (
        "Facts of QK-norm",
        r"For $n(q) = \gamma \odot q / s$ with $s^2 = \|q\|^2 / d_k + \varepsilon$: $n(q) = \gamma \odot u$ with "
        r"$\|u\|^2 = \|q\|^2 / s^2 < d_k$; $Dn(q) = \operatorname{diag}(\gamma)(I - q q^\top / (d_k s^2)) / s$ with "
        r"$0 \preceq I - q q^\top / (d_k s^2) \preceq I$, so $\|Dn(q)\|_2 \le \|\gamma\|_\infty / \sqrt{\varepsilon}$; "
        r"and $|\sum_l \gamma_{q,l} \gamma_{k,l} u_l v_l| \le \max_l |\gamma_{q,l} \gamma_{k,l}| \, \|u\| \|v\|$."),
    "soft-cap": (
        "Logit soft-capping",
        r"$\sigma(s) = c \tanh(s / c)$ has $0 < \sigma'(s) = 1 - \tanh^2(s / c) \le 1$ and $|\sigma(s)| < c$, so "
        r"$|\sigma(s) - \sigma(s')| \le \min(|s - s'|, 2c)$ and every gradient of $\sigma(s)$ is that of $s$ times a "
        r"factor in $(0, 1]$, a factor that differs from key to key."),
    "position-bias": (
        "Position biases",
        r"Adding $b_{ij}$, constant in $X$, to the scores leaves their derivatives unchanged; if the biases of row $i$ "
        r"spread by at most $\Delta_b$, the scores of the row spread by at most $\omega + \Delta_b$ and "
        r"$p_{ij} \le 1 / (1 + (N_i - 1) e^{-\omega - \Delta_b})$ for a row of $N_i$ keys."),
    "window-cap": (
        "Column sums under a sliding window",
        r"If token $i$ attends to the tokens $j$ with $|i - j| < w$, every row has at least $N = \min(n, w)$ keys and "
        r"every column at most $Q = \min(n, 2w - 1)$ queries, so each column sums to at most "
        r"$Q / (1 + (N - 1) e^{-\omega})$; and $Q - 1 \le 2 (N - 1)$, so this is at most "
        r"$Q / (1 + (Q - 1) e^{-\omega - \log 2}) = \kappa_{Q}(\omega + \log 2)$, with equality when $n \ge 2w - 1$."),
    "causal-window-cap": (
        "Column sums under a causal sliding window",
        r"If token $i$ attends to the tokens $j$ with $0 \le i - j < w$, row $i$ has $\min(i, w)$ keys and "
        r"$p_{ij} \le c(\min(i, w))$, $c(N) = 1 / (1 + (N - 1) e^{-\omega})$.  Column $j$ is read by the queries "
        r"$j, \dots, j + w - 1$; its $t$-th cap $c(\min(j + t, w))$ is at most column 1's $c(\min(1 + t, w))$, and "
        r"it has at most $\min(n, w)$ of them: every column sums to at most "
        r"$\kappa^{\mathrm{c}}_{\min(n, w)}(\omega) = \sum_{i=1}^{\min(n, w)} c(i)$, the sum of column 1."),
    "alibi-columns": (
        "Column sums under ALiBi",
        r"With biases $b_{ij} = -m_A |i - j|$ and a key $t \ge 1$ positions from its query, the $t$ keys between "
        r"them (the query included) are in the query's window and have biases larger by $m_A, 2 m_A, \dots, t m_A$, so "
        r"$p_{ij} \le 1 / (1 + e^{-\omega} \sum_{u=1}^{t} e^{m_A u}) \le 1 / (1 + e^{m_A t - \omega})$; this decreases "
        r"in $t$, and $\sum_{t \ge 1} 1 / (1 + e^{m_A t - \omega}) \le \int_0^\infty dt / (1 + e^{m_A t - \omega}) = "
        r"\log(1 + e^{\omega}) / m_A$.  A column sums to at most $1 + \log(1 + e^\omega) / m_A$ under a causal mask "
        r"and $1 + 2 \log(1 + e^\omega) / m_A$ without."),
    "rmsnorm-image": (
        "RMSNorm image",
        r"$N(x) = \gamma \odot u$ with $u = x / (\|x\|^2 / d + \varepsilon)^{1/2}$, $\|u\|^2 < d$: "
        r"the image lies in the "
        r"convex set $\{\gamma \odot u : \|u\|_2 < \sqrt{d}\} \subset \{x : \|x\|_2 < \|\gamma\|_\infty \sqrt{d}\}$, "
        r"about the origin (no centring, no bias)."),
    "rmsnorm-jacobian": (
        "Jacobian of RMSNorm",
        r"With $s(x) = (\|x\|^2 / d + \varepsilon)^{1/2}$: "
        r"$DN(x) = \operatorname{diag}(\gamma)(I - x x^\top / (d\, s^2)) / s$ "
        r"and $0 \preceq I - x x^\top / (d\, s^2) \preceq I$, so $\|DN(x)\|_2 \le \|\gamma\|_\infty / s(x)$, largest "
        r"at $x = 0$, where it is $\|\gamma\|_\infty / \sqrt{\varepsilon}$."),
    "grouped-heads": (
        "Grouped-query heads",
        r"A head's bound holds whatever it shares with others.  A layer of $H$ query heads has $H$ output blocks: "
        r"$\|[u_1, \dots, u_H] W_O\| \le \|W_O\|_2 (\sum_h \|u_h\|^2)^{1/2}$, and per group "
        r"$\|\sum_{h \in g} u_h W_O^h\| \le \|W_O^g\|_2 (\sum_{h \in g} \|u_h\|^2)^{1/2}$.  Sharing keys and values "
        r"does not reduce $\sqrt{H}$ to $\sqrt{G}$: heads of one group that attend alike give $F = f \sum_h W_O^h$, "
        r"and $\|\sum_h W_O^h\|_2$ reaches $\sqrt{H} \|W_O\|_2$ (equal blocks)."),
    "gated-jacobian": (
        "Jacobian of a gated block",
        r"For $f(x) = W_{\mathrm{down}}^\top (\varphi(g) \odot u)$, $g = W_{\mathrm{gate}}^\top x$, "
        r"$u = W_{\mathrm{up}}^\top x$: "
        r"$Df(x) = W_{\mathrm{down}}^\top (\operatorname{diag}(\varphi'(g) \odot u) W_{\mathrm{gate}}^\top + "
        r"\operatorname{diag}(\varphi(g)) W_{\mathrm{up}}^\top)$.  For SiLU and GELU, $\varphi(t) = t\, m(t)$ "
        r"with $m$ in "
        r"$(0, 1)$, so $|\varphi(t)| \le |t|$.  A diagonal $T$ with $|T_{ii}| \le \tau a_i$, $a_i > 0$, is "
        r"$D_a^{1/2} (T D_a^{-1}) D_a^{1/2}$ with $\|T D_a^{-1}\|_2 \le \tau$, so "
        r"$\|M^\top T N^\top\|_2 \le \tau \|M^\top D_a^{1/2}\|_2 \|D_a^{1/2} N^\top\|_2$."),
    "layerscale": (
        "LayerScale",
        r"$\|\operatorname{diag}(\lambda) u\| \le \|\lambda\|_\infty \|u\|$ for every vector $u$: "
        r"$\operatorname{Lip}(\operatorname{diag}(\lambda) g) \le \|\lambda\|_\infty \operatorname{Lip}(g)$ in every "
        r"norm on $X$."),
}
