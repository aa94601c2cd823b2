"""Which decoder layers an EAGLE-3 draft reads, and the two ways people number them.

"output of layer i" (SpecForge, TorchSpec, draft configs): id i is the output of 0-based decoder layer i,
that is `hidden_states[i + 1]` of a transformers forward with `output_hidden_states=True`.
"input to layer i" (SGLang internals, vLLM, EAGLE's own code): id i is the state entering layer i, that is
`hidden_states[i]`. `[1, N//2-1, N-4]` (output) and `[2, N//2, N-3]` (input) are the same physical layers.
Every output file records the ids in both conventions and the `hidden_states` indices they map to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.errors import InputError

CONVENTIONS = ("output", "input")


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """The EAGLE-3 default `[1, N//2-1, N-4]` in the "output of layer i" convention."""
    if num_layers < 5:
        raise InputError(
            f"the model has {num_layers} decoder layers, too few for the EAGLE-3 default [1, N//2-1, N-4]; "
            "pass the layers to capture with --aux-layers"
        )
    return (1, num_layers // 2 - 1, num_layers - 4)


@dataclass(frozen=True, slots=True)
class AuxLayers:
    """The captured layers: ids as given, their convention, and the model's decoder-layer count."""

    ids: tuple[int, ...]
    convention: str
    num_layers: int

    @property
    def hidden_state_indices(self) -> tuple[int, ...]:
        """Indices into transformers' `hidden_states` tuple (length N+1, index 0 = embeddings)."""
        shift = 1 if self.convention == "output" else 0
        return tuple(i + shift for i in self.ids)

    @property
    def output_ids(self) -> tuple[int, ...]:
        """The same layers in the "output of layer i" convention (index -1 means the embeddings)."""
        return tuple(h - 1 for h in self.hidden_state_indices)

    @property
    def input_ids(self) -> tuple[int, ...]:
        """The same layers in the "input to layer i" convention."""
        return self.hidden_state_indices

    def metadata(self) -> dict[str, object]:
        """What an output file records about the captured layers."""
        return {
            "aux_layers": list(self.ids),
            "layer_convention": self.convention,
            "aux_layers_output_convention": list(self.output_ids),
            "aux_layers_input_convention": list(self.input_ids),
            "hidden_state_indices": list(self.hidden_state_indices),
            "num_layers": self.num_layers,
        }


def parse_layer_list(text: str) -> tuple[int, ...]:
    """Parse "1,15,28" into (1, 15, 28); raise InputError naming the bad item."""
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise InputError(f"--aux-layers {text!r}: give comma-separated layer numbers, e.g. 1,15,28")
    out = []
    for item in items:
        try:
            out.append(int(item))
        except ValueError:
            raise InputError(f"--aux-layers {text!r}: {item!r} is not a layer number; give e.g. 1,15,28") from None
    return tuple(out)


def resolve_aux_layers(ids: Sequence[int] | str | None, convention: str, num_layers: int) -> AuxLayers:
    """Check layer ids against the model depth; None gives the default (then always "output" numbering
    translated into `convention`)."""
    if convention not in CONVENTIONS:
        raise InputError(f"layer convention {convention!r}: use 'output' or 'input'")
    if ids is None:
        out_ids = default_aux_layers(num_layers)
        chosen = out_ids if convention == "output" else tuple(i + 1 for i in out_ids)
    elif isinstance(ids, str):
        chosen = parse_layer_list(ids)
    else:
        chosen = tuple(int(i) for i in ids)
    if not chosen:
        raise InputError("no auxiliary layers given; pass e.g. --aux-layers 1,15,28")
    # output: 0..N-1 (the output of the last layer is the pre-norm residual stream);
    # input: 0..N (0 = embeddings, N = the output of the last layer before the final norm)
    top = num_layers - 1 if convention == "output" else num_layers
    bad = [i for i in chosen if not 0 <= i <= top]
    if bad:
        raise InputError(
            f"aux layers {list(chosen)} ({convention} convention): {bad} outside 0..{top} "
            f"for a model with {num_layers} decoder layers"
        )
    return AuxLayers(ids=chosen, convention=convention, num_layers=num_layers)
