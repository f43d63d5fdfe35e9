"""Tests of commands/status."""
