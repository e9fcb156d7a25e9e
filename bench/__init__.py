"""Experiments on a serving stack and their analysis: running blocks and regimes (`run/`),
analysing run folders (`analysis/`), rendering reports (`report/`)."""
