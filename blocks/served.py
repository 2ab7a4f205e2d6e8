"""Whether the provider serves a flow's base models: the capabilities document
(`GET /v1/training/capabilities`) lists them. Checked before a session opens, by the CLI
(exit 2) and by every flow run (a deployment's run from the UI form), so a name the provider
does not serve is refused with the list of those it does. No Prefect."""

from __future__ import annotations

from flows.core.config import ConfigError, FlowConfig
from whitney import wire
from whitney.tokenizers import HF_PREFIX


def check_served(config: FlowConfig, capabilities: wire.Capabilities) -> None:
    """ConfigError naming the field of a base model `config.provider` does not list. An
    `hf:` name passes: the embedded server serves those unlisted and answers them itself."""
    provider = capabilities.providers.get(config.provider)
    if provider is None:
        offered = ", ".join(sorted(capabilities.providers))
        raise ConfigError("provider", f"{config.provider} is not offered here (offered: {offered})")
    for field, base_model in config.served_models().items():
        if base_model.startswith(HF_PREFIX) or base_model in provider.base_models:
            continue
        raise ConfigError(
            field,
            f"{base_model!r} is not a base model of provider {config.provider} here; it "
            f"serves: {', '.join(provider.base_models)}",
        )
