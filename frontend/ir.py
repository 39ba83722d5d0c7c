"""What a program adds to a state: text, role blocks, `gen` and `select` (an expression tree).

`s += expr` hands an expression to the state; `a + b` concatenates expressions. Building one
does nothing: the state's executor runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "user", "assistant")


class Expr:
    def __add__(self, other: Expr | str) -> Concat:
        return Concat([self, as_expr(other)])

    def __radd__(self, other: str) -> Concat:
        return Concat([as_expr(other), self])


@dataclass(frozen=True)
class Text(Expr):
    text: str


@dataclass(frozen=True)
class Concat(Expr):
    parts: list[Expr]

    def __add__(self, other: Expr | str) -> Concat:
        return Concat([*self.parts, as_expr(other)])


@dataclass(frozen=True)
class Role(Expr):
    """A message: `role`'s prefix, `content`, its suffix (from the model's chat template)."""

    role: str
    content: Expr | None


@dataclass(frozen=True)
class Gen(Expr):
    """Generate into variable `name`; `sampling` holds radixkv sampling params."""

    name: str | None
    sampling: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Select(Expr):
    """Pick the choice the model finds most likely after the prefix; append it; store it."""

    name: str | None
    choices: list[str]
    method: str = "sum"  # rank by total log-likelihood, or "mean" (per token)


def as_expr(x: Expr | str) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, str):
        return Text(x)
    raise TypeError(f"a program adds text or rk.gen/rk.select/role expressions, not {type(x).__name__}")


def flatten(expr: Expr) -> list[Expr]:
    if isinstance(expr, Concat):
        return [leaf for part in expr.parts for leaf in flatten(part)]
    return [expr]
