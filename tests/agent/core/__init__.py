"""Tests of agent/core."""
