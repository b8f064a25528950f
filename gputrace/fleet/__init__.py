"""Fleet datasets: many traces exported as one partitioned Parquet dataset
(`gputrace export`) and the per-trace reports run over it on a distributed
engine (`gputrace fleet analyze`). See docs/fleet.md."""
