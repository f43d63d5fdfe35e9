"""The agent's API surface: the lease service, sessions, gRPC and direct sessions, HTTP status."""
