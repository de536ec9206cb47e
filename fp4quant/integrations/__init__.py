"""Integrations of fp4quant's compressed tensor parallelism with other training frameworks."""
