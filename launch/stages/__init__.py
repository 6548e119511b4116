"""The recipe stages, one module each (``halsift run``: launch/recipe.py runs them in order)."""
