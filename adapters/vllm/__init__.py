"""The vLLM V1 adapter: a scheduler subclass that rotates requests per the
planner and a KV connector that swaps preempted requests' KV to CPU memory
instead of recomputing it. Importing this package needs no vLLM; its
scheduler, connector and plugin modules do."""
