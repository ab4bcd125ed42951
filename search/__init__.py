"""rhino.search."""
