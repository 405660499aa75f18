"""Reproduction of the paper's tables: benchmark data, evaluation metrics, the paper's numbers and the comparison.

* :mod:`~openrlhf_hacpo.reproduce.metrics`: mean@k, verl's bootstrap best@k and its closed form, unbiased pass@k,
  per-``data_source`` aggregation;
* :mod:`~openrlhf_hacpo.reproduce.benchmarks`: the training set and the seven benchmarks as settings (hub id,
  config, split, fields, label rule, expected rows);
* :mod:`~openrlhf_hacpo.reproduce.prepare`: rows from the hub or a local folder to prompt jsonl files and a manifest;
* :mod:`~openrlhf_hacpo.reproduce.paper_tables`: Tables 1, 2, 3 and 7 of the paper as data;
* :mod:`~openrlhf_hacpo.reproduce.generation`: the evaluation's backends, data-parallel vLLM engines or
  transformers generate;
* :mod:`~openrlhf_hacpo.reproduce.evaluate`: models or every agent of a run on benchmark files, greedy avg@1 and
  sampled best@k, written as results files and generations;
* :mod:`~openrlhf_hacpo.reproduce.results`: the per-benchmark results JSON that evaluation writes;
* :mod:`~openrlhf_hacpo.reproduce.table`: reproduced values next to the paper's, as markdown and a plot;
* :mod:`~openrlhf_hacpo.reproduce.run_state`: whether ``reproduce_table1.sh`` continues, restarts or starts a run;
* :mod:`~openrlhf_hacpo.reproduce.share`: one trained single-agent baseline filed under a second pair;

The small-scale mode's models and prompts (SmolLM2 + a zoo agent, CHAMP) live in
:mod:`openrlhf_hacpo.cli.reproduce_small`, since they join this package with the zoo.
"""
