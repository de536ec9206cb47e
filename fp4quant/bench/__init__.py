"""Benchmarks: each writes its measurements, with provenance, to a CSV under data/."""
