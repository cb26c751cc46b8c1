"""Packing policies: greedy best fit, an integer program, and order searches (genetic,
simulated annealing) decoded by the greedy placer. Imported lazily by the registry."""
