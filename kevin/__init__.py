"""The machinery under the stage scripts; a stage imports it, it never imports a stage.

- the evaluator's: static_rules (the reply's code block and the rules read from it), build_cache (compile
  children, the build child's job and the build cache), judge (the process that decides) and judge_checks (its
  pure checks), runner (the candidate's process), harness (what the judge and the runner both run: the task's
  start, the timer, the kernel log), tensor_exchange (the inputs and outputs between them), isolation and sandbox
  (children that can crash, hang or misbehave), eval_children (their settings and output), eval_records (the
  JSONL in and out);
- generation: backends (transformers, vLLM, OpenAI-compatible servers);
- training: training (the accelerator, the policy and its optimizer, an earlier run's output, GPU memory of an
  update), batching (packing samples, their log-probs), logprob_kernels (the chunked output layer),
  vllm_sync (vLLM engines beside the policy and the push of its weights), tiny_model (the built-in model);
- every stage's: config_flags (its flags from its config dataclass), rollout_config (the rollout settings
  generate.py and train.py share), startup (a quiet Ctrl-C while it loads) and dependencies (one-line errors
  for a missing package).
"""
