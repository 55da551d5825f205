"""Load generators and offline benchmarks behind ``infernetes bench``."""
