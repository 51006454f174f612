"""What ships besides the API: the wheel, the examples, the benchmark command line."""
