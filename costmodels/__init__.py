"""Prices: compute, collectives over a topology, memory, and the pipeline-schedule simulator. Never imports torch."""
