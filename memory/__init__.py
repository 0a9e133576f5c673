"""The memory model of docs/ARCHITECTURE.md: pure functions, no I/O."""
