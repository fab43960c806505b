"""Training objectives, one module per family, and their registry.

  ar           next-token cross-entropy, scheduled sampling (`ar.py`)
  mdlm         MDLM's continuous-time NELBO (`mdlm.py`)
  bd3lm        BD3-LM's block NELBO and block-size schedule (`bd3lm.py`)
  uniform      uniform-state diffusion's NELBO (`uniform.py`)
  translation  prefix-LM AR, CMLM with a length head, CTC (`translation.py`)
  tasks        the exact-answer tasks' AR, MDLM and BD3-LM (`tasks.py`)
  common       what two families or more share (`common.py`)
  registry     one `Objective` entry per name: what the trainer asks
               (`registry.py`; a new objective is a module and one entry)

This package re-exports the LM families' public functions, so
`objectives.mdlm_loss` is `objectives.mdlm.mdlm_loss`.

Each objective is a pure function of (params, tokens, key) once the model is
bound, so it can be jitted and differentiated:

    loss_fn = functools.partial(mdlm_loss, make_logits_fn(config))
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, tokens, key)

The model enters as a `logits_fn`, the decoder boundary of
`lm_decoding.decoding.base`: (params, tokens, positions, cache=None,
attention_mask=None) -> `ModelOutput` (float32 logits, cache, hidden).
`make_logits_fn(config)` is hashable (usable as a static jit argument) and
tests pass stub logits instead. When `logits_fn` has a `config`, its attention kind is checked:
a causal model for `ar_*`, a non-causal one for `mdlm_*` and `bd3lm_*` (BD3-LM
passes its own block masks).

Self-conditioning (Chen et al. 2022, arXiv:2208.04202; DiffusionGemma),
read from the model (`TransformerConfig.self_conditioning`), in `mdlm_*` and
`uniform_*`: a first pass at x_t without a previous prediction gives
probabilities (gradient stopped) that a second pass takes as its input, in
a random half of the training rows (`self_conditioning_rows`; zeros in the
others) and in every row of the validation bounds. The first pass is a
function of x_t alone, so either way the second pass is a denoiser of x_t
and its loss the exact NELBO of the model given its input; the bounds are
those of the two-pass model the sampler runs (2K passes).

Every objective returns `(loss, metrics)`:
  metrics['nll']:    float32[] negative log-likelihood (for MDLM and BD3-LM,
                     its upper bound, the NELBO) summed over the batch, in
                     nats.
  metrics['tokens']: float32[] number of scored tokens.
  metrics['loss']:   nll / tokens, the returned loss (nats per token).
Validation sums 'nll' and 'tokens' over batches and reports
exp(sum nll / sum tokens) as perplexity (an upper bound of it for MDLM and
BD3-LM).

PAD (id 0) marks positions outside a sequence: never a target, never masked.

Adapting an AR parent (DiffuLLaMA, Gong et al. 2025; Fast-dLLM v2, Wu et al.
2025; SDAR, Cheng et al. 2025) uses three options of the diffusion
objectives, each keeping the loss the exact NELBO of the resulting model:
  token shift    read from the model (`TransformerConfig.token_shift`): the
                 logits at i predict token i + 1 (`diffusion.shift_logits`),
                 so the parent's head keeps its alignment; token 0 has no
                 predictor and is never masked nor counted (as AR's
                 `ar_eval` scores tokens 1..L-1). In BD3-LM the first token
                 of block n is predicted from the clean copy's last token of
                 block n - 1, the others from the noisy block: with blocks of
                 1 every prediction is the parent's causal one.
  complementary  each row is scored twice, once with its mask and once with
                 the complement (every maskable token masked in exactly one
                 of the pair, `complement`), the complement at the time t'
                 whose masking probability is 1 - that of t: both halves
                 estimate the same NELBO, and every token trains.
  visible_ahead  (MDLM) attention-mask annealing: a query sees the keys at
                 most this many positions ahead of it (0: causal, L - 1:
                 bidirectional); the train step anneals it linearly
"""

from lm_decoding.training.objectives.ar import (
    ar_eval, ar_loss, ar_scheduled_sampling_loss, scheduled_sampling_inputs,
    scheduled_sampling_probability)
from lm_decoding.training.objectives.bd3lm import (
    bd3lm_bound, bd3lm_loss, bd3lm_noise, block_length_at,
    parse_block_schedule)
from lm_decoding.training.objectives.common import (
    SELF_CONDITIONING_RATE, complement, denoiser_logits, mask_at_time,
    maskable, mdlm_nelbo_terms, sample_times, self_conditioning_rows,
    target_log_probs)
from lm_decoding.training.objectives.mdlm import (
    mdlm_bound, mdlm_loss, visible_ahead)
from lm_decoding.training.objectives.uniform import (
    uniform_bound, uniform_loss, uniform_nelbo_terms, uniform_noise)

__all__ = [
    "SELF_CONDITIONING_RATE", "ar_eval", "ar_loss",
    "ar_scheduled_sampling_loss", "bd3lm_bound", "bd3lm_loss", "bd3lm_noise",
    "block_length_at", "complement", "denoiser_logits", "mask_at_time",
    "maskable", "mdlm_bound", "mdlm_loss", "mdlm_nelbo_terms",
    "parse_block_schedule", "sample_times", "scheduled_sampling_inputs",
    "scheduled_sampling_probability", "self_conditioning_rows",
    "target_log_probs", "uniform_bound", "uniform_loss",
    "uniform_nelbo_terms", "uniform_noise", "visible_ahead"]
