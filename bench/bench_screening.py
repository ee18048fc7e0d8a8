"""The float32 screening of whole vocabularies before and after, side by side in one run.

"Before" is ``lipbound.measures.vocabulary.ScreeningModel`` of an earlier commit (``--before``, default
the last commit whose screening had its own hand-written BERT layer), loaded from git next to the
current one, which runs the one float engine (``lipbound.numeric.whole.chain``) in float32.  Both
screen the same candidates -- every vocabulary word at one position of a sentence, in batches of 256
as ``worst_edits`` does -- through every layer of the full all-MiniLM-L6-v2; the runs alternate,
the best of ``--repeat`` is printed, with the ratio after / before and the largest difference of the
attention block outputs (float32 rounding; the target is a ratio <= 1.10).

Run: ``python bench/bench_screening.py [--before REF] [--words N] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from lipbound.measures.bert import BertModel  # noqa: E402
from lipbound.measures.vocabulary import ScreeningModel  # noqa: E402

BEFORE = "483c3f4"


def load_before(ref: str):
    """``ScreeningModel`` of ``ref``, as the module ``lipbound.measures._before_vocabulary``."""
    source = subprocess.run(["git", "show", f"{ref}:lipbound/measures/vocabulary.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    name = "lipbound.measures._before_vocabulary"
    spec = importlib.util.spec_from_loader(name, loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "lipbound.measures"
    sys.modules[name] = module
    exec(compile(source, f"{ref}:lipbound/measures/vocabulary.py", "exec"), module.__dict__)
    return module.ScreeningModel


def screen(model, ids, position, words, batch, last):
    outputs = []
    for begin in range(0, words, batch):
        chunk = np.tile(ids, (min(batch, words - begin), 1))
        chunk[:, position] = np.arange(begin, begin + chunk.shape[0])
        outputs.append(model.block_outputs(chunk, last)[-1])
    return np.concatenate(outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE, help=f"git reference of the old screening (default {BEFORE})")
    parser.add_argument("--words", type=int, default=4096, help="candidates screened (default 4096; 0: all)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--text", default="The cat slept all afternoon.")
    args = parser.parse_args()
    bert = BertModel.from_directory()
    ids = np.array(bert.encode(args.text))
    position, last = 2, bert.num_layers - 1
    words = args.words or bert.model.embeddings.vocab_size
    models = {"before": load_before(args.before)(bert.model), "after": ScreeningModel(bert.model)}
    times, results = {"before": [], "after": []}, {}
    for _ in range(args.repeat):
        for label, model in models.items():
            began = time.perf_counter()
            results[label] = screen(model, ids, position, words, args.batch, last)
            times[label].append(time.perf_counter() - began)
    before, after = min(times["before"]), min(times["after"])
    difference = float(np.max(np.abs(results["after"].astype(np.float64) - results["before"])))
    scale = float(np.max(np.abs(results["before"])))
    print(f"screening {words} candidates x {len(ids)} tokens through {last + 1} layers, batches of {args.batch}, "
          f"best of {args.repeat}")
    print(f"{'before s':>9s} {'after s':>9s} {'after/before':>13s} {'max |diff|':>11s} {'max |output|':>13s}")
    print(f"{before:9.3f} {after:9.3f} {after / before:13.3f} {difference:11.3g} {scale:13.3g}")


if __name__ == "__main__":
    main()
