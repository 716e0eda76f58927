"""The sections of benchmarks/torture.py, one module each; ``kit`` holds what they share."""
