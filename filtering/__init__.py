"""Detectors, the sharded resumable scoring runner, selection and re-sharding."""
