"""Pure policies: plain data in, plan out; no clock, no I/O, no global state."""
