"""The services of one started gateway, handed down to the request path and the endpoints as one frozen
bundle: the layers below the app never import it (gateway.http.app builds this in ``Gateway.start``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.config import GatewaySettings
    from gateway.core.metrics import GatewayMetrics
    from gateway.core.pricing import PriceTable
    from gateway.limits.base import Limiters
    from gateway.redis.state import SharedState
    from gateway.store.keys import KeyStore
    from gateway.store.ledger import LedgerWriter
    from gateway.upstream.routing import Router


@dataclass(frozen=True, slots=True)
class Services:
    settings: GatewaySettings
    keys: KeyStore
    limits: Limiters  # in-process (gateway.limits.local) or, with redis_url, shared (gateway.limits.redis)
    router: Router
    metrics: GatewayMetrics
    ledger: LedgerWriter
    prices: PriceTable
    shared: SharedState | None  # with redis_url: the summaries cache and claims shared by every process
