"""Frontend: trace a model into the IR (``autoplan.ir.BlockGraph``) on fake tensors.

``trace(model, seq=2048, batch=1, dtype="bf16")`` accepts a path to a
``model.py`` (``build_model()``, optional ``example_inputs(batch, seq)``), a
zoo name (``autoplan.zoo.names()``) or a family spec string such as
``llama:layers=32,hidden=4096,heads=32,kv_heads=8,ffn=14336,vocab=128256``.
"""
from autoplan.frontend.tracing import DTYPES, trace

__all__ = ["trace", "DTYPES"]
