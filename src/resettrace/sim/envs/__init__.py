"""Batched env layer: step loop, reset_done and the domain-randomization manager."""
