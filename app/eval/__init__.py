"""`eaglewatch eval`: a drafter measured like the data — the eval run kind beside generation.

- `acceptance`: the server's acceptance figures read from an answer as it gave them (vLLM's per-request
  `metrics.speculative_decoding`, SGLang's `meta_info.spec_*`); None when it gave none (never a zero);
- `figures`: the pure figures and guards over stored requests (acceptance lengths request- and token-weighted,
  per position, histogram, seeded bootstrap intervals, repetition loops, the `dead drafter` verdict, the gate);
- `run`: the eval engine — the run config's prompts driven at the endpoints' capacity through the generation
  engine's endpoints (clients, simulators, adaptive limits) and stored through the one writer (`RunStore`).
"""
