"""What travels between tenants and the agent: the handshake and the session's frames."""
