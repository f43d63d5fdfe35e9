"""llm-d's time-slicing API (its orchestrator and snapshot agent, v1alpha1) over Baton's turns."""
