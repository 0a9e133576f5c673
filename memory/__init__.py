"""The memory model of SPEC section 3: pure functions, no I/O."""
