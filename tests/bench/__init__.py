"""Tests of baton/bench."""
