"""Measured device costs (prefill per uncached token, decode step by batch and context, memory
bandwidth) for capacity planning. Nothing here yet: it needs a GPU and comes in a later issue."""
