"""lipbound: Lipschitz bounds for attention, derived, proved, checked and exported."""
__version__ = "0.1.0"
