"""Shipped YAML recipes and detector specs."""
