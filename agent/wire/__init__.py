"""What travels between tenants and the agent: the handshake line before a direct session."""
