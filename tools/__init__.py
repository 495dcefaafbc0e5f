"""Build tools: the scripts that write the files the package ships (``loadgen/shipped/``,
``loadgen/fetch_catalog.json``, ``predictor/data/``). Each runs from the repository root as
``python -m tools.<name>``; no product package imports them."""
