"""Reliability: edge inputs, fuzzing, concurrency and fork, leaks, 64-bit indexing,
thread-count policy and configuration."""
