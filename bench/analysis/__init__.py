"""Analysis, a pure function of a run folder: its records (`runfolder`), paired statistics
(`stats`), block selection and comparisons (`paired`), per-request latency and cache figures
(`latency`), summary.json (`summary`) and the study's own records as a run (`study`)."""
