"""The codec every message family uses: the protocol's version, how a family of structs
is defined from a table, the refusal every decoder raises, and encoding and decoding.

Each message is a msgspec ``Struct`` whose field types carry their bounds
(``edge_agent.protocol.fields``), so decoding and validating are one pass in C
(``decode_checked``); a failure is ``Rejected`` with a short reason that becomes a
counter label.
"""

import re
import sys

import msgspec
from msgspec import Struct

PROTOCOL_VERSION = 1
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
