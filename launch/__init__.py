"""The halsift CLI, recipe runner and launchers."""
