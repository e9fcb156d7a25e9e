"""Capacity planning from measured runs (`make plan`): agents per GPU and GPUs needed per arm
from a load-response sweep, per-task GPU time, money and energy, and the study's break-even
uses of a compacted history. Reads a run folder, writes `plan.md`, `plan.json` (plan/SCHEMA.md)
and plots into it."""
