"""autoplan: an auto-parallel planner for large-model training.

Data flow: ``frontend.trace`` → ``ir.BlockGraph`` → (``topologies`` cluster)
→ ``search`` → ranked ``Plan``s with ``Estimate``s → ``explain`` / ``export`` / ``apply``.
"""
__version__ = "0.1.0"
