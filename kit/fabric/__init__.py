"""``charllm-kit fabric``: a collective microbenchmark whose results are a bundle like any run."""
