#!/usr/bin/env python3
"""Write docs/reference/CONFIG_REFERENCE.md from the configuration models, so it cannot drift.

Every table and key of ``AgentConfig`` (edge_agent/config/) and
``CollectorConfig`` (collector/config.py) is listed with its type, default
and allowed values, all read from the pydantic models: ``Field`` constraints
(ge/gt/le/lt, lengths, patterns), ``Literal`` choices, and the messages of
the validators (found in the validators' source, one call deep, with module
constants filled in).  Discriminated unions (sources by ``type``, channels by
``kind``) get one subsection per variant.

Each key's one-line description is, in this order:

1. ``Field(description=...)`` when the model has one;
2. the comment after the key in the sample file (configs/agent.toml,
   configs/collector.toml), commented-out example keys included: a comment
   continues on following comment-only lines that start in the same column,
   and a comment ending in "," or "..." (or one starting with "...")
   is one sentence with the next key's, which then gets no description of
   its own;
3. the comment beside the field in the model's source (on its line, or the
   comment lines just above it).

Run ``python scripts/gen_config_reference.py`` (``make docs``); ``--check``
exits 1 when the committed file differs.  Keys with no description are
listed on stderr.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import re
import sys
import textwrap
import tokenize
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from collector.config import CollectorConfig  # noqa: E402
from edge_agent.config import AgentConfig  # noqa: E402

OUTPUT = ROOT / "docs" / "reference" / "CONFIG_REFERENCE.md"


@dataclass(frozen=True)
class Program:
    title: str
    prefix: str  # anchor prefix
    command: str
    model: type[BaseModel]
    sample: Path


PROGRAMS = [
    Program("Agent", "agent", "edge-agent", AgentConfig, ROOT / "configs" / "agent.toml"),
    Program("Collector", "collector", "edge-collector", CollectorConfig,
            ROOT / "configs" / "collector.toml"),
]


# -- annotations ------------------------------------------------------------------------

@dataclass
class Shape:
    """What a field's annotation says, unwrapped."""

    kind: str  # "scalar", "table", "tables" (array of tables), "union-tables"
    type_text: str = ""
    allowed: list[str] = field(default_factory=list)
    optional: bool = False
    model: type[BaseModel] | None = None
    discriminator: str | None = None
    variants: list[type[BaseModel]] = field(default_factory=list)


def _is_model(tp) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _strip_annotated(tp) -> tuple[object, list]:
    """(the bare type, its constraints); a discriminator comes as ("discriminator", key)."""
    metadata = []
    while typing.get_origin(tp) is typing.Annotated:
        tp, *extra = typing.get_args(tp)
        for item in extra:
            if isinstance(item, FieldInfo):  # a nested Field(...)
                metadata.extend(item.metadata)
                if item.discriminator:
                    metadata.append(("discriminator", item.discriminator))
            else:
                metadata.append(item)
    return tp, metadata


def _is_union(tp) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def fmt_number(value) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:_}" if abs(value) >= 100_000 else str(value)
    return f"{value:g}"


def _constraints(metadata: list) -> list[str]:
    low = high = None
    out = []
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            low = f"[{fmt_number(item.ge)}"
        elif isinstance(item, annotated_types.Gt):
            low = f"({fmt_number(item.gt)}"
        elif isinstance(item, annotated_types.Le):
            high = f"{fmt_number(item.le)}]"
        elif isinstance(item, annotated_types.Lt):
            high = f"{fmt_number(item.lt)})"
    if low and high:
        out.append(f"{low}, {high}")
    elif low:
        out.append(("≥ " if low[0] == "[" else "> ") + low[1:])
    elif high:
        out.append(("≤ " if high[-1] == "]" else "< ") + high[:-1])
    lengths = {type(m).__name__: m for m in metadata
               if isinstance(m, (annotated_types.MinLen, annotated_types.MaxLen))}
    if lengths:
        lo = lengths.get("MinLen")
        hi = lengths.get("MaxLen")
        if lo and hi:
            out.append(f"{lo.min_length} to {hi.max_length} entries")
        elif lo:
            out.append(f"at least {lo.min_length} {'entry' if lo.min_length == 1 else 'entries'}")
        else:
            out.append(f"at most {hi.max_length} entries")
    for item in metadata:
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str):
            out.append(f"matches `{pattern}`")
        func = getattr(item, "func", None)
        if func is not None and type(item).__name__.endswith("Validator"):
            out.extend(validator_messages(func))
    return out


