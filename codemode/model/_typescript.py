"""TypeScript-style types rendered from JSON Schemas, for the tool declarations (reference 8.6).

Rules:
1. The first matching keyword decides: `$ref`, `const`, `enum`, `anyOf`/`oneOf` (a union),
   `allOf` (an intersection), `type` (one or a list), then the object keywords
   (`properties`, `additionalProperties`, `required`), then the array keywords (`items`,
   `prefixItems`); anything else is `unknown`.
2. Objects list their properties sorted by name, optional ones marked `?`, names that are not
   identifiers quoted as JSON strings. When a property has a description the object is written
   on several lines, each description line as a `//` comment above its property.
3. A local `$ref` (`#`, `#/$defs/...`, any JSON pointer into the same schema) is expanded in
   place. One pointer is expanded at most `MAX_REF_EXPANSIONS` times along one path, so a
   recursive schema shows its shape once inside itself and then `unknown`; remote refs are
   `unknown`. Keywords beside a `$ref` are intersected with it: `(A) & (B)`.
4. Arrays: `items` alone is `Array<T>`; `prefixItems` alone a tuple `[A, B]`; both a tuple with
   a rest element `[A, ...Array<T>]` (JSON Schema 2020-12: `items` is then the type of the
   elements after the prefix), or `[A]` when `items` is `false`. An `items` list (the tuple
   form of drafts before 2020-12) is read as `prefixItems`.
5. Any schema renders, never raises: a schema nested deeper than `MAX_DEPTH` levels (a
   `$ref`'s expansion counts as the levels of its target) renders `unknown` from there on,
   and so does a `const` or `enum` value with no JSON text or nested deeper than that; a
   2,000-deep schema (an MCP server's) would otherwise exhaust Python's recursion limit.

Pure functions, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

import msgspec

from .._identifiers import normalize_identifier

MAX_REF_EXPANSIONS = 2
"""How many times one `$ref` target may be open at once on the path being rendered."""

MAX_DEPTH = 32
"""How deep schemas (and `const`/`enum` values) nest before the rest renders as `unknown`
(rule 5). Each level takes a few Python frames here, so this stays far below the default
recursion limit of 1,000 wherever the caller stands; no tool's type is readable that deep."""

_RENDERABLE = (
    "const",
    "enum",
    "anyOf",
    "oneOf",
    "allOf",
    "type",
    "properties",
    "additionalProperties",
    "required",
    "items",
    "prefixItems",
)


def render_typescript(schema: Any) -> str:
    """The TypeScript type a JSON Schema describes, as the model reads it in tool declarations.

    Args:
        schema: a JSON Schema (a dict or a boolean); anything else renders as `unknown`.

    Returns:
        The type, on one line unless an object's properties carry descriptions.

    >>> render_typescript({"type": "object", "properties": {"city": {"type": "string"}},
    ...                    "required": ["city"], "additionalProperties": False})
    '{ city: string; }'
    """
    return _Renderer(schema).render(schema)


def _literal(value: Any) -> str:
    if _nests_deeper(value, MAX_DEPTH):
        return "unknown"
    try:
        return msgspec.json.encode(value).decode()
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        return "unknown"  # a value with no JSON text, in a schema built in Python


