"""Temporal contracts and configuration: pydantic models only, no I/O (imported by workflows)."""
