"""Attention on probability measures, exact Wasserstein-1, and a numpy BERT on real text.

* :mod:`~lipbound.measures.empirical`: empirical measures and attention as a map on them
  (Vuckovic, Baratin, Tachet des Combes 2020);
* :mod:`~lipbound.measures.wasserstein`: exact W1 (assignment problem or transport LP);
* :mod:`~lipbound.measures.bert`: a BERT checkpoint with its tokenizer (the one tokenizer interface,
  :class:`lipbound.numeric.model.Tokenizer`), for experiments on real text.
"""

from .bert import AttentionBlockOutput, BertModel, default_model_dir
from .empirical import (
                        EmpiricalMeasure,
                        attention_map,
                        cross_attention_measure,
                        layer_map,
                        self_attention_layer_measure,
                        self_attention_measure,
)
from .wasserstein import OptimalCoupling, ground_cost, w1, w1_line, w1_with_plan

__all__ = [
    "EmpiricalMeasure", "attention_map", "self_attention_measure", "cross_attention_measure",
    "layer_map", "self_attention_layer_measure",
    "OptimalCoupling", "w1", "w1_with_plan", "w1_line", "ground_cost",
    "BertModel", "AttentionBlockOutput", "default_model_dir",
]
