"""The symbolic layer: derive, prove and export Lipschitz bounds for attention."""