def _nests_deeper(value: Any, limit: int) -> bool:
    """Whether `value`'s lists and dicts nest deeper than `limit`, found without recursion."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            if depth >= limit:
                return True
            stack.extend((child, depth + 1) for child in item)
    return False


def _property_name(name: str) -> str:
    return name if normalize_identifier(name) == name else _literal(name)


def _resolve_pointer(root: Any, pointer: str) -> Any:
    """The value at a JSON pointer (already without its `#`), or None if there is none."""
    target = root
    for token in pointer.split("/")[1:] if pointer else []:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and token in target:
            target = target[token]
        elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
            target = target[int(token)]
        else:
            return None
    return target


class _Renderer:
    def __init__(self, root: Any) -> None:
        self._root = root
        self._open_refs: Counter[str] = Counter()
        self._depth = 0

    def render(self, schema: Any) -> str:
        if schema is True:
            return "unknown"
        if schema is False:
            return "never"
        if not isinstance(schema, dict) or self._depth >= MAX_DEPTH:
            return "unknown"
        self._depth += 1
        try:
            return self._render_map(schema)
        finally:
            self._depth -= 1

    def _render_map(self, schema: Mapping[str, Any]) -> str:
        if "$ref" in schema:
            return self._render_ref(schema)
        if "const" in schema:
            return _literal(schema["const"])
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return " | ".join(_literal(value) for value in enum)
        for keyword, joiner in (("anyOf", " | "), ("oneOf", " | "), ("allOf", " & ")):
            variants = schema.get(keyword)
            if isinstance(variants, list) and variants:
                return joiner.join(self.render(variant) for variant in variants)
        kind = schema.get("type")
        if isinstance(kind, list):
            names = [name for name in kind if isinstance(name, str)]
            if names:
                return " | ".join(self._render_type(schema, name) for name in names)
        elif isinstance(kind, str):
            return self._render_type(schema, kind)
        if any(key in schema for key in ("properties", "additionalProperties", "required")):
            return self._render_object(schema)
        if "items" in schema or "prefixItems" in schema:
            return self._render_array(schema)
        return "unknown"

    def _render_ref(self, schema: Mapping[str, Any]) -> str:
        referenced = self._expand(schema["$ref"])
        siblings = {key: value for key, value in schema.items() if key in _RENDERABLE}
        if not siblings:
            return referenced
        beside = self._render_map(siblings)
        if referenced == "unknown":
            return beside
        if beside == "unknown":
            return referenced
        return f"({referenced}) & ({beside})"

    def _expand(self, reference: Any) -> str:
        if not isinstance(reference, str) or not reference.startswith("#"):
            return "unknown"
        pointer = unquote(reference[1:])
        if pointer and not pointer.startswith("/"):
            return "unknown"
        if self._open_refs[pointer] >= MAX_REF_EXPANSIONS:
            return "unknown"
        target = _resolve_pointer(self._root, pointer)
        if target is None:
            return "unknown"
        self._open_refs[pointer] += 1
        try:
            return self.render(target)
        finally:
            self._open_refs[pointer] -= 1

    def _render_type(self, schema: Mapping[str, Any], name: str) -> str:
        if name in ("string", "boolean", "null"):
            return name
        if name in ("number", "integer"):
            return "number"
        if name == "array":
            return self._render_array(schema)
        if name == "object":
            return self._render_object(schema)
        return "unknown"

    def _render_array(self, schema: Mapping[str, Any]) -> str:
        items = schema.get("items")
        prefix = schema.get("prefixItems")
        if isinstance(items, list):
            prefix, items = items, schema.get("additionalItems")
        elif "items" not in schema:
            items = None
        if not (isinstance(prefix, list) and prefix):
            if items is None:
                return "unknown[]"
            return f"Array<{self.render(items)}>"
        elements = [self.render(item) for item in prefix]
        if items is not None and items is not False:
            elements.append(f"...Array<{self.render(items)}>")
        return "[" + ", ".join(elements) + "]"

    def _render_object(self, schema: Mapping[str, Any]) -> str:
        required_list = schema.get("required")
        required = set()
        if isinstance(required_list, list):
            required = {name for name in required_list if isinstance(name, str)}
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            properties = {}
        entries: list[tuple[list[str], str]] = []
        # Code point order, which is the byte order of the reference's UTF-8 strings.
        for name in sorted(properties):
            value = properties[name]
            optional = "" if name in required else "?"
            line = f"{_property_name(name)}{optional}: {self.render(value)};"
            entries.append((_description_lines(value), line))
        index = self._index_signature(schema, properties)
        if any(_has_description(properties[name]) for name in properties):
            lines = ["{"]
            for comments, line in entries:
                lines.extend(f"  // {comment}" for comment in comments)
                lines.append(f"  {line}")
            if index is not None:
                lines.append(f"  {index}")
            lines.append("}")
            return "\n".join(lines)
        parts = [line for _, line in entries]
        if index is not None:
            parts.append(index)
        return "{ " + " ".join(parts) + " }" if parts else "{}"

    def _index_signature(self, schema: Mapping[str, Any], properties: dict[str, Any]) -> str | None:
        if "additionalProperties" not in schema:
            return None if properties else "[key: string]: unknown;"
        extra = schema["additionalProperties"]
        if extra is False:
            return None
        value = "unknown" if extra is True else self.render(extra)
        return f"[key: string]: {value};"


def _has_description(schema: Any) -> bool:
    return (
        isinstance(schema, dict)
        and bool(schema.get("description"))
        and isinstance(schema["description"], str)
    )


def _description_lines(schema: Any) -> list[str]:
    if not _has_description(schema):
        return []
    lines = (line.strip() for line in schema["description"].split("\n"))
    return [line for line in lines if line]
