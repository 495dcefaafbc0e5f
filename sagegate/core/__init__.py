"""The ground floor: the words every other package shares, importing no other package of the project.

The request (:mod:`core.request`), its result record (:mod:`core.record`) and summary
(:mod:`core.summary`), the output-length distribution and the default prior (:mod:`core.distribution`),
the tokenizer (:mod:`core.tokens`) and the outcome, reason and prediction-path enums
(:mod:`core.outcomes`). See docs/architecture.md for who may import whom.
"""
