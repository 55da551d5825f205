"""Benchmarks, run by ``python -m bench [name ...]`` (``make bench`` runs them all).

Each benchmark is a module ``bench/<name>.py`` with ``main(argv: list[str]) -> int``. It measures
its subject against a baseline in the same run and prints ratios; nothing here asserts timings.
"""
