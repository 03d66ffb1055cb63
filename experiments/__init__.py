"""The experiment layer beside the six stages: each method-run's record (ledger), the tables, summary and figure
built from records (compare, figure), the transfer curve over held-out harnesses (transfer_curve), and the
benchmarks and probes that back the README's figures (bench/). The stages never import it."""
