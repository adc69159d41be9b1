"""Typed signatures of Python tools: their argument type and their JSON Schemas.

A typed tool takes one JSON object from JavaScript (`tools.name({...})`) and returns a JSON
value. This module turns a function's signature into what `Toolbox` needs for that:

1. Every parameter is a named field of one `msgspec.Struct` built with `msgspec.defstruct`
   (unknown fields forbidden, defaults kept), so msgspec both validates the JavaScript
   arguments (`msgspec.convert`, strict) and writes the input schema (`msgspec.json.schema`).
2. Every parameter and the return value must be annotated; parameters are positional-or-keyword
   or keyword-only (a JSON object has no order, nothing to put in `*args` or `**kwargs`).
3. A schema's root is written out in place rather than as a `$ref` (models and the TypeScript
   renderer read the root); the definitions it refers to stay under `$defs`.

A signature that breaks a rule raises `TypeError` naming the tool and the parameter (or the
return value), when the tool is defined, never when a cell calls it. Where msgspec refuses a
signature as a whole (a default it will not hold, a type with no schema), the parameter it
stumbled on is found by trying each one alone, and named before msgspec's own text.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import msgspec

from ._api import JsonValue

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_KIND_TEXT = {
    inspect.Parameter.POSITIONAL_ONLY: "is positional-only",
    inspect.Parameter.VAR_POSITIONAL: "collects positional arguments (*args)",
    inspect.Parameter.VAR_KEYWORD: "collects keyword arguments (**kwargs)",
}

_Field = tuple[str, Any] | tuple[str, Any, Any]
"""A parameter as `msgspec.defstruct` takes it: name, type, and its default if it has one."""


class ToolSignature(msgspec.Struct, frozen=True, kw_only=True):
    """What a tool's signature gives: how to read its arguments and how to describe it.

    Parameters:
        arguments: the Struct type the JavaScript arguments are converted to; its fields are the
            function's parameters, in order.
        input_schema: JSON Schema of the arguments object.
        output_schema: JSON Schema of the return value.
    """

    arguments: type[msgspec.Struct]
    input_schema: dict[str, JsonValue]
    output_schema: dict[str, JsonValue]


def tool_signature(function: Callable[..., object], tool_name: str) -> ToolSignature:
    """Read the argument type and the schemas of `function`, a tool called `tool_name`.

    Args:
        function: a plain or `async` function with annotated parameters and return value.
        tool_name: the tool's name, for error messages.

    Returns:
        The tool's signature.

    Raises:
        TypeError: the signature breaks a rule of this module (see its docstring), or a type
            has no JSON Schema.
    """
    try:
        hints = typing.get_type_hints(function, include_extras=True)
    except Exception as error:  # NameError for an unresolved forward reference, mostly
        raise TypeError(
            f"tool {tool_name}: cannot resolve its annotations: {type(error).__name__}: {error}"
        ) from error
    fields: list[_Field] = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind not in _NAMED:
            raise TypeError(
                f"tool {tool_name}: parameter {parameter.name} {_KIND_TEXT[parameter.kind]}; "
                "a tool takes named arguments (one JSON object)"
            )
        if parameter.name not in hints:
            raise TypeError(f"tool {tool_name}: parameter {parameter.name} has no type annotation")
        annotation = hints[parameter.name]
        if parameter.default is inspect.Parameter.empty:
            fields.append((parameter.name, annotation))
        else:
            fields.append((parameter.name, annotation, parameter.default))
    if "return" not in hints:
        raise TypeError(f"tool {tool_name}: the return value has no type annotation")
    for field in fields:
        if len(field) == 3 and _is_filled_mutable(field[2]):
            raise TypeError(
                f"tool {tool_name}: parameter {field[0]} has a non-empty mutable default"
                f" ({field[2]!r}); default to None and build the value in the function"
            )
    arguments = _arguments_struct(tool_name, fields)
    try:
        input_schema = _schema(arguments, keep_title=False)
    except TypeError as error:
        raise TypeError(
            f"tool {tool_name}: {_culprit(fields)} has no JSON Schema: {error}"
        ) from error
    try:
        output_schema = _schema(hints["return"], keep_title=True)
    except TypeError as error:
        raise TypeError(
            f"tool {tool_name}: its return value has no JSON Schema: {error}"
        ) from error
    return ToolSignature(
        arguments=arguments, input_schema=input_schema, output_schema=output_schema
    )


def _is_filled_mutable(value: object) -> bool:
    return isinstance(value, list | dict | set | bytearray) and len(value) > 0


def _arguments_struct(tool_name: str, fields: list[_Field]) -> type[msgspec.Struct]:
    def build(name: str, chosen: list[_Field]) -> type[msgspec.Struct]:
        return msgspec.defstruct(name, chosen, kw_only=True, forbid_unknown_fields=True)

    try:
        return build(f"{tool_name}_arguments", fields)
    except (TypeError, ValueError, RuntimeError) as error:
        # RuntimeError too: `Failed to get offset for '__x'` for a name Python mangles.
        culprit = "one of its parameters"
        for field in fields:
            try:
                build("probe", [field])
            except (TypeError, ValueError, RuntimeError):
                culprit = f"parameter {field[0]}"
                break
        raise TypeError(
            f"tool {tool_name}: {culprit} cannot be a field of its arguments: {error}"
        ) from error


def _culprit(fields: list[_Field]) -> str:
    """The first parameter whose type has no JSON Schema on its own, else all of them."""
    for field in fields:
        try:
            msgspec.json.schema(field[1])
        except (TypeError, ValueError):
            return f"parameter {field[0]}"
    return "one of its parameters"


def _schema(annotation: object, *, keep_title: bool) -> dict[str, Any]:
    """The JSON Schema of `annotation`, its root inlined.

    Raises:
        TypeError: msgspec has no schema for it (its message).
    """
    try:
        schema: dict[str, Any] = msgspec.json.schema(annotation)
    except (TypeError, ValueError) as error:
        raise TypeError(str(error)) from error
    return _inline_root(schema, keep_title=keep_title)


def _inline_root(schema: dict[str, Any], *, keep_title: bool) -> dict[str, Any]:
    """`schema` with a root `$ref` replaced by the definition it names.

    The definition stays in `$defs` while anything else refers to it (a recursive Struct).
    """
    reference = schema.get("$ref")
    definitions: dict[str, Any] = dict(schema.get("$defs", {}))
    prefix = "#/$defs/"
    if not isinstance(reference, str) or not reference.startswith(prefix):
        return schema
    name = reference.removeprefix(prefix)
    root = dict(definitions[name])
    if not keep_title:
        root.pop("title", None)
    rest = {key: value for key, value in schema.items() if key not in {"$ref", "$defs"}}
    root.update(rest)
    if msgspec.json.encode(reference) not in msgspec.json.encode(
        [root, _without(definitions, name)]
    ):
        del definitions[name]
    if definitions:
        root["$defs"] = definitions
    return root


def _without(definitions: dict[str, Any], name: str) -> dict[str, Any]:
    return {key: value for key, value in definitions.items() if key != name}
