"""mcpd: edge AI runtime daemon."""

__version__ = "0.1.0"
