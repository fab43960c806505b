"""Predicates for option checks, shared by every layer.

Configs and decoder options are checked before anything compiles, and a
`ValueError` names the argument and its allowed range. These predicates say
whether a value is a count or a number at all, the part every check shares;
each caller states its own range in its message (`check_counts` raises for
the most common one, integers >= 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def is_integer(value: Any) -> bool:
  """True for an integer that is not a bool (True would pass as 1)."""
  return (isinstance(value, (int, np.integer))
          and not isinstance(value, (bool, np.bool_)))


def is_count(value: Any, minimum: int = 1) -> bool:
  """True for an integer (not a bool) >= minimum: a size or step option."""
  return is_integer(value) and value >= minimum


def check_counts(options: Any, names: tuple[str, ...]) -> None:
  """Raises ValueError naming the first attribute of `options` in `names`
  that is not an integer >= 1 (`is_count`)."""
  for name in names:
    if not is_count(getattr(options, name)):
      raise ValueError(f"{name}={getattr(options, name)!r} must be an "
                       f"integer >= 1")


def is_number(value: Any) -> bool:
  """True for a real number that is not a bool (True would pass as 1)."""
  return (isinstance(value, (int, float, np.integer, np.floating))
          and not isinstance(value, (bool, np.bool_)))
