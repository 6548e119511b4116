"""Metrics (retrieval, detection, localization, filtering precision, I-HallA, VOPE, VIGIL) and report rendering."""
