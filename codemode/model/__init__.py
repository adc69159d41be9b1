"""The model-facing layer: the exec and wait tools, their descriptions and their output."""
