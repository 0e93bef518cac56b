"""Helpers for end-to-end tests: running koordnode in front of the test bed, CRI requests."""
