"""Tests of translate.export."""
