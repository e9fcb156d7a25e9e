"""Experiments on a serving stack and their analysis: the run folder's records (`runfolder`),
running blocks and regimes (`run/`), analysing run folders (`analysis/`), rendering reports
(`report/`), injected faults (`faults/`)."""
