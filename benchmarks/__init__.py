"""Speed and memory benchmarks: each a command (`python -m benchmarks.NAME`) over the library."""
