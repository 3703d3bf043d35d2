"""Tests of translate.data."""
