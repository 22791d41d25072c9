"""What every message of the protocol is made of: bounded field types, the struct
families are defined with, the refusal every decoder raises, and the codec.

Each message is a msgspec ``Struct`` whose field types carry their bounds, so decoding
and validating are one pass in C (``decode_checked``); a failure is ``Rejected`` with a
short reason that becomes a counter label.
"""

import re
import sys
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

from edge_agent.mechanisms import EPSILON_MAX, GRID_BITS_MAX, GRID_BITS_MIN
from edge_agent.mechanisms.categorical import LABEL, UNIT
from edge_agent.protocol.topics import NAME_CHARS

PROTOCOL_VERSION = 1
MAX_CODES = 100_000  # per list of codes
# Sequence numbers below 2**53: exact as a JSON number anywhere (JavaScript, doubles); an
# agent sending one report a millisecond takes 285,000 years to get there.
SEQ_LIMIT = 1 << 53
MAX_FIELDS = 64  # axes of a vector channel

_FLOAT_MAX = sys.float_info.max

# -- bounded scalars ---------------------------------------------------------------------------
# "(?!\n)$": Python's "$" also matches before a final newline, JSON Schema's does not.
Name = Annotated[str, Meta(pattern=f"^{NAME_CHARS}(?!\\n)$",
                           description="1-64 characters of A-Z a-z 0-9 . _ -, starting with "
                                       "a letter or digit")]
RunId = Annotated[str, Meta(pattern="^[A-Za-z0-9_.-]{1,64}(?!\\n)$")]
Label = Annotated[str, Meta(max_length=40)]  # a refusal reason or similar short word
CategoryLabel = Annotated[str, Meta(pattern=f"^{LABEL.pattern}(?!\\n)$",
                                    description="a category's name: 1-40 characters, "
                                                "no control characters")]
Unit = Annotated[str, Meta(pattern=f"^{UNIT.pattern}(?!\\n)$",
                           description="a unit of measurement, free text: 1-16 characters, "
                                       "no control characters or braces")]
Seed = Annotated[int, Meta(ge=0, lt=1 << 32)]
Text = Annotated[str, Meta(max_length=1024)]
Finite = Annotated[float, Meta(ge=-_FLOAT_MAX, le=_FLOAT_MAX)]
NonNegative = Annotated[float, Meta(ge=0.0, le=_FLOAT_MAX)]
Positive = Annotated[float, Meta(gt=0.0, le=_FLOAT_MAX)]
Epsilon = Annotated[float, Meta(gt=0.0, le=EPSILON_MAX)]
SplitEpsilon = Annotated[float, Meta(ge=0.0, le=EPSILON_MAX)]  # one side of a polar split
GridBits = Annotated[int, Meta(ge=GRID_BITS_MIN, le=GRID_BITS_MAX)]
Count = Annotated[int, Meta(ge=0, le=2**63 - 1)]
Seq = Annotated[int, Meta(ge=0, lt=SEQ_LIMIT)]
Code = Annotated[int, Meta(ge=0, lt=1 << GRID_BITS_MAX)]
CodeList = Annotated[list[Code], Meta(max_length=MAX_CODES)]
Fields = Annotated[tuple[Name, ...], Meta(min_length=2, max_length=MAX_FIELDS)]
Side = Literal["min", "max"]


class Rejected(Exception):
    """A message that breaks the protocol; ``reason`` is a short counter label."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def define(module: str, name: str, base: type[Struct], tag: str, fields: list = (),
           **options) -> type[Struct]:
    """A struct ``module.name`` with ``base``'s fields and ``fields``, tagged ``tag``: one of
    a family of messages defined by a table.  It is made a module attribute, so it pickles
    and the JSON Schema calls it by its name."""
    cls = msgspec.defstruct(name, list(fields), bases=(base,), tag=tag, module=module,
                            **options)
    setattr(sys.modules[module], name, cls)
    return cls


# -- encoding and decoding ---------------------------------------------------------------------

_encoder = msgspec.json.Encoder()


def encode(message: Struct) -> bytes:
    """Compact JSON; a non-finite float becomes null (JSON has no NaN)."""
    return _encoder.encode(message)


# " - at `$.codes[3]`" ends a validation error about a field; errors about the document
# itself ("Object missing required field `seq`") name no path.
_ERROR_PATH = re.compile(r" - at `\$\.?([A-Za-z_]*)(.*)`$")


def decode_checked(decoder: msgspec.json.Decoder, payload: bytes, reasons: dict,
            not_an_object: str = "schema"):
    """``decoder.decode(payload)``, or ``Rejected``: ``json`` for what is not JSON,
    ``not_an_object`` for a document that is not an object, ``reasons[field]`` for an
    error in that field (a pair: (the field itself, an element inside it)), else
    ``schema``."""
    try:
        return decoder.decode(payload)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _ERROR_PATH.search(text)
        if match is None:
            reason = not_an_object if text.startswith("Expected `object`") else "schema"
        else:
            field, inside = match.groups()
            reason = reasons.get(field, "schema")
            if isinstance(reason, tuple):
                reason = reason[1] if inside else reason[0]
        raise Rejected(reason, text[:300]) from None
    except msgspec.DecodeError as exc:  # not JSON at all (or not UTF-8)
        raise Rejected("json", str(exc)[:300]) from None
    except UnicodeDecodeError as exc:  # msgspec's error for a string that is not UTF-8
        raise Rejected("json", str(exc)[:300]) from None
