"""What an importer does with each option of a Hugging Face config.

Every key of the config (`config.json`, or a `transformers` config's
`to_dict()`) has one rule in the family's table, else in `GENERIC`:

  READ      mapped onto a `TransformerConfig` field by the family's
            `config_from_hf` (which refuses values it cannot represent);
  IGNORED   no effect on the forward pass at inference (dropout rates,
            initialisation, token ids, generation defaults, bookkeeping);
  a tuple   only these values are accepted (the ones that leave the forward
            pass as our model computes it); any other is refused by name.

A key in neither table is refused by name too: an option the importer does
not know may change the model, and reading the rest of the file would then
give different logits with no error. All of this runs on the config alone,
before any tensor is read.

`OVERRIDES` are the `TransformerConfig` fields a caller may set on top of
an import (every family accepts each); the others come from the checkpoint.
"""

from __future__ import annotations

from typing import Any, Mapping

READ = "read"
IGNORED = "ignored"

# Options of every `transformers` config (PretrainedConfig), and the
# generation defaults older versions saved beside them.
GENERIC: Mapping[str, Any] = {
    **{name: IGNORED for name in (
        "transformers_version", "architectures", "model_type", "auto_map",
        "_name_or_path", "_attn_implementation", "_attn_implementation_autoset",
        "output_hidden_states", "output_attentions", "return_dict", "dtype",
        "torch_dtype", "use_bfloat16", "torchscript", "chunk_size_feed_forward",
        "id2label", "label2id", "num_labels", "problem_type",
        "finetuning_task", "tokenizer_class", "prefix", "task_specific_params",
        "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
        "decoder_start_token_id", "use_cache", "initializer_range",
        "is_decoder", "tie_encoder_decoder", "tf_legacy_loss",
        "max_length", "min_length", "do_sample", "early_stopping",
        "num_beams", "num_beam_groups", "diversity_penalty", "temperature",
        "top_k", "top_p", "typical_p", "repetition_penalty",
        "length_penalty", "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size", "bad_words_ids",
        "num_return_sequences", "output_scores", "return_dict_in_generate",
        "forced_bos_token_id", "forced_eos_token_id",
        "remove_invalid_values", "exponential_decay_length_penalty",
        "suppress_tokens", "begin_suppress_tokens")},
    "is_encoder_decoder": (False,),
    "add_cross_attention": (False,),
    "cross_attention_hidden_size": (None,),
    "pruned_heads": ({},),
    "quantization_config": (None,),
}

OVERRIDES = ("attention", "block_length", "dtype", "param_dtype",
             "quantization", "kv_cache_dtype")


def check(hf: Mapping[str, Any], table: Mapping[str, Any],
          family: str) -> None:
  """Refuses the first option (sorted by name) the family cannot represent.

  Args:
    hf: the config's fields.
    table: the family's rules (module docstring); `GENERIC` fills in.
    family: for messages, e.g. 'Mistral'.
  Raises:
    ValueError: an option unknown to both tables, or one whose value is not
      among those accepted; the message names the option and its value.
  """
  for name in sorted(hf):
    rule = table.get(name, GENERIC.get(name))
    value = hf[name]
    if rule is None:
      raise ValueError(f"{family} config option {name}={value!r} is not "
                       f"represented by this importer (refused rather than "
                       f"ignored: it may change the model)")
    if isinstance(rule, tuple) and value not in rule:
      raise ValueError(f"{family} config option {name}={value!r} is not "
                       f"supported; accepted: {list(rule)}")


def overridden(fields: dict, overrides: Mapping[str, Any],
               family: str) -> dict:
  """`fields` updated with `overrides`, each of which must be in OVERRIDES.

  Raises:
    ValueError: an override that is not in OVERRIDES (a field read from the
      checkpoint, or no field at all), named.
  """
  refused = sorted(set(overrides) - set(OVERRIDES))
  if refused:
    raise ValueError(f"overrides {refused} are not allowed on a {family} "
                     f"import (read from the checkpoint); allowed: "
                     f"{list(OVERRIDES)}")
  return {**fields, **overrides}
