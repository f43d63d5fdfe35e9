"""Tests of agent/client."""
