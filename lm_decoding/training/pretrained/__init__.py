"""Shipped pretrained sets: recipes, store, loading, member recipes."""
