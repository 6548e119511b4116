"""The synthetic caption world: procedurally rendered scenes, simulated captioners and text-to-image generators."""
