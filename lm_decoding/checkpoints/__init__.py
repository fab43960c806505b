"""Import and export of Hugging Face checkpoints (GPT-2, LLaMA-style).

Each family module has `config_from_hf(hf_config, **overrides)`,
`params_from_hf(source, config)` and `params_to_hf(params, config)`; both
directions run through one `layout.Layout` per family. torch and
transformers are not needed (safetensors only to read `.safetensors` files):
they are the `[peer]` extra, used by the parity tests and benchmarks.
"""

from lm_decoding.checkpoints import hf_gpt2, hf_llama

__all__ = ["hf_gpt2", "hf_llama"]
