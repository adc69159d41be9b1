"""codemode inside agent frameworks: each module gives one framework's agents the `exec` and
`wait` tools over a codemode session, with the agent's other tools callable from the cells.

- `codemode.integrations.pydantic_ai`: a pydantic-ai toolset (extra `codemode[pydantic-ai]`).
- `codemode.integrations.openai_agents`: OpenAI Agents SDK function tools (extra
  `codemode[openai-agents]`).

Each imports its framework when it is imported (`import codemode` never does); without the
extra, importing it raises `ImportError` naming the extra to install.
"""

from __future__ import annotations

import importlib

__all__: list[str] = []


def require(module: str, extra: str, distribution: str) -> None:
    """Import `module`, or raise `ImportError` with one line naming the extra that brings it."""
    try:
        importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"codemode.integrations.{extra.replace('-', '_')} needs {distribution}:"
            f" pip install 'codemode[{extra}]'"
        ) from error
