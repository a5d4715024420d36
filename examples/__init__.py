"""Examples that ship with attnrepro (importable from the repository root: `examples.attention...`)."""
