"""sample_data/demo.toml is a valid run config whose files all exist in the repository."""

from __future__ import annotations

from app.config import load_config


def test_demo_config_loads_and_points_at_the_sample_files(sample_data_dir):
    config = load_config(sample_data_dir / "demo.toml")
    assert config.run.name == "demo"
    assert not config.run.database.is_relative_to(sample_data_dir)
    assert [d.path for d in config.data.datasets] == [
        sample_data_dir / "prompts.openai.jsonl",
        sample_data_dir / "conversations.openai.jsonl",
        sample_data_dir / "conversations.sharegpt.jsonl",
    ]
    assert [d.regenerate for d in config.data.datasets] == ["last", "all", "all"]
    assert config.data.reference == sample_data_dir / "reference.jsonl"
    assert (config.model.tokenizer / "tokenizer.json").exists()
    endpoint, quirky = config.endpoints
    assert endpoint.name == "simulator" and endpoint.simulator is not None
    assert endpoint.simulator.reference == sample_data_dir / "reference.jsonl"
    # both upstreams answer every turn of the whole conversations, each from its own reference line
    for ep in (endpoint, quirky):
        assert ep.simulator.extra_references == [sample_data_dir / "conversations.reference.jsonl"]
    # a small second upstream changes the text, so the first run shows real corruptions
    assert quirky.simulator is not None and quirky.simulator.quirks and quirky.weight < endpoint.weight
    assert config.model.name in config.pricing


def test_demo_simulator_options_are_accepted_by_the_simulator(sample_data_dir):
    from app.simulator.options import check_options

    config = load_config(sample_data_dir / "demo.toml")
    for endpoint in config.endpoints:
        check_options(endpoint.simulator)
    assert config.endpoints[0].simulator.faults  # the demo shows retries