_SCALARS = {bool: "boolean", int: "integer", float: "float", str: "string",
            Path: "path (string)", SecretStr: "string (secret)"}


def _type_text(tp, metadata: list = ()) -> tuple[str, list[str]]:
    """(type, allowed values) of a non-model annotation."""
    tp, more = _strip_annotated(tp)
    allowed = _constraints(list(metadata) + more)
    if tp in _SCALARS:
        return _SCALARS[tp], allowed
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        kinds = {type(a) for a in args}
        name = "string" if kinds == {str} else " or ".join(_SCALARS.get(k, k.__name__)
                                                           for k in kinds)
        choices = ", ".join(f"`{a}`" for a in args)
        return name, [("one of " + choices) if len(args) > 1 else choices] + allowed
    if origin is tuple:
        inner = [_type_text(a)[0] for a in args]
        return f"array [{', '.join(inner)}]", allowed
    if origin is list:
        inner, inner_allowed = _type_text(args[0])
        return f"array of {inner}", allowed + [f"each: {a}" for a in inner_allowed]
    if origin is dict:
        key, _ = _type_text(args[0])
        value, _ = _type_text(args[1])
        return f"table of {value}s", allowed
    if _is_union(tp):
        members = [a for a in args if a is not type(None)]
        parts = [_type_text(a) for a in members]
        texts = [p[0] for p in parts]
        merged = list(allowed)
        for member, (text, extra) in zip(members, parts):
            literal = typing.get_origin(_strip_annotated(member)[0]) is typing.Literal
            if len(parts) > 1 and extra and not literal:
                merged.append(f"{text}: {'; '.join(extra)}")
            else:
                merged.extend(extra)
        return " or ".join(dict.fromkeys(texts)), merged
    return getattr(tp, "__name__", str(tp)), allowed


def shape_of(info) -> Shape:
    tp = info.annotation
    metadata = list(info.metadata)
    tp, more = _strip_annotated(tp)
    metadata += more
    optional = False
    if _is_union(tp) and type(None) in typing.get_args(tp):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = True
        tp = rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]
        tp, more = _strip_annotated(tp)
        metadata += more
    if _is_model(tp):
        return Shape("table", "table", optional=optional, model=tp)
    if typing.get_origin(tp) is list:
        item, item_meta = _strip_annotated(typing.get_args(tp)[0])
        counts = _constraints(metadata)
        if _is_model(item):
            return Shape("tables", "array of tables", counts, optional, model=item)
        discriminator = next((m[1] for m in item_meta
                              if isinstance(m, tuple) and m[0] == "discriminator"), None)
        if discriminator and _is_union(item):
            return Shape("union-tables", "array of tables", counts, optional,
                         discriminator=discriminator, variants=list(typing.get_args(item)))
    text, allowed = _type_text(tp, metadata)
    return Shape("scalar", text, allowed, optional)


# -- validators: their messages, from their source ----------------------------------------

_module_trees: dict[str, ast.Module] = {}


def _module_tree(module) -> ast.Module:
    name = module.__name__
    if name not in _module_trees:
        _module_trees[name] = ast.parse(inspect.getsource(module))
    return _module_trees[name]


