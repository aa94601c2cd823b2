"""Pieces of bench/data_worth.py: what a mismatch in the training data costs an EAGLE-3 drafter, measured end to
end on the CPU (a tiny Qwen3 target on real vLLM, eaglewatch's regeneration, speculators' trainer, `eaglewatch
eval`)."""
