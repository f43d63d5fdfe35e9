"""Tests of commands/bench."""
