"""Tests of baton/status."""
