"""Analyses, one module per analysis: pure functions over canonical polars frames."""
