"""The bounded field types every message of the protocol is made of: names, units, codes,
counts and floats with their limits in the type, so that decoding checks them."""

import sys
from typing import Annotated, Literal

from msgspec import Meta

from edge_agent.mechanisms import EPSILON_MAX, GRID_BITS_MAX, GRID_BITS_MIN
from edge_agent.mechanisms.categorical import LABEL, UNIT
from edge_agent.protocol.topics import NAME_CHARS

MAX_CODES = 100_000  # per list of codes
# Sequence numbers below 2**53: exact as a JSON number anywhere (JavaScript, doubles); an
# agent sending one report a millisecond takes 285,000 years to get there.
SEQ_LIMIT = 1 << 53
MAX_FIELDS = 64  # axes of a vector channel

_FLOAT_MAX = sys.float_info.max

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
