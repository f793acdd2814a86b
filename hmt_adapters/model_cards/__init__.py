"""Model-card templates, shipped inside the package as `hmt_adapters.model_cards`."""
