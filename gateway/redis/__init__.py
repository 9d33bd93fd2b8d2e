"""Shared state for many gateway processes on Redis."""
