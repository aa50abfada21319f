SKIP_REASON = "vLLM is not installed here (run `make test-engines`, see docs/adapters.md)"
