"""hetpatrol: node-level health patrol for mixed NVIDIA / Ascend accelerator nodes."""

__version__ = "0.1.0"
