"""`Choice`: the base of every closed option set (a quantization method, a KV cache, an INT4
algorithm, ...), a str-valued enum whose members are their spellings.

A member is its string everywhere it travels: `str()`, f-strings, JSON and dict look-ups by the
plain string give the same as the spelling, so the CLI, artifact.json and the records keep their
words. (Python 3.11's StrEnum would do the same for `str()`, but hashes by the member's name.)
"""

from __future__ import annotations

from enum import Enum
from typing import Any, TypeVar

from chattts_forge.errors import BadInput

C = TypeVar("C", bound="Choice")


class Choice(str, Enum):
    """A closed set of spellings; `Kind.parse(text, what)` is the one way a string becomes a member."""

    __str__ = str.__str__
    __format__ = str.__format__
    __hash__ = str.__hash__  # a member finds the entry of its plain spelling in a dict, and back

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """The spellings, in declaration order (a click.Choice's list, an error's "choose from")."""
        return tuple(m.value for m in cls)

    @classmethod
    def parse(cls: type[C], value: Any, what: str) -> C:
        """`value` as a member; any other value: a one-line BadInput naming `what` and the choices."""
        try:
            return cls(value)
        except ValueError:
            raise BadInput(f"unknown {what} '{value}' (choose from: {', '.join(cls.values())})") from None


def plain(value: Any) -> Any:
    """A record's value with its Choice members as plain strings (what JSON and comparisons see)."""
    return value.value if isinstance(value, Choice) else value
