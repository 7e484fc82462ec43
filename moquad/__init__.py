"""moquad: self-supervised video representation learning with MoQuad."""

__version__ = "0.1.0"
