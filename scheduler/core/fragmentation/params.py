"""Tuning constants of fragmentation-aware placement."""

# Jobs sampled (evenly over the queue and the running jobs) to estimate the mix.
MAX_SAMPLE = 256
# Shapes kept (the most frequent); the rest are dropped and weights renormalized.
MAX_SHAPES = 128
# Added to a whole-GPU placement's rise per GPU it leaves free on its node (percent of a
# GPU): fuller nodes first unless the rise says clearly otherwise, as best fit does; they
# drain back to whole nodes sooner as jobs end. 0 is plain FGD, which on the Philly replay
# (first 20,000 jobs, priority) raised avg JCT by 22 % against best fit; 30 matched it.
CONSOLIDATE = 30.0
# Weight of one whole GPU mixed into a mix read off the queue: a queue is a small sample,
# and whole-GPU requests always come back.
PRIOR = 0.1
# Distinct free-memory amounts compared per (kind, free compute) bucket of partly used GPUs.
MEMORY_SCAN = 2
# Free-compute buckets of partly used GPUs looked at per kind, tightest first.
BUCKET_SCAN = 3
# Partly used GPUs looked at per (kind, free compute) bucket.
ENTRY_SCAN = 8
# How steeply a kind that a shape depends on is kept for it as it runs short (1 would
# be FGD's own weighting; 3 held every shape placeable longest on bench_packing.py).
PRESSURE_EXPONENT = 3
# Share of the fleet's free capacity booked or freed after which the pressure is
# recomputed.
PRESSURE_STEP = 0.02
# Nodes compared per (kind, free count) bucket when host CPUs and memory count.
HOST_SCAN = 8
