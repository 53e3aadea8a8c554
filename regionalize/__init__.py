"""regionalize: rewrite PyTorch models to compile their repeated blocks regionally."""

__version__ = "0.1.0"
