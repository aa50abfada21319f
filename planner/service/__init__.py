"""The gRPC service: proto in, domain to the policies, plan back to proto."""
