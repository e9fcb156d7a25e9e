"""Rendering: the report document (`document`), a run's report (`run_report`), its plots
(`plots`) and runs side by side (`compare`)."""
