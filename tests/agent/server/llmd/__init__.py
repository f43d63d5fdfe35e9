"""Tests of the llm-d time-slicing API, over its real port."""
