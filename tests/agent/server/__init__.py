"""Tests of agent/server."""
