"""The MCP result types shared by the declarations of MCP-shaped tools (reference 8.5).

Rules:
1. An output schema is MCP-shaped when its `properties` hold `content` (an array of objects),
   `isError` (a boolean) and `_meta` (an object), each with exactly those `type`s.
2. Such a tool's result type is `CallToolResult<T>`, T rendered from its `structuredContent`
   schema (absent: the schema `true`, so plain `CallToolResult`).
3. The TypeScript below declares `CallToolResult` and the content blocks it refers to, after
   the MCP schema (draft revision); the exec description prints it once, before the tools.
"""

from __future__ import annotations

from typing import Any

MCP_TYPES = """\
type Role = "user" | "assistant";
type MetaObject = Record<string, unknown>;
type Annotations = {
  audience?: Role[];
  priority?: number;
  lastModified?: string;
};
type Icon = {
  src: string;
  mimeType?: string;
  sizes?: string[];
  theme?: "light" | "dark";
};
type TextResourceContents = {
  uri: string;
  mimeType?: string;
  _meta?: MetaObject;
  text: string;
};
type BlobResourceContents = {
  uri: string;
  mimeType?: string;
  _meta?: MetaObject;
  blob: string;
};
type TextContent = {
  type: "text";
  text: string;
  annotations?: Annotations;
  _meta?: MetaObject;
};
type ImageContent = {
  type: "image";
  data: string;
  mimeType: string;
  annotations?: Annotations;
  _meta?: MetaObject;
};
type AudioContent = {
  type: "audio";
  data: string;
  mimeType: string;
  annotations?: Annotations;
  _meta?: MetaObject;
};
type ResourceLink = {
  type: "resource_link";
  uri: string;
  name: string;
  title?: string;
  description?: string;
  mimeType?: string;
  size?: number;
  icons?: Icon[];
  annotations?: Annotations;
  _meta?: MetaObject;
};
type EmbeddedResource = {
  type: "resource";
  resource: TextResourceContents | BlobResourceContents;
  annotations?: Annotations;
  _meta?: MetaObject;
};
type ContentBlock =
  | TextContent
  | ImageContent
  | AudioContent
  | ResourceLink
  | EmbeddedResource;
type CallToolResult<TStructured = { [key: string]: unknown }> = {
  _meta?: MetaObject;
  content: ContentBlock[];
  isError?: boolean;
  structuredContent?: TStructured;
  [key: string]: unknown;
};"""
"""TypeScript declarations of an MCP `CallToolResult` and its content blocks."""


def _has_type(schema: Any, kind: str) -> bool:
    return isinstance(schema, dict) and schema.get("type") == kind


def is_mcp_result_schema(output_schema: Any) -> bool:
    """Whether an output schema describes an MCP `CallToolResult` (rule 1)."""
    if not isinstance(output_schema, dict):
        return False
    properties = output_schema.get("properties")
    if not isinstance(properties, dict):
        return False
    content = properties.get("content")
    return (
        isinstance(content, dict)
        and _has_type(content, "array")
        and _has_type(content.get("items"), "object")
        and _has_type(properties.get("isError"), "boolean")
        and _has_type(properties.get("_meta"), "object")
    )


def structured_content_schema(output_schema: dict[str, Any]) -> Any:
    """The `structuredContent` schema of an MCP-shaped output schema (`True` when absent)."""
    return output_schema["properties"].get("structuredContent", True)
