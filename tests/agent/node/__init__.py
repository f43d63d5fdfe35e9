"""Tests of agent/node."""
