"""The modules the six stages share: files and errors (plumbing), the harness and task schemas (schemas), the tasks'
tools and scoring (environment), loading and sampling a policy (generation), exact intervals and tests (intervals),
and the parts of a stage kept beside it: torchrun for 05 (distributed), truncated IS for 05 (off_policy), the
rollouts 06 scores (eval_rollouts). Nothing here imports a stage, a bridge or the experiment layer."""
