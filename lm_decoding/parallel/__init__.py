"""Meshes, logical-axis sharding rules and multi-host start: the layer below decoding, training and evaluation (docs/layers.md)."""
