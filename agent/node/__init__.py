"""What the agent knows of its node: who calls (pods, local tenants) and its durable state."""
