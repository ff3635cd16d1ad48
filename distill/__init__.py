"""Memory-aligned on-policy distillation (MemOPD) and memory-credit methods.

Filled in by the distillation issue; imports may only go down the layers: distill -> agents -> memenv -> tasks.
"""