def _function_nodes(func) -> list[ast.AST]:
    """The def (or lambda) nodes of ``func`` in its module's syntax tree."""
    code = getattr(func, "__code__", None)
    module = inspect.getmodule(func)
    if code is None or module is None:
        return []
    line = code.co_firstlineno
    nodes = []
    for node in ast.walk(_module_tree(module)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == func.__name__:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if first == line:
                nodes.append(node)
        elif isinstance(node, ast.Lambda) and func.__name__ == "<lambda>" and node.lineno == line:
            nodes.append(node)
    return nodes


def _render_message(node, namespace: dict, known: dict) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if not isinstance(node, ast.JoinedStr):
        return None
    text = ""
    for part in node.values:
        if isinstance(part, ast.Constant):
            text += str(part.value)
            continue
        value = _evaluate(part.value, namespace, known)
        if value is _UNKNOWN:
            text += "…"
            continue
        spec = "".join(str(v.value) for v in part.format_spec.values) if part.format_spec else ""
        if part.conversion == ord("r"):
            value = repr(value)
        text += format(value, spec)
    return text


_UNKNOWN = object()


def _evaluate(node, namespace: dict, known: dict):
    """Value of a constant, a module constant or a known argument; else _UNKNOWN."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in known:
            return known[node.id]
        value = namespace.get(node.id, _UNKNOWN)
        return value if isinstance(value, (int, float, str)) else _UNKNOWN
    return _UNKNOWN


def _clean(message: str) -> str:
    message = re.sub(r",? got …$", "", message)
    message = re.sub(r" \((?:[\w ]+: )?…\)", "", message)
    return message.strip()


def _guards(test, namespace: dict) -> dict:
    """Names an ``if`` test pins to a module constant: ``if value in RESERVED``."""
    if (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and len(test.ops) == 1 and isinstance(test.ops[0], ast.In)
            and isinstance(test.comparators[0], ast.Name)):
        values = namespace.get(test.comparators[0].id)
        if isinstance(values, (set, frozenset, tuple, list)) and values:
            return {test.left.id: _OneOf(sorted(values))}
    return {}


class _OneOf:
    def __init__(self, values):
        self.values = values

    def __format__(self, spec: str) -> str:
        return " or ".join(format(v, spec) for v in self.values)

    def __repr__(self) -> str:
        return " or ".join(repr(v) for v in self.values)


def validator_messages(func, known: dict | None = None, depth: int = 1) -> list[str]:
    """The messages of ``raise ...(message)`` in ``func`` and the module functions it calls."""
    func = inspect.unwrap(getattr(func, "__func__", func))
    namespace = getattr(func, "__globals__", {})
    messages: list[str] = []

    def visit(node, known: dict) -> None:
        if isinstance(node, ast.If):
            visit(node.test, known)
            inner = {**known, **_guards(node.test, namespace)}
            for child in node.body:
                visit(child, inner)
            for child in node.orelse:
                visit(child, known)
            return
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            text = _render_message(node.exc.args[0], namespace, known)
            if text:
                messages.append(_clean(text))
        elif depth > 0 and isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            callee = namespace.get(node.func.id)
            if isinstance(callee, types.FunctionType) and callee.__module__.split(".")[0] in (
                    "edge_agent", "collector"):
                names = list(inspect.signature(callee).parameters)
                bound = {name: arg.value for name, arg in zip(names, node.args)
                         if isinstance(arg, ast.Constant)}
                messages.extend(validator_messages(callee, bound, depth - 1))
        for child in ast.iter_child_nodes(node):
            visit(child, known)

    for root in _function_nodes(func):
        visit(root, dict(known or {}))
    return list(dict.fromkeys(messages))


def field_validator_messages(model: type[BaseModel], name: str) -> list[str]:
    out = []
    for decorator in model.__pydantic_decorators__.field_validators.values():
        if name in decorator.info.fields:
            out.extend(validator_messages(decorator.func))
    return out


def model_checks(model: type[BaseModel]) -> list[str]:
    out = []
    for decorator in model.__pydantic_decorators__.model_validators.values():
        out.extend(validator_messages(decorator.func))
    return list(dict.fromkeys(out))


# -- comments in the models' source ---------------------------------------------------------

_source_comments: dict[type, dict[str, str]] = {}


def _comments_of_class(cls: type) -> dict[str, str]:
    """Field name -> the comment on its line, or the comment lines just above it."""
    if cls in _source_comments:
        return _source_comments[cls]
    out: dict[str, str] = {}
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        _source_comments[cls] = out
        return out
    lines = source.splitlines()
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    trailing: dict[int, str] = {}
    for token in tokens:
        if token.type == tokenize.COMMENT:
            row, col = token.start
            if lines[row - 1][:col].strip():
                trailing[row] = token.string
    tree = ast.parse(source).body[0]
    own = cls.__dict__.get("__annotations__", {})
    for node in tree.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        if name not in own:
            continue
        comment = next((trailing[r] for r in range(node.lineno, node.end_lineno + 1)
                        if r in trailing), None)
        if comment is None:
            above = []
            row = node.lineno - 1
            while row >= 1 and lines[row - 1].strip().startswith("#"):
                above.insert(0, lines[row - 1].strip())
                row -= 1
            comment = " ".join(above) if above else None
        if comment:
            out[name] = _one_line(re.sub(r"(^|\s)#\s?", " ", comment))
    _source_comments[cls] = out
    return out


def defining_class(model: type[BaseModel], name: str) -> type:
    """The class whose body declares the field ``name`` (``model`` or a base)."""
    return next((cls for cls in model.__mro__
                 if name in cls.__dict__.get("__annotations__", {})), model)


def source_comment(model: type[BaseModel], name: str) -> str | None:
    return _comments_of_class(defining_class(model, name)).get(name)


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


# -- comments in the sample TOML files -----------------------------------------------------

_HEADER = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.-]+)\s*\]\]?")
_KEY = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*=\s*\S")
_CONTINUES = (",", "...", "…")


@dataclass
class Block:
    path: str  # dotted table path, array markers dropped
    array: bool
    parent: Block | None
    comment: str | None = None
    entries: dict[str, str | None] = field(default_factory=dict)  # key -> comment
    values: dict[str, str] = field(default_factory=dict)  # key -> value text


def _split_comment(text: str) -> tuple[str, int | None]:
    """(text before the comment, column of '#' outside strings or None)."""
    quote = None
    i = 0
    while i < len(text):
        char = text[i]
        if quote:
            if char == "\\" and quote == '"':
                i += 1
            elif char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char == "#":
            return text[:i], i
        i += 1
    return text, None


def parse_sample(text: str) -> list[Block]:
    """Blocks of a sample TOML file with each key's comment (see the module docstring)."""
    root = Block("", False, None)
    blocks = [root]
    latest: dict[str, Block] = {"": root}
    current = root
    # Whose comment the next aligned comment line or sentence fragment continues:
    # (block, key), key None for the block's own comment.
    owner: tuple[Block, str | None] | None = None
    owner_column: int | None = None

    def owner_text() -> str:
        block, key = owner
        return (block.comment if key is None else block.entries[key]) or ""

    def append(extra: str) -> None:
        block, key = owner
        joined = _one_line(f"{owner_text()} {extra}")
        if key is None:
            block.comment = joined
        else:
            block.entries[key] = joined

    for line in text.splitlines():
        stripped = line.lstrip()
        if not stripped:
            owner = owner_column = None
            continue
        body, offset = line, 0
        if stripped.startswith("#"):
            offset = len(line) - len(stripped) + 1
            body = line[offset:]
            if not (_HEADER.match(body) or _KEY.match(body)):
                # Prose: continues the owner's comment if its '#' is in the same column.
                if owner is not None and offset - 1 == owner_column:
                    append(stripped[1:])
                else:
                    owner = owner_column = None
                continue
        content, column = _split_comment(body)
        comment = _one_line(body[column + 1:]) if column is not None else None
        column = None if column is None else column + offset
        header = _HEADER.match(content)
        if header:
            path = header.group(2)
            parent_path, _, last = path.rpartition(".")
            parent = latest.get(parent_path, root)
            if comment and header.group(1) == "[" and not parent.entries.get(last):
                parent.entries[last] = comment  # [table.key]  # comment: describes key
            current = Block(path, header.group(1) == "[[", parent, comment=comment)
            blocks.append(current)
            latest[path] = current
            owner, owner_column = ((current, None), column) if comment else (None, None)
            continue
        match = _KEY.match(content)
        if match is None:  # inside a multi-line value
            owner = owner_column = None
            continue
        key = match.group(1)
        current.values.setdefault(key, content.split("=", 1)[1].strip())
        current.entries.setdefault(key, None)
        if not comment:
            owner = owner_column = None
        elif owner is not None and (owner_text().endswith(_CONTINUES)
                                    or comment.startswith(("...", "…"))):
            append(comment)  # one sentence over several keys: the first key's
            owner_column = column
        elif current.entries[key] is None:
            current.entries[key] = comment
            owner, owner_column = (current, key), column
        else:
            # The key again (an alternative value): keep the first comment; this one
            # and its continuations go nowhere.
            owner, owner_column = (Block("", False, None, entries={key: comment}), key), column
    return blocks


@dataclass
class SampleComments:
    """Comments of one sample file, looked up by table path, variant and key."""

    by_key: dict[tuple[str, str | None, str], str] = field(default_factory=dict)
    # The same field declaration (defining class, name) wherever it was commented:
    # a key of the channels' common base is described once for every kind.
    by_field: dict[tuple[type, str], str] = field(default_factory=dict)
    variants: dict[tuple[str, str], str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, model: type[BaseModel]) -> SampleComments:
        out = cls()
        for block in parse_sample(path.read_text()):
            for key, comment in block.entries.items():
                if not comment:
                    continue
                # Keys that are not fields of this table are tried on the enclosing one:
                # in a sample, a commented-out [table] does not end where TOML says it does.
                target = block
                while target is not None:
                    where = out._locate(model, target)
                    if where and key in where[2].model_fields:
                        path, variant, table = where
                        out.by_key.setdefault((path, variant, key), comment)
                        out.by_field.setdefault((defining_class(table, key), key), comment)
                        break
                    target = target.parent
            where = out._locate(model, block)
            if where and where[1] and block.comment:
                out.variants.setdefault((where[0], where[1]), block.comment)
        return out

    @staticmethod
    def _locate(model, block: Block):
        """(path, variant, model) of a block, or None if it is not a table of ``model``."""
        if not block.path:
            return "", None, model
        current, variant = model, None
        for part in block.path.split("."):
            info = current.model_fields.get(part)
            if info is None:
                return None
            shape = shape_of(info)
            if shape.kind in ("table", "tables"):
                current, variant = shape.model, None
            elif shape.kind == "union-tables":
                raw = block.values.get(shape.discriminator)
                try:
                    variant = tomllib.loads(f"v = {raw}")["v"] if raw else None
                except tomllib.TOMLDecodeError:
                    variant = None
                chosen = next((v for v in shape.variants
                               if variant in typing.get_args(
                                   v.model_fields[shape.discriminator].annotation)), None)
                if chosen is None:
                    return None
                current = chosen
            else:
                return None
        return block.path, variant, current


# -- rendering -------------------------------------------------------------------------------

def toml_literal(value) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return fmt_number(value) if isinstance(value, int) else repr(value)
    if isinstance(value, (str, Path)):
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_literal(v)}" for k, v in value.items()) + "}"
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _docstring(model: type) -> str:
    """First paragraph of the class's own docstring, one line."""
    doc = inspect.cleandoc(model.__dict__.get("__doc__") or "")
    return _one_line(doc.split("\n\n")[0]) if doc else ""


