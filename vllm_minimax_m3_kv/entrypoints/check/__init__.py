"""``vllm-minimax-m3-kv check``, split where it changes for different reasons.

- :mod:`.arguments`: the command line and exit codes (check's own flags;
  vLLM's serve parser with them, built only when needed).
- :mod:`.early`: everything answered before vLLM is imported.
- :mod:`.judge`: vLLM's own config validation, in process, with the
  plugin's hook judging for the target.
- :mod:`.plan`: the plan and its rows.
- :mod:`.pool`: the plan from the decision's facts and verdict;
  :mod:`.stock_vllm` (what stock vLLM 0.33 would build, to compare) and
  :mod:`.kv_bytes` (bytes per token of each cache) beside it.
- :mod:`.run`: :func:`run_check`, one command's result object, each fix
  applied to the command (``verdict_text.py``, shared with
  ``vllm serve``'s refusal).
- :mod:`.batch`: ``--commands FILE``, one row per command, via ``run_check``.
- :mod:`.main`: the command line that prints it all.

Nothing is imported here, so importing one part never imports the others.
"""
