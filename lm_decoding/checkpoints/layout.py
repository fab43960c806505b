"""Tensor layouts: how a Hugging Face state dict maps onto our parameters.

A checkpoint family (GPT-2, LLaMA) is a `Layout`: the list of its HF tensors,
each a `Tensor` rule naming the parameter leaves it holds. One rule moves a
tensor both ways, so import and export cannot disagree:

  HF tensor  --(transpose if torch Linear)--> [in, out]
             --(split along out)--> one piece per parameter
             --(reshape)--> the parameter's shape

and `join` undoes each step. Examples, with D = 64, H = 4 heads of 16:
  GPT-2 `h.0.attn.c_attn.weight` (Conv1D, [D, 3D]) holds query, key and value
    kernels [D, H, 16] side by side: in_dims 1, no transpose, three pieces.
  LLaMA `layers.0.self_attn.o_proj.weight` (Linear, [D, H*16]) is the out
    kernel [H, 16, D]: in_dims 2 (H and 16 form the input), transposed.
  A norm scale or bias [D] is a vector: in_dims 0.

Loading checks every tensor's presence and shape against the layout the
config implies and refuses unknown tensors, naming each one, before any
parameter is built (`params_from_state_dict`).

torch is never imported: a state dict of torch tensors is read through the
tensors' own `.numpy()`, and `.safetensors` files through the safetensors
numpy API (imported only when a path is given).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any, Callable, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np

from lm_decoding.models.config import TransformerConfig
from lm_decoding.models.quantization import dequantize_params, quantize_params
from lm_decoding.models.transformer import abstract_params

Path = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Tensor:
  """One HF tensor and the parameter leaves it holds.

  Attributes:
    name: the HF state-dict key.
    params: ((path, shape), ...): the leaves, in the order they sit along
      the HF tensor's output axis; path is the key path in our params tree.
    in_dims: how many leading axes of each leaf form the input (all leaves
      share them): 0 for vectors (norms, biases), 1 for [D, ...] kernels and
      embedding tables, 2 for the attention out kernel [H, Dh, D].
    transpose: True when HF stores [out, in] (torch `nn.Linear`); False for
      [in, out] (GPT-2's `Conv1D`, embedding tables) and vectors.
  """

  name: str
  params: tuple[tuple[Path, tuple[int, ...]], ...]
  in_dims: int = 0
  transpose: bool = False

  def _in_out(self) -> tuple[int, list[int]]:
    shapes = [shape for _, shape in self.params]
    fan_in = math.prod(shapes[0][:self.in_dims])
    return fan_in, [math.prod(s[self.in_dims:]) for s in shapes]

  @property
  def shape(self) -> tuple[int, ...]:
    """The HF tensor's shape."""
    fan_in, outs = self._in_out()
    if self.in_dims == 0:
      return (sum(outs),)
    return (sum(outs), fan_in) if self.transpose else (fan_in, sum(outs))

  def split(self, array: np.ndarray) -> list[np.ndarray]:
    """The HF tensor as our leaves (in `params` order)."""
    fan_in, outs = self._in_out()
    matrix = array.T if self.transpose else array
    pieces = np.split(matrix.reshape(fan_in, sum(outs)),
                      np.cumsum(outs)[:-1], axis=1)
    return [p.reshape(shape) for p, (_, shape) in zip(pieces, self.params)]

  def join(self, leaves: Sequence[np.ndarray]) -> np.ndarray:
    """Our leaves (in `params` order) as the HF tensor."""
    fan_in, _ = self._in_out()
    matrix = np.concatenate([np.reshape(x, (fan_in, -1)) for x in leaves],
                            axis=1)
    matrix = matrix.T if self.transpose else matrix
    return np.ascontiguousarray(matrix.reshape(self.shape))


@dataclasses.dataclass(frozen=True)
class Layout:
  """A checkpoint family's tensors for one config.

  Attributes:
    family: the family's name, for messages ('GPT-2', 'LLaMA').
    tensors: every tensor our parameters come from.
    tied: {name: source}: tensors that are copies of another (the LM head of
      a tied model); optional on import (equal to the source when present),
      written on export, as `model.state_dict()` has them.
    canonical: maps a key as found (e.g. without the 'transformer.' prefix
      of GPT2LMHeadModel) to the layout's name.
    ignored: keys matching this regex are not weights (GPT-2's causal-mask
      buffers, the RoPE `inv_freq` some LLaMA files carry) and are skipped,
      after `check_ignored`.
    check_ignored: (name, array) -> None, raising ValueError when a skipped
      buffer disagrees with the config (e.g. RoPE frequencies of another
      base or scaling); None: not checked.
  """

  family: str
  tensors: tuple[Tensor, ...]
  tied: Mapping[str, str] = dataclasses.field(default_factory=dict)
  canonical: Callable[[str], str] = lambda name: name
  ignored: str | None = None
  check_ignored: Callable[[str, np.ndarray], None] | None = None


def lm_head(config: TransformerConfig, name: str, embedding: str
            ) -> tuple[list[Tensor], dict[str, str]]:
  """The LM head's part of a layout: ([the untied head's tensor `name`, a
  torch Linear [V, D] onto lm_head/kernel], {}), or when tied ([], {name:
  embedding}): a tied checkpoint may hold the embedding, the head or both.
  """
  if config.tie_embeddings:
    return [], {name: embedding}
  return [Tensor(name, ((("lm_head", "kernel"),
                         (config.d_model, config.vocab_size)),), 1,
                 transpose=True)], {}


def hf_fields(hf_config: Any) -> dict:
  """The fields of a `transformers` config object or of its dict form.

  Raises:
    ValueError: neither a mapping nor an object with `to_dict()`.
  """
  if isinstance(hf_config, Mapping):
    return dict(hf_config)
  if hasattr(hf_config, "to_dict"):
    return hf_config.to_dict()
  raise ValueError(f"hf_config must be a transformers config or a dict; got "
                   f"{type(hf_config).__name__}")


def check_model_type(hf: Mapping[str, Any], accepted: Sequence[str],
                     family: str) -> str:
  """The config's `model_type` (the first accepted one when absent).

  Raises:
    ValueError: a model_type outside `accepted`, named.
  """
  model_type = hf.get("model_type") or accepted[0]
  if model_type not in accepted:
    raise ValueError(f"model_type={model_type!r} is not a {family} "
                     f"checkpoint; this importer reads {list(accepted)}")
  return model_type


def eos_ids(hf: Mapping[str, Any], family: str) -> tuple[int, ...]:
  """The config's `eos_token_id` (an id or a list of ids) as a tuple.

  Raises:
    ValueError: none (a generated row could never end), naming `family`.
  """
  value = hf.get("eos_token_id")
  ids = () if value is None else (
      (int(value),) if isinstance(value, int) else tuple(int(i)
                                                         for i in value))
  if not ids:
    raise ValueError(f"{family} config has no eos_token_id; pass the "
                     f"checkpoint's (generation_config.json)")
  return ids


def read_state_dict(source: Any) -> dict[str, np.ndarray]:
  """A state dict of numpy arrays from a path, paths or a mapping.

  Args:
    source: a `.safetensors` file path (str or os.PathLike), a sequence of
      them (a sharded checkpoint), or a mapping of name -> numpy array or
      torch tensor (e.g. `model.state_dict()`; torch tensors are converted
      with their own `.numpy()`, floating ones via float32).
  Raises:
    ValueError: a path that is not a `.safetensors` file, or a value that is
      neither an array nor a tensor.
  """
  if isinstance(source, (str, os.PathLike)):
    source = [source]
  if not isinstance(source, Mapping):
    state = {}
    for path in source:
      path = os.fspath(path)
      if not path.endswith(".safetensors") or not os.path.isfile(path):
        raise ValueError(f"checkpoint path {path!r} must be an existing "
                         f".safetensors file")
      from safetensors.numpy import load_file  # the [peer] extra
      state.update(load_file(path))
    return state
  state = {}
  for name, value in source.items():
    if hasattr(value, "detach"):  # a torch tensor; torch stays unimported
      value = value.detach().cpu()
      value = (value.float() if value.is_floating_point() else value).numpy()
    if not isinstance(value, (np.ndarray, np.generic, jax.Array)):
      raise ValueError(f"tensor {name!r} is a {type(value).__name__}; "
                       f"expected a numpy array or torch tensor")
    state[name] = np.asarray(value)
  return state


def _check_covers(layout: Layout, config: TransformerConfig) -> None:
  """Raises ValueError unless the layout's leaves are exactly the model's."""
  expected = {tuple(k.key for k in path): leaf.shape
              for path, leaf in jax.tree_util.tree_leaves_with_path(
                  nn.meta.unbox(abstract_params(config)))}
  mapped = {path: shape for t in layout.tensors for path, shape in t.params}
  if mapped != expected:
    missing = sorted("/".join(p) for p in set(expected) - set(mapped))
    raise ValueError(f"the {layout.family} layout does not cover this config "
                     f"(unmapped parameters: {missing}); {config}")


def params_from_state_dict(layout: Layout, source: Any,
                           config: TransformerConfig) -> dict:
  """Our parameter tree (numpy, config.param_dtype) from an HF checkpoint.

  Args:
    layout: the family's layout for `config`.
    source: see `read_state_dict`.
    config: the model the parameters are for (e.g. from `config_from_hf`).
  Returns:
    A nested dict of numpy arrays, the tree `init_params(config)` returns
    (with config.quantization 'int8_weights', the float weights quantised
    by `quantize_params`). A tied pair (`Layout.tied`) may be found as
    either tensor or both.
  Raises:
    ValueError: a tensor missing, of the wrong shape, or not in the layout
      (each named with the expected shape); a tied copy that differs from its
      source; a skipped buffer that disagrees with the config
      (`Layout.check_ignored`); a config the layout does not cover (e.g. a
      length head).
  """
  float_config = config.replace(quantization="none")
  _check_covers(layout, float_config)
  state, found_as = {}, {}
  for name, value in read_state_dict(source).items():
    if layout.ignored and re.search(layout.ignored, name):
      if layout.check_ignored is not None:
        layout.check_ignored(name, value)
      continue
    state[layout.canonical(name)] = value
    found_as[layout.canonical(name)] = name
  for copy, origin in layout.tied.items():  # a tied file may hold either
    if origin not in state and copy in state:
      state[origin] = state.pop(copy)
  known = {t.name for t in layout.tensors} | set(layout.tied)
  unexpected = sorted(found_as[n] for n in set(state) - known)
  if unexpected:
    raise ValueError(f"unexpected tensors {unexpected} (not in the "
                     f"{layout.family} layout of this config)")
  for t in layout.tensors:
    if t.name not in state:
      raise ValueError(f"checkpoint lacks tensor {t.name!r} (expected shape "
                       f"{t.shape})")
    if tuple(state[t.name].shape) != t.shape:
      raise ValueError(f"tensor {t.name!r} has shape "
                       f"{tuple(state[t.name].shape)}; expected {t.shape}")
  for copy, origin in layout.tied.items():
    if copy in state and not np.array_equal(state[copy], state[origin]):
      raise ValueError(f"tensor {copy!r} differs from {origin!r} but the "
                       f"config ties them (tie_embeddings=True)")
  params: dict = {}
  dtype = config.weight_dtype
  for t in layout.tensors:
    for (path, _), leaf in zip(t.params, t.split(state[t.name])):
      node = params
      for key in path[:-1]:
        node = node.setdefault(key, {})
      node[path[-1]] = np.asarray(leaf, dtype)
  if config.quantization != "none":
    params = jax.tree.map(np.asarray, quantize_params(params, float_config))
  return params


def state_dict_from_params(layout: Layout, params: Any,
                           config: TransformerConfig) -> dict[str, np.ndarray]:
  """The HF state dict (numpy) of our parameters: the inverse of import.

  Tied copies are written too, so the keys are those of the HF model's
  `state_dict()`. int8-weight parameters are written dequantised (float).

  Raises:
    ValueError: a config the layout does not cover.
  """
  _check_covers(layout, config.replace(quantization="none"))
  params = nn.meta.unbox(params)
  if config.quantization != "none":
    params = dequantize_params(params, config.weight_dtype)

  def leaf(path):
    node = params
    for key in path:
      node = node[key]
    return np.asarray(node)

  state = {t.name: t.join([leaf(p) for p, _ in t.params])
           for t in layout.tensors}
  for copy, origin in layout.tied.items():
    state[copy] = state[origin].copy()
  return state
