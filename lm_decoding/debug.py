"""A debug switch: in-jit checks of every model call inside the decode steps.

    LM_DECODING_DEBUG=1 python experiments/compare_decoding.py ...
    # or, in Python:
    from lm_decoding import debug
    debug.enable()

With the switch on, every model call a decoder makes (`base.forward`) checks
the logits' shape when it is traced (logits float[B, L, V] for tokens
int[B, L]) and, inside the compiled step, that no logit is NaN or +inf
(-inf rules a token out), with
`jax.experimental.checkify`: the decoders' jitted functions (`debug.jit`)
are then checkified, so a NaN or inf logit raises `checkify.JaxRuntimeError`
naming the role and the call, at the step where it appeared, instead of
decoding garbage. With the switch off (the default) nothing is traced: the
decoders run their plain `jax.jit` functions, bit for bit and at the same
cost.

Checked programs are traced afresh on each call (a debugging mode: slow).
Only model calls traced inside a `debug.jit` function are checked for
finiteness: a decoder whose compiled function is a plain `jax.jit` gets the
shape check only, and a decoder called inside an enclosing plain `jax.jit`
(the comparison harness's timed programs) must be checkified by it; call
`decode` directly to debug a decoder.
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.experimental import checkify

ENV_VAR = "LM_DECODING_DEBUG"
_enabled = os.environ.get(ENV_VAR, "") not in ("", "0")
_checkified = 0  # > 0 while a `debug.jit` function is traced checkified


def enable(on: bool = True) -> None:
  """Turns the in-jit checks on (or off with `on=False`)."""
  global _enabled
  _enabled = bool(on)


def enabled() -> bool:
  """Whether the checks are on (set by `enable` or LM_DECODING_DEBUG=1)."""
  return _enabled


def check_logits(role: str, logits: jax.Array, tokens: jax.Array) -> None:
  """Under the switch: logits float[B, L, V] for tokens int[B, L], finite.

  The shape is checked when traced (ValueError); finiteness by a checkify
  check in the compiled program, when the call is traced inside a
  `debug.jit` function (elsewhere a check could not be raised). Does nothing
  with the switch off.
  """
  if not _enabled:
    return
  if logits.ndim != 3 or logits.shape[:2] != tokens.shape:
    raise ValueError(f"role {role!r}: logits of shape {logits.shape} for "
                     f"tokens {tokens.shape}; expected [B, L, V] = "
                     f"{tokens.shape + ('V',)}")
  # -inf is a legitimate logit (a token ruled out); NaN and +inf are not.
  if not _checkified:
    return
  checkify.check(jnp.all(~jnp.isnan(logits) & (logits < jnp.inf)),
                 f"role {role!r}: non-finite logits (NaN or +inf) for tokens "
                 f"{tokens.shape}")


def jit(fun: Callable | None = None, *, static_argnames: tuple[str, ...] = (),
        **jit_kwargs: Any) -> Callable:
  """`jax.jit` that, with the switch on, runs `fun` checkified.

  Use as `@debug.jit(static_argnames=(...))` on a decoder's compiled
  function. Off, or called inside a plain `jax.jit`: the plain jitted
  function is called. On: static arguments are bound, the rest traced
  through `checkify.checkify`, and a failed check raised (inside an
  enclosing checkified function, passed on to it).
  """
  if fun is None:
    return functools.partial(jit, static_argnames=static_argnames,
                             **jit_kwargs)
  plain = jax.jit(fun, static_argnames=static_argnames, **jit_kwargs)
  signature = inspect.signature(fun)

  @functools.wraps(fun)
  def call(*args, **kwargs):
    global _checkified
    arguments = signature.bind(*args, **kwargs).arguments
    traced = any(isinstance(leaf, jax.core.Tracer)
                 for leaf in jax.tree.leaves(dict(arguments)))
    if not _enabled or (traced and not _checkified):
      return plain(*args, **kwargs)  # off, or inside a plain jax.jit
    static = {n: arguments.pop(n) for n in static_argnames if n in arguments}
    checked = checkify.checkify(functools.partial(fun, **static))
    _checkified += 1
    try:
      error, out = jax.jit(checked)(**arguments)
    finally:
      _checkified -= 1
    checkify.check_error(error)
    return out

  return call
