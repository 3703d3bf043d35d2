"""The tests, mirroring the package: tests/data/test_x.py is the module tests.data.test_x."""
