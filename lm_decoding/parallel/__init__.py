"""Meshes and logical-axis sharding."""
