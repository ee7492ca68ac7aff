"""Benchmarks and their helpers: synthetic records, full-size random releases, the GPU benchmark."""
