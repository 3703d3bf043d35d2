"""Tests of translate.formats: the targets of `translate export`."""
