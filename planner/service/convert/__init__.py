"""Proto <-> domain conversion, with validation. The only place that knows both."""
