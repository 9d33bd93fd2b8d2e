"""What a request costs: a price table per model, in US dollars per million tokens.

``DEFAULT_PRICES`` ships list prices for the models of ``example-config.yaml``; the config's top-level
``prices`` (``GatewaySettings.prices``) overrides a model's entry or adds models. A ledger row is priced by
its upstream model id first, then by its public model name; a model with no price costs ``None`` (unknown,
never 0), and ``PriceTable.unpriced`` names the configured models the gateway cannot price (logged once each
at start).

Token counts as the gateway records them (``gateway.core.usage``): ``input_tokens`` is every input token,
cached ones included, for all three APIs (Anthropic reports cache reads and writes apart from
``input_tokens``; the gateway adds them in). So the cost of a request is

    (input - cached_input - cache_write) x input price
    + cached_input x cached input price + cache_write x cache write price + output x output price,

per million tokens. A model without a cached price bills cached tokens at its input price; one without a
cache write price bills cache writes at its input price.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gateway.config import ModelPrice

# Published list prices (OpenAI and Anthropic pricing pages, 2025), standard tier, prompts under 200k
# tokens. Prices change: a `prices:` entry in the config overrides any of these.
DEFAULT_PRICES: dict[str, ModelPrice] = {
    "gpt-5": ModelPrice(input_per_mtok=1.25, output_per_mtok=10.0, cached_input_per_mtok=0.125),
    "gpt-5-codex": ModelPrice(input_per_mtok=1.25, output_per_mtok=10.0, cached_input_per_mtok=0.125),
    "gpt-5-mini": ModelPrice(input_per_mtok=0.25, output_per_mtok=2.0, cached_input_per_mtok=0.025),
    "claude-sonnet-4-5": ModelPrice(
        input_per_mtok=3.0, output_per_mtok=15.0, cached_input_per_mtok=0.30, cache_write_per_mtok=3.75
    ),
    "claude-haiku-4-5": ModelPrice(
        input_per_mtok=1.0, output_per_mtok=5.0, cached_input_per_mtok=0.10, cache_write_per_mtok=1.25
    ),
}


class PriceTable:
    """The defaults overlaid with the config's ``prices``."""

    def __init__(self, overrides: Mapping[str, ModelPrice] | None = None) -> None:
        self.prices: dict[str, ModelPrice] = {**DEFAULT_PRICES, **(overrides or {})}

    def price(self, upstream_model: str | None, public_model: str | None) -> ModelPrice | None:
        """The price of the upstream model id, else of the public model name, else None."""
        for name in (upstream_model, public_model):
            if name is not None:
                p = self.prices.get(name)
                if p is not None:
                    return p
        return None

    def cost(
        self,
        upstream_model: str | None,
        public_model: str | None,
        input_tokens: int,
        output_tokens: int,
        cached_input: int = 0,
        cache_write: int = 0,
    ) -> float | None:
        """US dollars, or None when the model has no price."""
        p = self.price(upstream_model, public_model)
        if p is None:
            return None
        return p.cost(input_tokens, output_tokens, cached_input, cache_write)

    def unpriced(self, routes: Iterable[tuple[str, str | None]]) -> list[str]:
        """The public names of ``(public name, upstream id)`` routes that have no price."""
        return [public for public, upstream in routes if self.price(upstream, public) is None]
