"""Operator entry points (the offline ``check`` preflight)."""
