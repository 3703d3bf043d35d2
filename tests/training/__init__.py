"""Tests of translate.training."""
