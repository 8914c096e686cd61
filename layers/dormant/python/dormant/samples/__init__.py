"""Runnable samples built on dormant."""