def _comments(program: Program) -> SampleComments:
    if program not in _loaded:
        _loaded[program] = SampleComments.load(program.sample, program.model)
    return _loaded[program]


_loaded: dict[Program, SampleComments] = {}


class Renderer:
    def __init__(self, program: Program):
        self.program = program
        self.comments = _comments(program)
        self.missing: list[str] = []
        self.lines: list[str] = []
        self.models: list[type[BaseModel]] = []

    def anchor(self, path: str, variant: str | None = None) -> str:
        parts = [self.program.prefix] + ([path.replace(".", "-")] if path else ["top"])
        return "-".join(parts + ([variant] if variant else []))

    def describe(self, model, path: str, variant: str | None, name: str, info,
                 shape: Shape) -> str:
        if info.description:
            return _one_line(info.description)
        text = self.comments.by_key.get((path, variant, name))
        if not text:
            declared = (defining_class(model, name), name)
            others = [_comments(p) for p in PROGRAMS if p is not self.program]
            text = next((c.by_field[declared] for c in [self.comments] + others
                         if declared in c.by_field), None)
        text = text or source_comment(model, name)
        if not text and shape.model is not None:
            text = _docstring(shape.model)
        if not text and shape.kind == "scalar":
            where = f"{path}.{name}" if path else name
            self.missing.append(f"{self.program.prefix}: {where}"
                                + (f" ({variant})" if variant else ""))
        return text or ""

    def _heading(self, anchor: str, level: int, heading: str) -> None:
        self.lines += [f'<a id="{anchor}"></a>', "", f"{'#' * level} {heading}", ""]

    def table(self, model, path: str, heading: str, level: int, *,
              variant: str | None = None, discriminator: str | None = None,
              intro: str | None = None, anchor: str | None = None) -> list:
        """One table's rows; returns its nested tables (path, shape) for the caller.
        ``anchor``: the table's own (a table nested in a variant: its variant's, then
        its key)."""
        out = self.lines
        self.models.append(model)
        here = anchor or self.anchor(path, variant)
        self._heading(here, level, heading)
        for text in (_docstring(model), intro):
            if text:
                out += [text, ""]
        out.append("| key | type | default | allowed | description |")
        out.append("|---|---|---|---|---|")
        nested = []
        for name, info in model.model_fields.items():
            shape = shape_of(info)
            child = f"{path}.{name}" if path else name
            if info.is_required():
                default = "**required**"
            elif isinstance(info.default, BaseModel):
                default = "see its table"
            else:
                value = info.get_default(call_default_factory=True)
                default = "unset" if value is None else f"`{toml_literal(value)}`"
            allowed = list(shape.allowed)
            if shape.kind == "scalar":
                allowed += field_validator_messages(model, name)
            else:
                label = f"[{child}]" if shape.kind == "table" else f"[[{child}]]"
                link = self.anchor(child) if here == self.anchor(path) else f"{here}-{name}"
                allowed.append(f"see [`{label}`](#{link})")
                nested.append((child, shape))
            description = self.describe(model, path, variant, name, info, shape)
            if name == discriminator and not description:
                description = self.comments.variants.get((path, variant), "")
                if description:
                    self.missing.remove(f"{self.program.prefix}: {path}.{name} ({variant})")
            out.append(f"| `{name}` | {_cell(shape.type_text)} | {_cell(default)} "
                       f"| {_cell('; '.join(allowed))} | {_cell(description)} |")
        checks = model_checks(model)
        if checks:
            out += ["", "Also checked: " + "; ".join(f"“{_cell(c)}”" for c in checks) + "."]
        out.append("")
        return nested

    def tables(self, model, path: str, heading: str, *, level: int = 3,
               anchor: str | None = None, note: str = "") -> None:
        """A table and, after it, every table nested in it (depth first); ``anchor``,
        ``note``: a table nested in a variant (its anchor, and the variant in headings)."""
        for child, shape in self.table(model, path, heading, level, anchor=anchor):
            below = f"{anchor}-{child.rpartition('.')[2]}" if anchor else None
            if shape.kind == "table":
                self.tables(shape.model, child, f"`[{child}]`{note}", level=level,
                            anchor=below, note=note)
            elif shape.kind == "tables":
                self.tables(shape.model, child, f"`[[{child}]]`{note}", level=level,
                            anchor=below, note=note)
            elif anchor is None:
                self.union(child, shape)
            else:
                raise NotImplementedError(f"a union of tables in {path}, inside a variant")

    def union(self, path: str, shape: Shape) -> None:
        key = shape.discriminator
        names = [typing.get_args(v.model_fields[key].annotation)[0] for v in shape.variants]
        self._heading(self.anchor(path), 3, f"`[[{path}]]`")
        links = ", ".join(f"[`{n}`](#{self.anchor(path, n)})" for n in names)
        self.lines += [f"An array of tables; each entry's `{key}` selects its keys: {links}.", ""]
        for variant, value in zip(shape.variants, names):
            nested = self.table(variant, path, f'`[[{path}]]` with `{key} = "{value}"`', 4,
                                variant=value, discriminator=key)
            for child, inner in nested:  # e.g. [[sources.devices]] of type = "ble"
                if inner.kind not in ("table", "tables"):
                    raise NotImplementedError(f"a union of tables in {path} variants")
                label = f"[{child}]" if inner.kind == "table" else f"[[{child}]]"
                note = f' (`{key} = "{value}"`)'
                self.tables(inner.model, child, f"`{label}`{note}", level=4,
                            anchor=f"{self.anchor(path, value)}-{child.rpartition('.')[2]}",
                            note=note)

    def render(self) -> str:
        program = self.program
        sample = (program.sample.relative_to(ROOT) if program.sample.is_relative_to(ROOT)
                  else program.sample)
        self.lines += [
            f"## {program.title} (`{program.command}`)", "",
            f"Model: `{program.model.__module__}.{program.model.__name__}`.  Annotated sample: "
            f"[`{sample}`](../../{sample}).  Check a file with "
            f"`{program.command} check-config FILE`.", ""]
        self.tables(program.model, "", "Top level")
        return "\n".join(self.lines)


