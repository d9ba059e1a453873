"""The reliability suite: no loss under concurrency, faults and bad input, with figures."""
