"""codemode: a trio-native code-mode runtime for LLM agents.

The public API (DESIGN section 4) is re-exported here as it is built; the engine that runs the
JavaScript lives in the `codemode_host` package.
"""
