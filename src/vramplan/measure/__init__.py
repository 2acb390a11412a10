"""Measure and diagnose real runs: one real step against the prediction, callbacks, OOM snapshots."""