HEADER = """\
# Configuration reference

<!-- Generated by scripts/gen_config_reference.py from the pydantic models; do not edit.
     Regenerate with `make docs`; tests/test_config_reference.py fails when it is stale. -->

Every key of the agent's and the collector's TOML configuration, generated
from the pydantic models (`edge_agent/config/`, `collector/config.py`), so
the types, defaults and allowed values are the ones the programs enforce.
{strict}Descriptions come from
`Field(description=...)`, else from the comment after the key in the sample
file, else from the comment beside the field in the model's source.

Notation: `[a, b]` includes both ends, `(a, b]` excludes a.  **required**
keys have no default; "unset" keys may be left out.  "Also checked" lists
the messages of the checks that involve several keys (… stands for a value
from the file).
"""


def _render() -> tuple[str, list[str]]:
    parts, missing, models = [], [], []
    for program in PROGRAMS:
        renderer = Renderer(program)
        parts.append(renderer.render())
        missing += renderer.missing
        models += renderer.models
    strict = all(m.model_config.get("extra") == "forbid" for m in models)
    parts.insert(0, HEADER.format(strict="Keys not listed here are rejected.  " if strict else ""))
    return "\n".join(parts).rstrip() + "\n", missing


def render() -> str:
    """The whole reference, as docs/reference/CONFIG_REFERENCE.md should hold it."""
    return _render()[0]


def undocumented() -> list[str]:
    """Keys that got no description from any source."""
    return _render()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the file differs from what would be written")
    args = parser.parse_args(argv)
    text, missing = _render()
    if missing:
        print(f"{len(missing)} keys have no description (add Field(description=...) or a "
              "comment in the sample file):\n  " + "\n  ".join(missing), file=sys.stderr)
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date: run `make docs`", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
