"""docs/reference/CONFIG_REFERENCE.md is generated from the configuration models and kept
current."""

from __future__ import annotations

import re
import types
import typing
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field

from collector.config import CollectorConfig
from edge_agent.config import AgentConfig
from tests.support import REPO
from tests.support.paths import load_script

REFERENCE = REPO / "docs" / "reference" / "CONFIG_REFERENCE.md"


gen = load_script("gen_config_reference")


def test_reference_is_up_to_date():
    committed = REFERENCE.read_text() if REFERENCE.exists() else ""
    assert committed == gen.render(), (
        "docs/reference/CONFIG_REFERENCE.md is out of date with the configuration models or the "
        "sample configs: run `make docs` and commit the result")


# -- every key of both models appears, in its table's section -------------------------------

def _unwrap(tp):
    """Strip Annotated and Optional; returns the bare annotation."""
    while True:
        if typing.get_origin(tp) is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in \
                typing.get_args(tp):
            rest = [a for a in typing.get_args(tp) if a is not type(None)]
            tp = rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]
        else:
            return tp


def _discriminator(tp) -> str | None:
    for item in typing.get_args(tp)[1:] if typing.get_origin(tp) is typing.Annotated else ():
        if getattr(item, "discriminator", None):
            return item.discriminator
    return None


def _tables(model: type[BaseModel], anchor: str):
    """(anchor, model) for a model and every table below it, variants by discriminator."""
    yield anchor, model
    for name, info in model.model_fields.items():
        tp = _unwrap(info.annotation)
        key = None
        if typing.get_origin(tp) is list:
            item = typing.get_args(tp)[0]
            key = _discriminator(item)
            tp = _unwrap(item)
        child = anchor.removesuffix("top") + name if anchor.endswith("-top") else \
            f"{anchor}-{name}"
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            yield from _tables(tp, child)
        elif key is not None:
            for variant in typing.get_args(tp):
                tag, = typing.get_args(variant.model_fields[key].annotation)
                yield from _tables(variant, f"{child}-{tag}")


def _sections(text: str) -> dict[str, set[str]]:
    """Anchor -> the keys of the table rows that follow it."""
    sections: dict[str, set[str]] = {}
    current = None
    for line in text.splitlines():
        anchor = re.match(r'<a id="([^"]+)"></a>', line)
        if anchor:
            current = sections.setdefault(anchor.group(1), set())
            continue
        row = re.match(r"\| `([^`]+)` \|", line)
        if row and current is not None:
            current.add(row.group(1))
    return sections


@pytest.mark.parametrize("model,prefix", [(AgentConfig, "agent"),
                                          (CollectorConfig, "collector")])
def test_every_key_appears_in_its_table(model, prefix):
    sections = _sections(REFERENCE.read_text())
    tables = list(_tables(model, f"{prefix}-top"))
    assert len(tables) > 5
    for anchor, table in tables:
        assert anchor in sections, f"no section {anchor!r} for {table.__name__}"
        missing = set(table.model_fields) - sections[anchor]
        assert not missing, f"{anchor}: keys {sorted(missing)} missing from CONFIG_REFERENCE.md"


def test_constraints_come_from_the_models():
    text = gen.render()
    # Field(ge=..., le=...), an AfterValidator's message with its module constant,
    # a Literal's choices and a field validator's messages.
    assert "| `keepalive` | integer | `30` | [5, 3600] |" in text
    assert "must be in [1e-05, 20]" in text
    assert "one of `split`, `sample`, `auto`" in text
    assert "must look like 30m, 12h, 1d or 1w" in text
    assert "'status' is reserved" in text


# -- the sample-file comment parser ------------------------------------------------------------

SAMPLE = """\
top = 1              # the top key
[table]
a = 1                # first line,
b = 2                # second half of a's sentence
c = "x # not a comment"  # c's comment
                         # continues here
# d = 4              # a commented-out example key
# [table.inner]      # the inner table
# e = 5

# prose that is not a key
[[items]]
kind = "one"         # the one variant
f = 1                # f of one
f = 2                # an alternative, ignored
"""


def test_sample_comments_are_attributed_to_their_keys():
    blocks = gen.parse_sample(SAMPLE)
    by_path = {}
    for block in blocks:
        by_path.setdefault(block.path, []).append(block)
    assert by_path[""][0].entries == {"top": "the top key"}
    table = by_path["table"][0]
    assert table.entries["a"] == "first line, second half of a's sentence"
    assert table.entries["b"] is None
    assert table.entries["c"] == "c's comment continues here"
    assert table.entries["d"] == "a commented-out example key"
    assert table.entries["inner"] == "the inner table"
    assert by_path["table.inner"][0].entries == {"e": None}
    items = by_path["items"][0]
    assert items.values["kind"] == '"one"'
    assert items.entries == {"kind": "the one variant", "f": "f of one"}


class _Toy(BaseModel):
    """A toy table."""

    # Above the field, in the model's source.
    from_source: int = 1
    from_field: Annotated[float, Field(gt=0, le=2, description="From Field(description).")] = 1.0
    from_sample: Literal["a", "b"] = "a"  # beside the field, overridden by the sample


def test_description_precedence(tmp_path):
    sample = tmp_path / "toy.toml"
    sample.write_text('from_field = 1.0   # ignored: Field(description) wins\n'
                      'from_sample = "b"  # from the sample file\n')
    program = gen.Program("Toy", "toy", "toy", _Toy, sample)
    renderer = gen.Renderer(program)
    text = renderer.render()
    assert "| `from_source` | integer | `1` |  | Above the field, in the model's source. |" in text
    assert ('| `from_field` | float | `1.0` | (0, 2] | From Field(description). |') in text
    assert '| `from_sample` | string | `"a"` | one of `a`, `b` | from the sample file |' in text
    assert renderer.missing == []
