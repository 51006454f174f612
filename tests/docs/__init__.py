"""The documentation: the README's and the pages' code runs as written, the reference pages
are complete, and the benchmark page matches the latest committed report."""
